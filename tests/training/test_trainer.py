"""End-to-end behaviour of the training loop on tiny models (seconds each)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from literl.config.load import load_config, preset_names
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics

TINY = ["model.profile=testbed", "trainer.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "eval.limit=4", "eval.samples=2", "eval.greedy=false", "trainer.progress=false", "data.size=64",
        "optim.lr=1e-3"]


def _overrides(model_dir, out, *extra):
    return [f"model.path={model_dir}", f"trainer.output_dir={out}", *TINY, *extra]


def _run(model_dir, out, *extra, preset="lite_ppo"):
    cfg = load_config(preset=preset, overrides=_overrides(model_dir, out, *extra))
    return train(cfg)


def _params(run_dir, sub="final"):
    files = sorted((run_dir / sub).glob("*.safetensors"))
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


TIMING = ("time/", "throughput/")


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def length_reward(response: str, example: dict) -> float:
    """A reward that varies within groups even for a random model, so every step does a real update."""
    return float(len(response) % 3 == 0)


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_trains_two_steps_with_finite_loss(tiny_qwen3_dir, tmp_path, preset, request):
    """A routing-replay preset trains a tiny mixture-of-experts model, every other one the tiny dense model."""
    model_dir = tiny_qwen3_dir
    if load_config(preset=preset).algorithm.routing_replay != "none":
        model_dir = request.getfixturevalue("tiny_moe_dir")
    cfg = load_config(preset=preset, overrides=_overrides(model_dir, tmp_path / preset))
    run_dir = train(cfg, reward_fns=[length_reward])
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["optim/skipped_step"] == 0.0
        assert r["loss/total"] is not None and math.isfinite(r["loss/total"])
        assert r["optim/grad_norm"] is not None and math.isfinite(r["optim/grad_norm"]) and r["optim/grad_norm"] > 0
    assert (run_dir / "final" / "config.json").exists() and (run_dir / "summary.json").exists()


def test_a_step_with_every_token_masked_leaves_the_weights_alone(tiny_qwen3_dir, tmp_path):
    """One new token per response, all truncated, under the overlong filter: zero gradient, and no AdamW step
    (its weight decay and momentum would still move the weights; algorithms.md §4.1)."""
    cfg = load_config(preset="lite_ppo", overrides=_overrides(
        tiny_qwen3_dir, tmp_path / "r", "trainer.steps=1", "rollout.max_new_tokens=1", "optim.weight_decay=0.1",
        "algorithm.loss_masks={overlong: {}}"))
    run_dir = train(cfg, reward_fns=[length_reward])
    (record,) = read_metrics(run_dir)
    assert record["loss_mask/kept_token_frac"] == 0.0 and record["truncation_rate"] == 1.0
    assert record["optim/skipped_step"] == 1.0 and record["optim/grad_norm"] == 0.0
    before = load_file(str(next((tiny_qwen3_dir).glob("*.safetensors"))))
    after = _params(run_dir)
    assert all(torch.equal(after[k], before[k]) for k in after)


def test_training_changes_the_parameters(tiny_qwen3_dir, tmp_path):
    """Rewards must vary for a non-zero update, so score responses by their length (a user reward fn)."""
    cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "r"))
    run_dir = train(cfg, reward_fns=[length_reward])
    before = load_file(str(next((tiny_qwen3_dir).glob("*.safetensors"))))
    after = _params(run_dir)
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed, "two RL steps with varying rewards must move the weights"


def test_four_steps_equal_two_steps_resumed_to_four(tiny_qwen3_dir, tmp_path):
    """Same metrics (timing aside) and bit-identical parameters."""
    extra = ["trainer.steps=4", "trainer.save_every=2"]
    reward = [length_reward]
    straight = train(load_config(preset="dapo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "a", *extra)),
                     reward_fns=reward)
    first = train(load_config(preset="dapo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b",
                                                                  "trainer.steps=2", "trainer.save_every=2")),
                  reward_fns=reward)
    resumed = train(load_config(preset="dapo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b", *extra,
                                                                    "trainer.resume=true")), reward_fns=reward)
    assert resumed == first
    assert _comparable(read_metrics(straight)) == _comparable(read_metrics(resumed))
    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_existing_run_dir_is_refused_without_resume(tiny_qwen3_dir, tmp_path):
    run_dir = _run(tiny_qwen3_dir, tmp_path / "r")
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="trainer.resume=true"):
        _run(tiny_qwen3_dir, tmp_path / "r")
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_bf16_rollout_makes_a_real_mismatch_and_minirl_runs_with_and_without_is(tiny_qwen3_dir, tmp_path):
    for label, is_on in (("with", "true"), ("without", "false")):
        run_dir = _run(tiny_qwen3_dir, tmp_path / label, "rollout.dtype=bfloat16",
                       f"algorithm.policy_loss.params.train_infer_is={is_on}", preset="minirl")
        records = read_metrics(run_dir)
        assert all(r["ti/kl_k3"] > 0 and r["ti/abs_logdiff_max"] > 1e-4 for r in records)
        assert all(math.isfinite(r["loss/total"]) for r in records)
        weight_max = [r["policy_loss/is_weight_max"] for r in records]
        if is_on == "true":
            assert any(abs(w - 1.0) > 1e-4 for w in weight_max), "π_old/μ_old must move the IS weight off 1"


def test_fp32_rollout_agrees_with_the_trainer(tiny_qwen3_dir, tmp_path):
    run_dir = _run(tiny_qwen3_dir, tmp_path / "r", "trainer.recompute_old_logp=always",
                   "algorithm.is_correction.name=token_tis")
    assert all(r["ti/abs_logdiff_max"] < 1e-4 for r in read_metrics(run_dir))


def test_recompute_old_logp_always_runs_the_pass_that_auto_reads_off_the_update(tiny_qwen3_dir, tmp_path):
    """lite_ppo takes one on-policy optimizer step per rollout batch with no IS correction: θ = θ_old in its only
    forward, so auto reads old_logp = sg(logp) off the update and times no old-log-prob pass; always runs the pass
    every step (a "time/old_logp" in each record). The pass computes the same log-probs the update's forward does,
    so both runs take the same steps: equal samples, losses within float rounding, weights within 1e-4."""
    runs = {}
    for mode in ("auto", "always"):
        cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / mode, "eval.every=0",
                                                                  "eval.before=false",
                                                                  f"trainer.recompute_old_logp={mode}"))
        runs[mode] = train(cfg, reward_fns=[length_reward])
    auto, always = (read_metrics(runs[k]) for k in ("auto", "always"))
    assert len(auto) == len(always) == 2
    assert not any("time/old_logp" in r for r in auto)
    assert all("time/old_logp" in r for r in always)
    for a, b in zip(auto, always):
        assert a["response_length/mean"] == b["response_length/mean"] and a["reward/mean"] == b["reward/mean"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=1e-4, abs=1e-6)
    a, b = _params(runs["auto"]), _params(runs["always"])
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


def test_hostile_responses_score_zero_and_training_continues(tiny_qwen3_dir, tmp_path, monkeypatch):
    """100 KB of digits, deep braces and a huge exponent as responses: scored 0, the step completes."""
    import literl.assembly.builder as components

    hostile = ["\\boxed{" + "9" * 100_000 + "}", "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
               "\\boxed{9^{9^{9^{9}}}}", "\\boxed{10^{10^{10}}}"]
    real_build = components.build_components

    def build_with_hostile_decoding(*args, **kwargs):
        parts = real_build(*args, **kwargs)
        counter = iter(range(10**9))
        parts.collector.decode = lambda ids: hostile[next(counter) % len(hostile)]
        return parts

    monkeypatch.setattr(components, "build_components", build_with_hostile_decoding)
    cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "r", "reward.timeout_s=2"))
    run_dir = train(cfg)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["accuracy"] == 0.0 and math.isfinite(r["loss/total"]) for r in records)
    assert all(r["time/reward"] < 30 for r in records)


def test_run_directory_holds_config_metrics_samples_and_eval(tiny_qwen3_dir, tmp_path):
    run_dir = _run(tiny_qwen3_dir, tmp_path / "r")
    assert (run_dir / "config.yaml").exists()
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and {"problem", "response", "reward", "correct"} <= set(samples[0])
    evals = read_metrics(run_dir, "eval.jsonl")
    assert [e["tag"] for e in evals] == ["before", "after"]
    assert 0.0 <= evals[-1]["testbed/accuracy"] <= 1.0
    # eval.samples=2 on 4 problems: the response-sampling SE the arena weighs Δ final against, at most
    # sqrt(4 · 0.25 / (2 − 1)) / 4 = 0.25 (every problem at p = 1/2)
    assert 0.0 <= evals[-1]["testbed/accuracy_sampling_se"] <= 0.25
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run_dir / "final")
    AutoTokenizer.from_pretrained(run_dir / "final")


def _eval_tags(run_dir):
    import json as _json

    return [(r["step"], r["tag"]) for r in map(_json.loads, (run_dir / "eval.jsonl").read_text().splitlines())]


def test_resuming_redoes_evaluations_without_duplicating_their_records(tiny_qwen3_dir, tmp_path):
    """A finished run resumed as it is, then extended; then a run that never reached a checkpoint."""
    import shutil

    extra = ["trainer.steps=2", "eval.every=0"]
    run_dir = _run(tiny_qwen3_dir, tmp_path / "r", *extra)
    assert _eval_tags(run_dir) == [(0, "before"), (2, "after")]
    _run(tiny_qwen3_dir, tmp_path / "r", *extra, "trainer.resume=true")
    assert _eval_tags(run_dir) == [(0, "before"), (2, "after")]
    _run(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=3", "eval.every=0", "trainer.resume=true")
    assert _eval_tags(run_dir) == [(0, "before"), (2, "step_2"), (3, "after")]

    for name in ("checkpoints", "final"):       # as if killed before its first checkpoint
        shutil.rmtree(run_dir / name)
    (run_dir / "summary.json").unlink()
    _run(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=1", "eval.every=0", "trainer.resume=true")
    assert _eval_tags(run_dir) == [(0, "before"), (1, "after")]
    assert [r["step"] for r in read_metrics(run_dir)] == [1]


def test_the_last_checkpoint_is_not_written_twice(tiny_qwen3_dir, tmp_path, monkeypatch):
    """save_every divides steps: the loop's checkpoint of the last step is the final one (rewriting it would
    move the only complete copy aside while the new one is written)."""
    from literl.training import trainer as trainer_module

    saved = []
    original = trainer_module.save_checkpoint
    monkeypatch.setattr(trainer_module, "save_checkpoint",
                        lambda run_dir, step, **kw: saved.append(step) or original(run_dir, step, **kw))
    run_dir = _run(tiny_qwen3_dir, tmp_path / "r", "trainer.save_every=1", "trainer.keep_checkpoints=1",
                   "eval.every=0")
    assert saved == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000002"]
    saved.clear()
    _run(tiny_qwen3_dir, tmp_path / "r", "trainer.save_every=1", "eval.every=0", "trainer.resume=true")
    assert saved == []                  # resumed at its end: the loaded checkpoint is the current state


def test_a_second_epoch_trains_off_policy_against_the_old_log_probs(tiny_qwen3_dir, tmp_path):
    """trainer.minibatches=1, trainer.epochs=2: each rollout batch gives two optimizer steps. The first is on-policy
    (θ = θ_old: PPO-KL 0 up to rounding); the second runs after an optimizer step, so its ratio π_θ/π_old moves —
    which needs the old-log-prob pass (without it old_logp would be sg(logp) and the ratio 1 in every epoch). The
    learning-rate schedule counts both: a linear decay over 2 rollout batches × 2 steps multiplies lr by 1, 3/4,
    1/2, 1/4, and each rollout batch logs the mean of its two steps' (7/8, then 3/8; 3/4 and 0 if it counted one)."""
    cfg = load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "r", "trainer.epochs=2",
                                                          "eval.every=0", "eval.before=false", "optim.schedule=linear"))
    run = train(cfg, reward_fns=[length_reward])
    records = read_metrics(run)
    assert len(records) == 2
    for r in records:
        assert abs(r["st/ppo_kl_mb0"]) < 1e-6
        assert abs(r["st/ppo_kl_mb1"]) > 1e-6
        assert "st/ppo_kl_mb2" not in r
    assert [r["optim/lr"] for r in records] == pytest.approx([1e-3 * 7 / 8, 1e-3 * 3 / 8])


