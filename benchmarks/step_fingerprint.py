"""Fingerprints of the step benchmark's numbers, to check that a change which should not alter arithmetic did not.

For a few steps of the benchmark's workload (benchmarks/workload.py) in several configurations, prints one JSON line
per configuration with, per step, short hashes of the sampled tokens, the rollout log-probs and the weights after
the update. Run it in two checkouts and compare the lines (the workload and the seed are fixed):

    python benchmarks/step_fingerprint.py > after.json
    (cd ../old-checkout && python benchmarks/step_fingerprint.py) > before.json
    diff before.json after.json          # (copy this file into a checkout that predates it)

Equal token hashes mean both sampled the same responses; the weights' hash also catches float-rounding changes.
It runs at 1 torch thread by default; `--threads 2` (the default job's) reproduces itself too, with other hashes
(the matmuls split their sums by thread). Before 2026-11-27 it did not: the G rows of a group added their gradients
into their shared prompt's last hidden state through indexing's backward, whose threads add in whichever order
they get there (`tests/training/test_shared_prompts.py`); fingerprints of checkouts before that compare at 1 thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload  # noqa: E402
from step_literl import LiterlStepper  # noqa: E402
from step_speed import problems  # noqa: E402

CONFIGS = {
    "eager": (),
    "compiled": ("rollout.compile=true", "trainer.compile=true"),
    "two_minibatches": ("trainer.minibatches=2",),
    "token_tis": ("algorithm.is_correction.name=token_tis",),
}


def short_hash(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def fingerprint(overrides: tuple[str, ...], steps: int, threads: int = 1) -> list[dict]:
    model, tokenizer = workload.build_model()
    stepper = LiterlStepper(model, tokenizer, problems(), threads=threads, group_size=workload.GROUP_SIZE,
                            max_new_tokens=workload.MAX_NEW_TOKENS, extra_overrides=overrides)
    out = []
    try:
        for _ in range(steps):
            stepper.step()
            train, _ = stepper._prepared
            weights = torch.cat([q.detach().flatten() for q in stepper.trainer.parts.learner.policy().parameters()])
            out.append({"tokens": short_hash(train.response_ids_BT), "rollout_logp": short_hash(train.rollout_logp_BT),
                        "weights": short_hash(weights)})
    finally:
        stepper.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (each count reproduces itself run to run; counts differ from each other)")
    args = parser.parse_args()
    for name in args.configs:
        print(json.dumps({"config": name, "steps": fingerprint(CONFIGS[name], args.steps, args.threads)}), flush=True)


if __name__ == "__main__":
    main()
