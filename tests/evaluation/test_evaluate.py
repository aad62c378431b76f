"""The evaluation runner on a scripted generator whose responses, and so every metric, are known."""

from __future__ import annotations

import json

import pytest
import torch

from literl.evaluation.evaluate import evaluate, flat_metrics, results_table
from literl.rollout.engine import Generation, SamplingParams

PROBLEMS = [{"id": "a", "problem": "1+1", "answer": "2"}, {"id": "b", "problem": "2+3", "answer": "5"}]
# Per problem, the responses in sample order; "..." (no box) is reported as truncated.
SCRIPT = {"1+1": ["\\boxed{2}", "so \\boxed{2}", "\\boxed{3}", "..."],
          "2+3": ["\\boxed{4}", "\\boxed{6}", "\\boxed{4}", "\\boxed{7}"],
          "2+2": ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}"],
          "3+4": ["\\boxed{7}"] * 4,
          "1+4": ["\\boxed{4}", "\\boxed{6}", "\\boxed{5}", "\\boxed{4}"]}
OTHER = [{"id": "c", "problem": "2+2", "answer": "4"}, {"id": "d", "problem": "3+4", "answer": "7"},
         {"id": "e", "problem": "1+4", "answer": "5"}]


class ScriptedGenerator:
    """Answers each prompt with the next scripted response for its problem."""

    def __init__(self, tokenizer, logp_of=lambda text: 0.0):
        self.tokenizer = tokenizer
        self.logp_of = logp_of          # text → log μ of each of its tokens
        self.served = {problem: 0 for problem in SCRIPT}
        self.batch_sizes = []

    def generate(self, prompts, params, *, rng=None):
        texts = []
        for ids in prompts:
            problem = self.tokenizer.decode(ids)
            texts.append(SCRIPT[problem][self.served[problem]])
            self.served[problem] += 1
        self.batch_sizes.append(len(prompts))
        encoded = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        T = max(len(e) for e in encoded)
        ids_BT = torch.zeros(len(texts), T, dtype=torch.long)
        mask_BT = torch.zeros(len(texts), T, dtype=torch.bool)
        for b, e in enumerate(encoded):
            ids_BT[b, :len(e)] = torch.tensor(e)
            mask_BT[b, :len(e)] = True
        truncated_B = torch.tensor([t == "..." for t in texts])
        logp_BT = torch.tensor([[self.logp_of(t)] for t in texts]) * mask_BT
        return Generation(ids_BT, mask_BT, logp_BT, truncated_B)

    def sync_weights(self, policy):
        pass


def test_metrics_of_a_scripted_run(char_tokenizer, tmp_path):
    """K = 4. Problem a: c = 2, answers [2, 2, 3, none]; problem b: c = 0, answers [4, 6, 4, 7].

    avg@4  = (2/4 + 0)/2 = 0.25
    pass@2 = ((1 - C(2,2)/C(4,2)) + 0)/2 = (5/6)/2;  pass@4 = (1 + 0)/2 = 0.5;  pass@1 = avg@4
    maj@4  = a: "2" (2 votes) correct; b: "4" (2 votes) wrong → 0.5;  maj@1 = first answers 2 ✓, 4 ✗ → 0.5
    maj@2  = a: "2" ✓; b: tie 4 vs 6 → "4" (first) ✗ → 0.5
    tokens = (9 + 12 + 9 + 3 + 9 + 9 + 9 + 9) / 8 = 8.625;  truncated 1/8;  no box 1/8
    """
    generator = ScriptedGenerator(char_tokenizer)
    progress = []
    output = tmp_path / "out" / "eval.json"
    result = evaluate(generator, char_tokenizer, {"toy": PROBLEMS}, sampling=SamplingParams(max_new_tokens=16),
                      samples=4, template="raw", batch_size=3, progress=lambda *a: progress.append(a),
                      output_path=output, metadata={"model": "scripted"})
    bench = result["benchmarks"]["toy"]
    assert bench["metrics"] == pytest.approx({"avg@4": 0.25, "pass@1": 0.25, "pass@2": 5 / 12, "pass@4": 0.5,
                                              "maj@1": 0.5, "maj@2": 0.5, "maj@4": 0.5})
    assert bench["mean_response_tokens"] == pytest.approx(8.625)
    assert bench["truncation_rate"] == pytest.approx(1 / 8) and bench["no_answer_rate"] == pytest.approx(1 / 8)
    assert [p["num_correct"] for p in bench["problems"]] == [2, 0]
    assert bench["problems"][0]["extracted"] == ["2", "2", "3", None]
    assert generator.batch_sizes == [3, 3, 2]
    assert progress[0] == ("toy", 0, 8) and progress[-1] == ("toy", 8, 8)
    assert json.loads(output.read_text()) == result
    assert result["settings"]["template"] == "raw" and result["metadata"] == {"model": "scripted"}
    assert flat_metrics(result)["eval/toy/avg@4"] == 0.25
    assert results_table(result).row_count == 1