@pytest.mark.parametrize("minibatches", [1, 2])
def test_replaying_the_rollouts_forward_trains_like_computing_it(tiny_qwen3_dir, tmp_path, monkeypatch, minibatches):
    """By default each on-policy update replays the rollout's forward (literl/model/record.py); with
    trainer.replay_max_gib=0 it computes it. Same samples, losses, gradient norms and weights, within float
    rounding; with two mini-batches the old-log-prob pass and the first mini-batch (before any optimizer step)
    replay, the second computes."""
    from literl.model.policy import PolicyForward

    sources = []                # per forward of rows carrying a record: whether it replayed
    original = PolicyForward.replays

    def replays(self, record):
        replayed = original(self, record)
        if record is not None:
            sources.append(replayed)
        return replayed

    monkeypatch.setattr(PolicyForward, "replays", replays)
    runs = {}
    for label, extra in (("replayed", []), ("computed", ["trainer.replay_max_gib=0"])):
        sources.clear()
        # The record is CPU machinery (capabilities.RECORD_REPLAY_DEVICES): on a CUDA machine too, test it there.
        cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / label, "eval.every=0",
                                                                  "eval.before=false", "trainer.device=cpu",
                                                                  f"trainer.minibatches={minibatches}", *extra))
        runs[label] = train(cfg, reward_fns=[length_reward])
        if label == "replayed":      # per step: [old-log-prob pass,] first mini-batch, later mini-batches
            per_step = [True, True, *[False] * (minibatches - 1)] if minibatches > 1 else [True]
            assert sources == per_step * 2
        else:                        # no record was kept
            assert sources == []
    replayed, computed = (read_metrics(runs[k]) for k in ("replayed", "computed"))
    for a, b in zip(replayed, computed):
        assert a["response_length/mean"] == b["response_length/mean"] and a["reward/mean"] == b["reward/mean"]
        for key in ("loss/total", "optim/grad_norm", "entropy/mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert all(r["optim/grad_norm"] > 0 for r in replayed)
    a, b = _params(runs["replayed"]), _params(runs["computed"])
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


def test_eval_policy_trainer_samples_the_trainers_weights_where_the_engine_rounds_its_own(tiny_qwen3_dir, tmp_path):
    """rollout.dtype=int4: the rollout engine holds a 4-bit copy. eval.policy=engine (the default) evaluates with
    that engine; eval.policy=trainer with literl's engine over the policy module itself, built once."""
    from literl.assembly.builder import build_components

    for policy, expect_trainer in (("engine", False), ("trainer", True)):
        cfg = load_config(preset="minirl", overrides=_overrides(tiny_qwen3_dir, tmp_path / policy, "rollout.dtype=int4",
                                                                f"eval.policy={policy}"))
        parts = build_components(cfg, reward_fns=[length_reward])
        try:
            assert parts.engine.model is not parts.learner.policy()
            engine = parts.eval_engine()
            if expect_trainer:
                assert engine.model is parts.learner.policy() and engine.weights is None
                assert parts.eval_engine() is engine
            else:
                assert engine is parts.engine
        finally:
            parts.release()


def test_eval_policy_trainer_gives_the_engines_numbers_when_the_engine_is_the_policy(tiny_qwen3_dir, tmp_path):
    """rollout.dtype=float32: the rollout engine samples from the policy module itself, so both settings evaluate
    the same weights with the same seeds: identical held-out results at every evaluation."""
    runs = {policy: _run(tiny_qwen3_dir, tmp_path / policy, "eval.every=1", f"eval.policy={policy}")
            for policy in ("engine", "trainer")}
    evals = {policy: [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
             for policy, run_dir in runs.items()}
    assert len(evals["engine"]) == 3            # before, step 1, step 2
    assert _comparable(evals["engine"]) == _comparable(evals["trainer"])


def test_eval_policy_rejects_an_unknown_value():
    from literl.config.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.policy"):
        load_config(overrides=["eval.policy=vllm"])
