"""End-to-end tokens per second of the default job with asynchronous rollouts, k = rollout.max_staleness in {0, 1, 2},
on the vLLM engine and on 2 Ray rollout workers (docs/async.md, docs/scaling.md).

Each configuration is a real `literl train` run of the default job (the testbed's base policy, lite_ppo, 32 prompts ×
8 samples of up to 64 tokens) in its own process, with evaluation off, for `--steps` steps. Its metrics.jsonl gives,
per step, `throughput/end_to_end_tokens_per_s` (generated tokens over the wall time from the previous step's end to
this one's) and the phase timings; the first `--warmup` steps (engine start, the producer filling its queue) are
left out of the medians. Threads: the synchronous run (k = 0) gives all `--threads` to each phase in turn; an
asynchronous run splits them between the engine and the update, which run at once (rollout.async_engine_threads,
default half). Ray: `cluster.rollout_workers=2`, one trainer rank, `cluster.cpus_per_worker=1` (each actor one
thread).

    python benchmarks/async_step.py                               # all six configurations (~15 min on 2 idle cores)
    python benchmarks/async_step.py --configs vllm_k0 vllm_k1 --steps 4 --warmup 1    # a quick check
    python benchmarks/async_step.py --out async_step.json

Per configuration one JSON line: the medians (tokens/s end to end, step seconds, the trainer's and the engine's
idle seconds, the overlap fraction, generate and update seconds), then a summary line with each asynchronous
configuration's speed-up over k = 0 on the same engine. Timings are only meaningful on a quiet machine; the
JSON records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_JOB = ["trainer.progress=false", "eval.before=false", "eval.every=0", "eval.limit=8", "eval.samples=1",
               "eval.greedy=false", "trainer.save_every_minutes=0"]
ENGINES = {
    "vllm": ["rollout.engine=vllm"],
    "ray2": ["cluster.address=local", "cluster.rollout_workers=2", "cluster.trainer_ranks=1",
             "cluster.cpus_per_worker=1"],
}
CONFIGS = {f"{engine}_k{k}": (engine, k) for engine in ENGINES for k in (0, 1, 2)}
MEDIANS = {"tokens_per_s_end_to_end": "throughput/end_to_end_tokens_per_s", "step_s": "time/step",
           "trainer_idle_s": "time/trainer_idle", "engine_idle_s": "time/engine_idle",
           "overlap_frac": "time/overlap_frac", "generate_s": "time/generate", "update_s": "time/update",
           "rollout_wait_s": "time/rollout", "staleness_mean": "async/staleness_mean"}


def run_config(name: str, *, steps: int, warmup: int, threads: int, extra: list[str],
               engine_threads: int | None = None) -> dict:
    engine, k = CONFIGS[name]
    if k and engine_threads:
        extra = [*extra, f"rollout.async_engine_threads={engine_threads}"]
    with tempfile.TemporaryDirectory(prefix=f"literl-async-{name}-") as tmp:
        out = Path(tmp) / "run"
        args = [sys.executable, "-m", "literl.cli", "train", *DEFAULT_JOB, *ENGINES[engine],
                f"trainer.steps={steps}", f"rollout.max_staleness={k}", f"trainer.threads={threads}",
                f"trainer.output_dir={out}", *extra]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        proc = subprocess.run(args, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            return {"config": name, "error": proc.stderr[-2000:] or proc.stdout[-2000:]}
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = rows[warmup:]
    record = {"config": name, "engine": engine, "max_staleness": k, "threads": threads, "steps": steps,
              "timed_steps": len(timed), "wall_s": round(wall, 1)}
    for key, metric in MEDIANS.items():
        values = [r[metric] for r in timed if r.get(metric) is not None]
        if values:
            record[key] = round(statistics.median(values), 4)
    record["generated_tokens_per_step"] = round(statistics.mean(r["collect/generated_tokens"] for r in timed), 1)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the medians")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engine-threads", type=int, help="the engine's threads in the asynchronous runs "
                        "(rollout.async_engine_threads; default half of --threads; the update keeps the rest, at "
                        "least 1, so more than half oversubscribes the cores)")
    parser.add_argument("--out", type=Path, help="also write the records and the summary to this JSON file")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} leaves no step of --steps {args.steps} to time")
    records = []
    for name in args.configs:
        record = run_config(name, steps=args.steps, warmup=args.warmup, threads=args.threads, extra=args.overrides,
                            engine_threads=args.engine_threads)
        record["engine_threads"] = args.engine_threads
        record["load_avg_1min"] = os.getloadavg()[0]
        print(json.dumps(record), flush=True)
        records.append(record)
    base = {r["engine"]: r for r in records if r.get("max_staleness") == 0 and "error" not in r}
    speedups = {r["config"]: round(r["tokens_per_s_end_to_end"] / base[r["engine"]]["tokens_per_s_end_to_end"], 3)
                for r in records if r.get("max_staleness") and "error" not in r and r["engine"] in base}
    summary = {"summary": "speed-up in end-to-end tokens/s over k = 0 on the same engine", "speedups": speedups,
               "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"records": records, **summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