def test_sampled_nll_is_the_token_weighted_mean_negative_log_probability(char_tokenizer):
    """The engine reports log μ = −1 on every token of a response with a 7 in it and −0.5 elsewhere. Toy's 8
    responses have 9, 12, 9, 3 (problem a) and 9, 9, 9, 9 (b, the last "\\boxed{7}") tokens: 69 tokens, Σ −log μ =
    0.5 · 60 + 1 · 9 = 39, so sampled_nll = 39/69 — the per-token entropy's Monte-Carlo estimate, every token
    counted once (not a mean of per-response means, which would give (7 · 0.5 + 1)/8 = 0.5625)."""
    generator = ScriptedGenerator(char_tokenizer, logp_of=lambda text: -1.0 if "7" in text else -0.5)
    result = evaluate(generator, char_tokenizer, {"toy": PROBLEMS}, sampling=SamplingParams(max_new_tokens=16),
                      samples=4, template="raw", batch_size=3)
    bench = result["benchmarks"]["toy"]
    assert bench["sampled_nll"] == pytest.approx(39 / 69)
    assert bench["problems"][1]["response_nll"] == pytest.approx([4.5, 4.5, 4.5, 9.0])
    assert flat_metrics(result)["eval/toy/sampled_nll"] == pytest.approx(39 / 69)


def test_standard_errors_per_benchmark_and_the_mean_over_benchmarks(char_tokenizer, tmp_path):
    """Per-problem accuracies p_i = c_i / 4. toy: [2/4, 0] -> avg 0.25, SE = sqrt((0.25² + 0.25²) / (2·1)) = 0.25.
    other: [3/4, 4/4, 1/4] -> avg 2/3, deviations (1/12, 1/3, -5/12), Σ² = 42/144, SE = sqrt(42/144 / (3·2))
    = sqrt(7)/12. Mean over the two: (1/4 + 2/3)/2 = 11/24, SE = sqrt(1/16 + 7/144)/2 = sqrt(1/9)/2 = 1/6."""
    result = evaluate(ScriptedGenerator(char_tokenizer), char_tokenizer, {"toy": PROBLEMS, "other": OTHER},
                      sampling=SamplingParams(max_new_tokens=16), samples=4, template="raw", batch_size=4,
                      output_path=tmp_path / "eval.json")
    toy, other = result["benchmarks"]["toy"], result["benchmarks"]["other"]
    assert toy["standard_error"]["avg@4"] == pytest.approx(0.25)
    assert other["metrics"]["avg@4"] == pytest.approx(2 / 3)
    assert other["standard_error"]["avg@4"] == pytest.approx(7 ** 0.5 / 12)
    assert result["mean"]["benchmarks"] == ["toy", "other"]
    assert result["mean"]["avg@4"] == pytest.approx(11 / 24)
    assert result["mean"]["standard_error"]["avg@4"] == pytest.approx(1 / 6)
    assert "per-problem averages" in result["settings"]["standard_error"]
    assert json.loads((tmp_path / "eval.json").read_text())["mean"] == result["mean"]
    assert flat_metrics(result)["eval/other/avg@4_se"] == pytest.approx(7 ** 0.5 / 12)
    # the responses' part alone, problems fixed: toy p = [1/2, 0], Σ p (1 − p) / 3 = 1/12, sqrt(1/12) / 2 = 0.144338;
    # other p = [3/4, 1, 1/4], Σ p (1 − p) / 3 = (3/16 + 0 + 3/16) / 3 = 1/8, sqrt(1/8) / 3 = 0.117851
    assert toy["sampling_standard_error"]["avg@4"] == pytest.approx((1 / 12) ** 0.5 / 2)
    assert flat_metrics(result)["eval/other/avg@4_sampling_se"] == pytest.approx((1 / 8) ** 0.5 / 3)
    assert "problems held fixed" in result["settings"]["sampling_standard_error"]
    table = results_table(result)
    assert table.row_count == 3 and table.columns[2].header == "avg@4 ± SE"
    assert list(table.columns[2].cells) == ["25.0 ± 25.0", "66.7 ± 22.0", "45.8 ± 16.7"]


def test_a_single_problem_has_no_standard_error(char_tokenizer):
    result = evaluate(ScriptedGenerator(char_tokenizer), char_tokenizer, {"toy": PROBLEMS[:1]},
                      sampling=SamplingParams(max_new_tokens=16), samples=4, template="raw")
    assert result["benchmarks"]["toy"]["standard_error"]["avg@4"] is None and "mean" not in result
    assert list(results_table(result).columns[2].cells) == ["50.0"]


def test_evaluate_rejects_bad_settings(char_tokenizer):
    with pytest.raises(ValueError, match="samples and batch_size must be >= 1"):
        evaluate(ScriptedGenerator(char_tokenizer), char_tokenizer, {"toy": PROBLEMS}, sampling=SamplingParams(),
                 samples=0)
