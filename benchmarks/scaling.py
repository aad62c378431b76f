"""Scale-out on Ray: step time and bytes communicated per step for 1 and 2 trainer ranks × 1 and 2 rollout workers,
against the same step in one process (cluster.address=null).

Workload (benchmarks/workload.py): the benchmark Qwen3 (random weights, hidden 256, 4 layers, 3.2 M parameters,
fp32), 8 testbed prompts × 8 samples = 64 responses of up to 64 new tokens (about 48 on average), the
digit-fraction reward, the grpo preset with token-mean aggregation, one
on-policy AdamW step per batch. Each configuration runs `--steps` steps after one warm-up step in its own local
Ray cluster; every process (each Ray actor, the single-process run) uses 1 torch thread: on a shared 2-core machine
two OpenMP threads per process spin-wait on each other when the OS deschedules one (measured: 26 s per step in
one process with 2 threads at load 11, against 2.8 s with 1 rank and 1 worker of 1 thread each).

Bytes per step (per optimizer step, one of which per rollout batch here; P = parameter bytes, R ranks, W workers):
    weight sync      measured: what the workers received (W·P; rank 0 broadcasts each bucket)
    sync gather      R > 1: the ranks all-gather the shards for the sync, (R−1)/R·P into each rank
    update gather    R > 1: the FSDP unit's all-gather before the step's first forward, (R−1)/R·P into each rank
    reduce-scatter   R > 1: the gradient reduce-scatter after the step's last backward, (R−1)/R·P out of each rank
    batch            the rollout batch sent to each rank (Ray's object store; shared memory on one node)
Collective sizes are counted from the parameter sizes and the number of collectives the learner issues per step
(trainer_rank.py: one all-gather and one reduce-scatter per optimizer step, one all-gather per sync bucket); the
weight-sync bytes are counted as they are broadcast.

    python benchmarks/scaling.py                 # prints one JSON line per configuration, then a summary line
    python benchmarks/scaling.py --steps 3 --configs 1x1,2x2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_literl import digit_fraction, literl_overrides  # noqa: E402
from workload import build_model, machine  # noqa: E402

PROMPTS, GROUP, NEW_TOKENS = 8, 8, 64


def _problems(n: int) -> list[dict]:
    from literl.testbed.tasks import train_problems

    return [{"problem": p["problem"], "answer": p["answer"]} for p in train_problems(n, seed=0)]


def run_config(ranks: int | None, workers: int | None, steps: int) -> dict:
    """`steps` timed steps (after one warm-up) of one configuration; None, None: one process."""
    from literl.assembly.builder import build_components
    from literl.config.load import load_config
    from literl.training.trainer import Trainer

    model, tokenizer = build_model()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory(prefix="literl-scaling-") as tmp:
        overrides = literl_overrides(threads=1, prompts_per_step=PROMPTS, group_size=GROUP,
                                     max_new_tokens=NEW_TOKENS, output_dir=f"{tmp}/run")
        if ranks is not None:
            overrides += ["cluster.address=local", f"cluster.trainer_ranks={ranks}",
                          f"cluster.rollout_workers={workers}"]
        cfg = load_config(preset="grpo", overrides=overrides + ["trainer.steps=1000"])
        start = time.perf_counter()
        parts = build_components(cfg, model=model, tokenizer=tokenizer, problems=_problems(256),
                                 reward_fns=[digit_fraction])
        startup = time.perf_counter() - start
        trainer = Trainer(parts)
        batch_sizes = _count_batch_bytes(parts)
        records = []
        for step in range(steps + 1):
            metrics = trainer._train_step()
            trainer.step += 1
            if step > 0:
                records.append(metrics)
        batch_bytes = statistics.median(batch_sizes[1:]) if len(batch_sizes) > 1 else 0.0
        if ranks is not None:
            parts.engine.shutdown()
            parts.learner.shutdown()
            import ray

            ray.shutdown()
        parts.log.close()

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in records)

    gathers = (ranks - 1) / ranks * param_bytes if ranks else 0.0
    out = {
        "config": "one process" if ranks is None else f"{ranks} rank(s) x {workers} worker(s)",
        "trainer_ranks": ranks, "rollout_workers": workers, "steps": steps, "startup_s": startup,
        "step_s": median("time/step"), "rollout_s": median("time/rollout"), "update_s": median("time/update"),
        "sync_s": median("time/sync"), "generated_tokens": median("collect/generated_tokens"),
        "parameter_bytes": param_bytes,
        "bytes_per_step": {
            "weight_sync": median("sync/bytes"),
            "sync_gather_per_rank": gathers,
            "update_gather_per_rank": gathers,
            "reduce_scatter_per_rank": gathers,
            "batch_to_ranks": batch_bytes * (ranks or 0),
        },
        "load_avg_1min": os.getloadavg()[0],
    }
    return out


def _count_batch_bytes(parts) -> list[float]:
    """Record the tensor bytes of every prepared batch the learner is given (what each rank receives)."""
    import dataclasses

    sizes: list[float] = []
    update = parts.learner.update

    def counted(train, observe=None):
        tensors = [getattr(train, f.name) for f in dataclasses.fields(train)] + list(train.extras.values())
        sizes.append(float(sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))))
        return update(train, observe)

    parts.learner.update = counted
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per configuration (default 4)")
    parser.add_argument("--configs", default="single,1x1,2x1,1x2,2x2",
                        help="comma-separated: single, or RxW (trainer ranks x rollout workers)")
    args = parser.parse_args()
    results = []
    for name in args.configs.split(","):
        ranks, workers = (None, None) if name == "single" else map(int, name.split("x"))
        print(f"[scaling] {name} ...", file=sys.stderr, flush=True)
        result = run_config(ranks, workers, args.steps)
        results.append(result)
        print(json.dumps(result), flush=True)
    print(json.dumps({"summary": {r["config"]: round(r["step_s"], 3) for r in results}, "machine": machine()}))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
