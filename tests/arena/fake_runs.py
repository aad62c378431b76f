"""Hand-made run directories in the layout of docs/run-directory.md, with accuracies chosen by the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

TRAIN_KEYS = ("reward/mean", "entropy/mean", "response_length/mean", "policy_loss/clipfrac_binding_low",
              "policy_loss/clipfrac_binding_high", "truncation_rate", "groups/reward_std_mean",
              "groups/reward_std/easy", "groups/reward_std/hard", "repetition/truncated_repetitive_frac",
              "repetition/truncated_repetitive_frac_correct", "repetition/truncated_repetitive_frac_wrong",
              "ti/kl_k3", "st/kl_k3", "tot/kl_k3", "share/ti", "share/st", "entropy/token_max")


def write_run(directory: Path, accuracy: Sequence[float], *, eval_every: int = 5, seed: int = 0,
              finished: bool = True, metric: str = "testbed/accuracy", clipped: dict | None = None,
              sampling_se: float | None = None) -> Path:
    """A run whose held-out `metric` is accuracy[k] at step k·eval_every (k = 0 is 'before', the last
    'after'); per-step training metrics are smooth functions of the step so that plots have data. With
    `sampling_se`, every evaluation also logs `<metric>_sampling_se` (as evaluations with K >= 2 samples do)."""
    directory.mkdir(parents=True, exist_ok=True)
    steps = eval_every * (len(accuracy) - 1)
    (directory / "config.yaml").write_text(f"seed: {seed}\ntrainer:\n  steps: {steps}\n")
    with open(directory / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            values = {key: round(0.1 + 0.01 * ((i + step + seed) % 7), 4) for i, key in enumerate(TRAIN_KEYS)}
            f.write(json.dumps({"step": step, "accuracy": 0.4 + 0.01 * step, **values}) + "\n")
    with open(directory / "eval.jsonl", "w") as f:
        for k, value in enumerate(accuracy):
            tag = "before" if k == 0 else ("after" if k == len(accuracy) - 1 else f"step_{k * eval_every}")
            row = {"step": k * eval_every, "tag": tag, metric: value,
                   metric.replace("accuracy", "greedy_accuracy"): value + 0.05}
            if sampling_se is not None:
                row[f"{metric}_sampling_se"] = sampling_se
            f.write(json.dumps(row) + "\n")
    if finished:
        clipped = clipped or {"low": [{"token": " but", "id": 5, "count": 3}],
                              "high": [{"token": "\n", "id": 1, "count": 7}, {"token": "is", "id": 9, "count": 2}]}
        (directory / "diagnostics.json").write_text(json.dumps({"clipped_tokens": clipped}))
        (directory / "summary.json").write_text(json.dumps({"steps": steps, "seed": seed, "eval": {}}))
    return directory
