"""Periodic held-out evaluation during training: the same `evaluate` that `literl eval` runs.

Each evaluation reports, per benchmark, `<name>/accuracy` (avg@K of samples at the evaluation
temperature: the headline), `<name>/greedy_accuracy` (when `eval.greedy`), pass@k, maj@k, mean response
length and truncation rate. Every evaluation of a run uses the same sampling seed (common random
numbers), so before/after differences are not blurred by sampling noise.
"""

from __future__ import annotations

from typing import Callable

from literl.data.benchmarks import TESTBED_TIER_BENCHMARKS
from literl.rollout.engine import SamplingParams

TESTBED_BENCHMARK = "testbed"


def build_evaluator(cfg, *, tokenizer) -> Callable:
    """Evaluation over cfg.eval.benchmarks (resolved: a list), prompted as training prompts are."""
    from literl.data.problems import load_problems
    from literl.evaluation.evaluate import evaluate, flat_metrics

    ev = cfg.eval
    benchmarks: dict[str, tuple[list[dict], str]] = {}
    for name in ev.benchmarks:
        # The testbed's held-out splits are generated with eval.limit problems (200 when null), as `literl eval
        # --limit` takes them; only their template differs.
        template = (prompt_template(cfg, testbed_problems=True) if name in TESTBED_TIER_BENCHMARKS
                    else cfg.data.template)
        problems = load_problems(name, data_dir=cfg.data.dir, limit=ev.limit)
        if len(problems) == 0:
            # refused here, before training: an evaluation of no problem has no accuracy to report
            raise ValueError(f"eval.benchmarks: {name} has no usable problem (every row was skipped: see the "
                             "warning above); fix its answers, or leave it out of eval.benchmarks")
        benchmarks[name] = (problems, template)
    prompt_options = prompt_options_of(cfg)
    temperature = ev.temperature if ev.temperature is not None else cfg.rollout.temperature
    max_new_tokens = ev.max_new_tokens or cfg.rollout.max_new_tokens
    sampled = SamplingParams(temperature=temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                             max_new_tokens=max_new_tokens)
    greedy = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, greedy=True)

    def run(engine, *, progress=None) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, (problems, template) in benchmarks.items():
            passes = [("", sampled, ev.samples)] + ([("greedy_", greedy, 1)] if ev.greedy else [])
            for label, params, k in passes:
                total = len(problems) * k
                with _progress(progress, f"eval {name}{' greedy' if label else ''}", total) as advance:
                    result = evaluate(engine, tokenizer, {name: problems}, sampling=params, samples=k,
                                      template=template, seed=cfg.seed, batch_size=256,
                                      prompt_options=prompt_options,
                                      progress=lambda _b, done, _t, a=advance: a(done))
                bench = result["benchmarks"][name]
                out[f"{name}/{label}accuracy"] = float(bench["metrics"][f"avg@{k}"])
                sampling_se = bench["sampling_standard_error"][f"avg@{k}"]
                if sampling_se is not None:     # K >= 2: the noise the arena weighs its paired differences against
                    out[f"{name}/{label}accuracy_sampling_se"] = float(sampling_se)
                if not label:
                    out.update({k2.removeprefix("eval/"): v for k2, v in flat_metrics(result).items()})
        return out

    return run


def prompt_template(cfg, *, testbed_problems: bool) -> str:
    """The testbed profile prompts the testbed's arithmetic verbatim (raw), whatever the tokenizer; otherwise
    data.template decides (auto: the tokenizer's declared template, its chat template, or plain)."""
    return "raw" if testbed_problems and cfg.model.profile == "testbed" else cfg.data.template


def prompt_options_of(cfg) -> dict:
    """The prompt settings of a (resolved) config, as `render_prompt` takes them."""
    d = cfg.data
    return {"system_prompt": d.system_prompt or "", "instruction": d.instruction,
            "chat_template_kwargs": dict(d.chat_template_kwargs)}


class _progress:
    """Adapt evaluate's (benchmark, done, total) callback to the console's advance(n) bars."""

    def __init__(self, factory, description: str, total: int):
        self.factory, self.description, self.total = factory, description, total
        self._ctx = None
        self._done = 0

    def __enter__(self):
        if self.factory is None:
            return lambda done: None
        self._ctx = self.factory(self.description, self.total)
        advance = self._ctx.__enter__()

        def report(done: int) -> None:
            advance(done - self._done)
            self._done = done
        return report

    def __exit__(self, *exc):
        if self._ctx is not None:
            return self._ctx.__exit__(*exc)
        return False
