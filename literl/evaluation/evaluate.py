"""Evaluate a policy on benchmarks: sample K responses per problem and report avg@K, pass@k and maj@k.

A library function with no command-line assumptions: `literl eval` calls it, and so does the trainer
for periodic evaluation. Generation goes through the same `Engine` the trainer samples with, and
correctness through the same reward (`math_accuracy` by default), so there is no second code path.

Per benchmark (problems i = 1..N, K samples each, c_i correct):
    avg@K  = (1/N) Σ_i c_i / K                                  the headline ("sampled accuracy")
    pass@k = (1/N) Σ_i pass_at_k(K, c_i, k)                     k = 1, 2, 4, ... ≤ K, and K
    maj@k  = (1/N) Σ_i maj_at_k(answers_i, correct_i, k)        same k
    mean_response_tokens, truncation_rate (responses stopped by max_new_tokens), no_answer_rate
    sampled_nll    = Σ −log μ(y_t) / Σ tokens over every sampled response token, μ the distribution sampled from
                     (temperature, top-p and top-k applied): nats per token, whose expectation is the token-weighted
                     mean entropy of that distribution — the policy's entropy, measured on fixed problems (with
                     greedy decoding it is the argmax tokens' NLL, not an entropy)
plus one record per problem. pass@1 equals avg@K (the unbiased estimator with k = 1).

Standard errors (`standard_error`, per benchmark): of avg@K, the standard error of the mean of the per-problem
averages p_i = c_i / K, sqrt(Σ_i (p_i − avg@K)² / (N (N − 1))), which covers the sampling of problems and of
responses (problems are clusters). `sampling_standard_error`: the responses' part alone, the problems fixed,
sqrt(Σ_i p_i (1 − p_i) / (K − 1)) / N — the noise that separates two policies scored on the same problems even
when they are equal (the arena compares its runs against it, docs/arena.md "Evaluation noise"). `mean` (with more
than one benchmark): the unweighted mean of avg@K over the benchmarks, as papers report their average, with SE
sqrt(Σ_b SE_b²) / B. `metrics.SE_METHOD` and `metrics.SAMPLING_SE_METHOD` state them.
"""

from __future__ import annotations

import time
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from literl.data.files import write_json_atomic
from literl.data.prompts import render_prompt, resolve_template
from literl.evaluation.sample_metrics import (SAMPLING_SE_METHOD, SE_METHOD, avg_at_k, k_values, maj_at_k,
                                      mean_with_standard_error, pass_at_k, sampling_standard_error,
                                      standard_error_of_mean)
from literl.rewards.math_answer import extract_final_answer, math_accuracy
from literl.rollout.engine import Engine, SamplingParams

ProgressCallback = Callable[[str, int, int], None]     # (benchmark, sequences done, sequences total)


def evaluate(generator: Engine, tokenizer: Any, benchmarks: Mapping[str, Sequence[dict]], *,
             sampling: SamplingParams, samples: int = 1, template: str = "auto", batch_size: int = 64,
             seed: int = 0, score_fn: Callable[[str, dict], float] = math_accuracy,
             progress: ProgressCallback | None = None, show_progress: bool = False,
             keep_responses: bool = False, output_path: str | Path | None = None,
             metadata: Mapping[str, Any] | None = None, device: str | torch.device | None = None,
             prompt_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate on each benchmark (name → problem records with "id", "problem", "answer").

    Sampling is reproducible: benchmark `name` uses a generator seeded with seed + crc32(name), so its
    numbers do not depend on which other benchmarks run. `device` is where that generator lives (the
    engine's device; inferred from `generator.model` when not given). The result is a JSON-ready dict,
    also written atomically to `output_path` when given. `prompt_options` (system_prompt, instruction,
    chat_template_kwargs) go to `render_prompt`.
    """
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1 (got samples={samples}, batch_size={batch_size})")
    resolved_template = resolve_template(template, tokenizer)
    device = torch.device(device) if device is not None else _engine_device(generator)
    started = time.monotonic()
    results: dict[str, Any] = {}
    with _progress_reporter(progress, show_progress) as report:
        for name, problems in benchmarks.items():
            rng = torch.Generator(device=device).manual_seed(seed + zlib.crc32(name.encode()))
            results[name] = _evaluate_benchmark(
                generator, tokenizer, list(problems), sampling=sampling, samples=samples,
                template=resolved_template, batch_size=batch_size, rng=rng, score_fn=score_fn,
                keep_responses=keep_responses, prompt_options=dict(prompt_options or {}), report=lambda done, total, name=name: report(name, done, total))
            skipped = getattr(problems, "skipped_ids", None)
            if skipped:
                results[name]["skipped_ids"] = list(skipped)
    result = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {"samples": samples, "template": resolved_template, "seed": seed, "batch_size": batch_size,
                     "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                     "max_new_tokens": sampling.max_new_tokens, "greedy": sampling.greedy},
        "metadata": dict(metadata or {}),
        "seconds": round(time.monotonic() - started, 2),
        "benchmarks": results,
    }
    if len(results) > 1 and all(bench["num_problems"] for bench in results.values()):
        key = f"avg@{samples}"
        mean, error = mean_with_standard_error([b["metrics"][key] for b in results.values()],
                                               [b["standard_error"][key] for b in results.values()])
        result["mean"] = {"benchmarks": list(results), key: mean, "standard_error": {key: error}}
    result["settings"]["standard_error"] = SE_METHOD
    result["settings"]["sampling_standard_error"] = SAMPLING_SE_METHOD
    if output_path is not None:
        write_json_atomic(output_path, result)
    return result


def _evaluate_benchmark(generator, tokenizer, problems: list[dict], *, sampling, samples, template, batch_size,
                        rng, score_fn, keep_responses, report, prompt_options) -> dict[str, Any]:
    prompts = [render_prompt(p["problem"], tokenizer, template, **prompt_options) for p in problems]
    jobs = [(i, j) for i in range(len(problems)) for j in range(samples)]   # a problem's samples side by side
    outcome: dict[tuple[int, int], tuple[str, int, bool, float]] = {}
    report(0, len(jobs))
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start:start + batch_size]
        generation = generator.generate([prompts[i] for i, _ in batch], sampling, rng=rng)
        lengths = generation.mask_BT.sum(-1).tolist()
        nll = (-generation.rollout_logp_BT.float() * generation.mask_BT).sum(-1).tolist()
        for row, job in enumerate(batch):
            ids = generation.response_ids_BT[row][generation.mask_BT[row]].tolist()
            text = tokenizer.decode(ids, skip_special_tokens=True)
            outcome[job] = (text, int(lengths[row]), bool(generation.truncated_B[row]), float(nll[row]))
        report(min(start + batch_size, len(jobs)), len(jobs))
    records = [_problem_record(problem, [outcome[(i, j)] for j in range(samples)], score_fn, keep_responses)
               for i, problem in enumerate(problems)]
    return _summarise(records, samples)


def _problem_record(problem: dict, responses: list[tuple[str, int, bool, float]], score_fn, keep_responses) -> dict:
    correct = [score_fn(text, problem) >= 0.5 for text, _, _, _ in responses]
    record = {
        "id": problem.get("id"),
        "answer": problem.get("answer"),
        "num_correct": sum(correct),
        "correct": correct,
        "extracted": [extract_final_answer(text) for text, _, _, _ in responses],
        "response_tokens": [length for _, length, _, _ in responses],
        "truncated": [truncated for _, _, truncated, _ in responses],
        "response_nll": [nll for _, _, _, nll in responses],      # Σ_t −log μ(y_t) of each response
    }
    if keep_responses:
        record["responses"] = [text for text, _, _, _ in responses]
    return record


def _summarise(records: list[dict], samples: int) -> dict[str, Any]:
    n = len(records)
    metrics: dict[str, float] = {}
    if n:
        metrics[f"avg@{samples}"] = sum(avg_at_k(r["correct"]) for r in records) / n
        for k in k_values(samples):
            metrics[f"pass@{k}"] = sum(pass_at_k(samples, r["num_correct"], k) for r in records) / n
        for k in k_values(samples):
            metrics[f"maj@{k}"] = sum(maj_at_k(r["extracted"], r["correct"], k) for r in records) / n
    total = max(1, n * samples)
    tokens = sum(sum(r["response_tokens"]) for r in records)
    per_problem = [r["num_correct"] / samples for r in records]
    return {
        "num_problems": n,
        "samples": samples,
        "metrics": metrics,
        "standard_error": {f"avg@{samples}": standard_error_of_mean(per_problem)},
        "sampling_standard_error": {f"avg@{samples}": sampling_standard_error([r["num_correct"] for r in records],
                                                                          samples)},
        "mean_response_tokens": tokens / total,
        "sampled_nll": sum(sum(r["response_nll"]) for r in records) / max(tokens, 1),
        "truncation_rate": sum(sum(r["truncated"]) for r in records) / total,
        "no_answer_rate": sum(sum(a is None for a in r["extracted"]) for r in records) / total,
        "problems": records,
    }


def flat_metrics(result: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
    """`{prefix}/{benchmark}/{metric}` scalars of an `evaluate` result, for a metrics logger."""
    flat = {}
    for name, bench in result["benchmarks"].items():
        for key, value in bench["metrics"].items():
            flat[f"{prefix}/{name}/{key}"] = float(value)
        for key in ("mean_response_tokens", "truncation_rate", "no_answer_rate", "sampled_nll"):
            flat[f"{prefix}/{name}/{key}"] = float(bench[key])
        for key, value in bench.get("standard_error", {}).items():
            if value is not None:
                flat[f"{prefix}/{name}/{key}_se"] = float(value)
        for key, value in bench.get("sampling_standard_error", {}).items():
            if value is not None:
                flat[f"{prefix}/{name}/{key}_sampling_se"] = float(value)
    return flat


def results_table(result: Mapping[str, Any]):
    """A rich table: one row per benchmark, accuracies in percent (pass@1 is avg@K, so it is not repeated), the
    standard error of avg@K beside it, and the mean over the benchmarks when there are several."""
    from rich.table import Table

    samples = result["settings"]["samples"]
    headline = f"avg@{samples}"
    keys = [*(f"pass@{k}" for k in k_values(samples) if k > 1), f"maj@{samples}"]
    table = Table(title=f"evaluation: {samples} samples per problem, template {result['settings']['template']}, "
                        "accuracies in % (± one standard error over problems and samples)")
    table.add_column("benchmark", no_wrap=True)
    for key in ["n", f"{headline} ± SE", *keys, "tokens", "trunc%", "no box%"]:
        table.add_column(key, justify="right", no_wrap=True)
    for name, bench in result["benchmarks"].items():
        m = bench["metrics"]
        table.add_row(name, str(bench["num_problems"]),
                      _with_error(m.get(headline), bench.get("standard_error", {}).get(headline)),
                      *(_percent(m.get(key)) for key in keys),
                      f"{bench['mean_response_tokens']:.0f}", f"{100 * bench['truncation_rate']:.0f}",
                      f"{100 * bench['no_answer_rate']:.0f}")
    mean = result.get("mean")
    if mean:
        table.add_section()
        table.add_row(f"mean of {len(mean['benchmarks'])}", "",
                      _with_error(mean[headline], mean["standard_error"][headline]), *("" for _ in keys), "", "", "")
    return table


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _with_error(value, error) -> str:
    return _percent(value) if value is None or error is None else f"{100 * value:.1f} ± {100 * error:.1f}"


def print_results(result: Mapping[str, Any], console=None) -> None:
    from rich.console import Console

    (console or Console()).print(results_table(result))


def _engine_device(generator: Any) -> torch.device:
    model = getattr(generator, "model", None)
    if isinstance(model, torch.nn.Module):
        parameter = next(model.parameters(), None)
        if parameter is not None:
            return parameter.device
    return torch.device("cpu")


class _progress_reporter:
    """Context manager yielding `report(benchmark, done, total)`: the callback, and a rich bar if asked."""

    def __init__(self, callback: ProgressCallback | None, show: bool):
        self.callback, self.show, self.bar, self.tasks = callback, show, None, {}

    def __enter__(self) -> ProgressCallback:
        if self.show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), transient=False)
            self.bar.start()
        return self.report

    def report(self, name: str, done: int, total: int) -> None:
        if self.bar is not None:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(f"eval {name}", total=total)
            self.bar.update(self.tasks[name], completed=done)
        if self.callback is not None:
            self.callback(name, done, total)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
