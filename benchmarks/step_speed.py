"""Full RL step speed: literl against TRL's GRPOTrainer on the same model and workload, in one process.

Workload (benchmarks/workload.py): a random-init (seed 0) fp32 Qwen3 (hidden 256, 4 layers, 4 heads, 2 KV
heads, head dim 64, FFN 768, tied embeddings, the 100-token character tokenizer), 16 testbed arithmetic
prompts × 8 samples = 128 responses of up to 64 new tokens at temperature 1.0, reward = the fraction of digit
characters in the response (it varies within groups, so every response is trained on), no reference model,
one on-policy AdamW step per rollout batch, 2 torch threads.

Modes (each prints one JSON line on stdout; progress goes to stderr):
  (default)  literl's full step (rollout, reward, advantages, update, weight sync; `Trainer._train_step`),
             TRL's optimizer step (gradient checkpointing off, then TRL's default on), the matmul rate and
             FLOP floor (benchmarks/flop_floor.py). After `--warmup` steps, each timed TRL step is followed by
             one literl step and one matmul-rate sample, so that load from other processes hits all alike.
             Medians of wall time (the headline) and CPU time (steadier on a shared machine). literl is
             timed twice: eager, and with rollout.compile=true trainer.compile=true (`literl_compiled`).
  --sweep    literl alone over group size (4, 8, 16) × response length (64, 128, 256): seconds per generated
             token for each (it should stay about flat).
  --memory   one full literl step at Qwen's vocabulary (151,936), 64 responses × 512 tokens, in a fresh child
             process: its peak memory (peak RSS on CPU, max allocated on CUDA).

    python benchmarks/step_speed.py                  # the comparison (about 2 minutes on 2 idle cores)
    python benchmarks/step_speed.py --sweep
    python benchmarks/step_speed.py --memory
    python benchmarks/step_speed.py --engine vllm    # literl's step with the vLLM engine (benchmarks/vllm_step.py)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flop_floor  # noqa: E402
import workload  # noqa: E402
from step_literl import LiterlStepper  # noqa: E402

TARGET_TRL_RATIO = 0.6
TARGET_FLOOR_RATIO = 1.5
MEMORY_LIMIT_GIB = 6.0
SWEEP_GROUPS = (4, 8, 16)
SWEEP_LENGTHS = (64, 128, 256)
# literl's compiled variant: the decode step and the training forward's layers through torch.compile.
COMPILED_OVERRIDES = ("rollout.compile=true", "trainer.compile=true")
GIB = 1024 ** 3


def log(message: str) -> None:
    print(f"[step_speed] {message}", file=sys.stderr, flush=True)


def problems(prompts_per_step: int = workload.PROMPTS_PER_STEP) -> list[dict]:
    """The benchmark's prompts: the same testbed problems `workload.rollout_prompts` encodes."""
    from literl.testbed.tasks import train_problems

    return train_problems(prompts_per_step, seed=0)


def median_record(records: list[dict]) -> dict[str, float]:
    """Per-key medians over steps (plus min/max and count of the step time)."""
    out = {key: statistics.median(r[key] for r in records) for key in records[0]}
    out.update(step_s_min=min(r["step_s"] for r in records), step_s_max=max(r["step_s"] for r in records),
               steps=len(records))
    out = {key: round(value, 4) if isinstance(value, float) else value for key, value in out.items()}
    out["seconds_per_generated_token"] = round(out["step_s"] / max(out["generated_tokens"], 1.0), 8)
    return out


# ------------------------------------------------------------------------------------------------ comparison
def _trl_installed() -> bool:
    return importlib.util.find_spec("trl") is not None


class LiterlSide:
    """literl's variants and the matmul-rate sampler, stepped together between TRL's steps."""

    def __init__(self, args):
        self.variants: dict[str, LiterlStepper] = {}
        self.records: dict[str, list[dict]] = {}
        self.compile_s: dict[str, float] = {}
        for name, overrides in (("literl", ()), ("literl_compiled", COMPILED_OVERRIDES)):
            if name != "literl" and not args.compiled:
                continue
            model, tokenizer = workload.build_model()
            self.variants[name] = LiterlStepper(model, tokenizer, problems(), threads=args.threads,
                                                group_size=workload.GROUP_SIZE,
                                                max_new_tokens=workload.MAX_NEW_TOKENS,
                                                extra_overrides=(*overrides, *args.override))
            self.records[name] = []
            warm = [self.variants[name].step() for _ in range(args.warmup)]
            log(f"{name} warm-up steps: " + ", ".join(f"{r['step_s']:.2f}" for r in warm) + " s")
            self.compile_s[name] = warm[0]["step_s"] - warm[-1]["step_s"]
        self.rate = flop_floor.MatmulRate(flop_floor.matmul_weight_shapes(model),
                                          decode_rows=workload.PROMPTS_PER_STEP * workload.GROUP_SIZE,
                                          train_tokens=int(warm[-1]["trained_tokens"]))
        self.rate.measure()

    def step(self) -> None:
        for name, stepper in self.variants.items():
            self.records[name].append(stepper.step())
            log(f"{name} step: {self.records[name][-1]['step_s']:.2f} s")
        self.rate.measure()

    def close(self) -> None:
        for stepper in self.variants.values():
            stepper.close()


def _run_trl(args, literl: LiterlSide, *, gradient_checkpointing: bool) -> tuple[list[dict], dict]:
    """TRL's steps; after the warm-up, each timed one is followed by one step of every literl variant."""
    from step_trl import TrlRun

    model, tokenizer = workload.build_model()
    run = TrlRun(model, tokenizer, problems(), group_size=workload.GROUP_SIZE,
                 max_new_tokens=workload.MAX_NEW_TOKENS, steps=args.warmup + args.steps,
                 gradient_checkpointing=gradient_checkpointing, rows_per_micro_batch=args.trl_micro_batch)

    def interleave():
        step = len(run.records)
        log(f"TRL (gradient checkpointing {'on' if gradient_checkpointing else 'off'}) step {step}: "
            f"{run.records[-1]['step_s']:.2f} s")
        if step > args.warmup:
            literl.step()

    run.between_steps = interleave
    records = run.train()[args.warmup:]
    settings = run.settings
    run.close()
    return records, settings


def _floor(rate: flop_floor.MatmulRate, literl_summary: dict) -> dict:
    rates = rate.summary()
    kwargs = dict(rate_generate=rates["rate_generate_gflops"] * 1e9, rate_train=rates["rate_train_gflops"] * 1e9)
    generated, trained = literl_summary["generated_tokens"], literl_summary["trained_tokens"]
    floor_s = flop_floor.floor_seconds(rate.n_params, generated, trained, **kwargs)
    return {
        "floor_s": round(floor_s, 4),
        # The same floor for the matmuls literl's step actually runs when its update replays the rollout's
        # forward (4N per trained token instead of 6N): for reading its ratio, not the target.
        "floor_replayed_s": round(flop_floor.floor_seconds(rate.n_params, generated, trained, **kwargs,
                                                           train_flops_per_param=4), 4),
        "n_params": rate.n_params,
        "generated_tokens": generated, "trained_tokens": trained,
        "rate_gflops": round(flop_floor.combined_rate(rate.n_params, generated, trained, **kwargs) / 1e9, 1),
        "rate_generate_gflops": round(rates["rate_generate_gflops"], 1),
        "rate_train_gflops": round(rates["rate_train_gflops"], 1), "rate_samples": rates["samples"],
        "decode_rows": rate.decode_rows, "train_rows": rate.train_tokens,
    }


def compare(args) -> dict:
    workload.set_threads(args.threads)
    literl = LiterlSide(args)
    result: dict = {}
    if _trl_installed() and not args.no_trl:
        import trl

        trl_records, settings = _run_trl(args, literl, gradient_checkpointing=False)
        result["trl"] = {"version": trl.__version__, **median_record(trl_records), "config": settings}
        if not args.no_trl_checkpointing:
            gc_records, gc_settings = _run_trl(args, literl, gradient_checkpointing=True)
            result["trl_gradient_checkpointing"] = {**median_record(gc_records), "config": gc_settings}
    else:
        for _ in range(args.steps):
            literl.step()
    literl.close()
    variants = {name: median_record(records) for name, records in literl.records.items()}
    if "literl_compiled" in variants:
        variants["literl_compiled"]["compile_s"] = round(literl.compile_s["literl_compiled"], 2)
    result = {**variants, **result}
    result["floor"] = _floor(literl.rate, result["literl"])
    return result


def _ratios(result: dict) -> dict:
    """Each literl variant's median step over the floor and over each TRL run's median (wall, CPU, per token)."""
    ratios = {}
    for variant in ("literl", "literl_compiled"):
        if variant not in result:
            continue
        ours = result[variant]
        ratios[f"{variant}_over_floor"] = round(ours["step_s"] / result["floor"]["floor_s"], 3)
        if ours.get("replayed_update") == 1.0:
            ratios[f"{variant}_over_floor_replayed"] = round(ours["step_s"] / result["floor"]["floor_replayed_s"], 3)
        for name in ("trl", "trl_gradient_checkpointing"):
            if name in result:
                theirs = result[name]
                ratios[f"{variant}_over_{name}"] = round(ours["step_s"] / theirs["step_s"], 3)
                ratios[f"{variant}_over_{name}_cpu"] = round(ours["step_cpu_s"] / theirs["step_cpu_s"], 3)
                ratios[f"{variant}_over_{name}_per_token"] = round(
                    ours["seconds_per_generated_token"] / theirs["seconds_per_generated_token"], 3)
    return ratios


def comparison_record(args) -> dict:
    result = compare(args)
    ratios = _ratios(result)
    # Per variant: the eager default, and the compiled one (`rollout.compile=true trainer.compile=true`).
    met = {variant: ratios[f"{variant}_over_floor"] <= TARGET_FLOOR_RATIO
           and ratios.get(f"{variant}_over_trl", 0.0) <= TARGET_TRL_RATIO
           for variant in ("literl", "literl_compiled") if f"{variant}_over_floor" in ratios}
    targets = {"literl_over_trl_max": TARGET_TRL_RATIO, "literl_over_floor_max": TARGET_FLOOR_RATIO, "met": met}
    literl = result["literl"]
    phases = {key: literl[key] for key in ("rollout_s", "generate_s", "reward_s", "update_s", "old_logp_s",
                                           "other_s", "rollout_cpu_s", "update_cpu_s")}
    return {
        "benchmark": "step_speed", "measured_at": datetime.date.today().isoformat(),
        "literl_step_s": literl["step_s"], "trl_step_s": result.get("trl", {}).get("step_s"),
        "trl_gradient_checkpointing_step_s": result.get("trl_gradient_checkpointing", {}).get("step_s"),
        "floor_s": result["floor"]["floor_s"], **ratios, "literl_phases": phases, "targets": targets,
        "workload": _workload(args), **result, "machine": workload.machine(),
    }


def _workload(args) -> dict:
    return {"prompts": workload.PROMPTS_PER_STEP, "group_size": workload.GROUP_SIZE,
            "max_new_tokens": workload.MAX_NEW_TOKENS, "temperature": 1.0, "dtype": "float32",
            "threads": args.threads, "warmup": args.warmup, "steps": args.steps,
            "reward": "step_literl.digit_fraction"}


# ------------------------------------------------------------------------------------------------ sweep
def sweep_record(args) -> dict:
    """literl's step over group size × response length; seconds per generated token for each."""
    workload.set_threads(args.threads)
    rows = []
    for group_size in SWEEP_GROUPS:
        for max_new_tokens in SWEEP_LENGTHS:
            model, tokenizer = workload.build_model()
            literl = LiterlStepper(model, tokenizer, problems(), threads=args.threads, group_size=group_size,
                                   max_new_tokens=max_new_tokens, extra_overrides=tuple(args.override))
            for _ in range(args.warmup):
                literl.step()
            summary = median_record([literl.step() for _ in range(args.steps)])
            literl.close()
            rows.append({"group_size": group_size, "max_new_tokens": max_new_tokens,
                         **{key: summary[key] for key in ("seconds_per_generated_token", "step_s", "step_cpu_s",
                                                          "generated_tokens", "rollout_s", "update_s")}})
            log(f"G={group_size} T={max_new_tokens}: {rows[-1]['seconds_per_generated_token'] * 1e3:.3f} ms/token")
    per_token = [row["seconds_per_generated_token"] for row in rows]
    return {"benchmark": "step_speed_sweep", "measured_at": datetime.date.today().isoformat(),
            "max_over_min_seconds_per_token": round(max(per_token) / min(per_token), 3), "sweep": rows,
            "workload": _workload(args), "machine": workload.machine()}


# ------------------------------------------------------------------------------------------------ memory
MEMORY_VOCAB = 151_936
MEMORY_PROMPTS, MEMORY_GROUP, MEMORY_TOKENS = 8, 8, 512


def memory_child(threads: int, overrides: tuple[str, ...] = ()) -> dict:
    """One full literl step at vocabulary 151,936, 64 responses × up to 512 tokens; its peak memory."""
    workload.set_threads(threads)
    model, tokenizer = workload.build_model(vocab_size=MEMORY_VOCAB)
    literl = LiterlStepper(model, tokenizer, problems(MEMORY_PROMPTS), threads=threads, group_size=MEMORY_GROUP,
                           max_new_tokens=MEMORY_TOKENS, extra_overrides=overrides)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else workload.rss_bytes()
    record = literl.step()
    peak = torch.cuda.max_memory_allocated() if cuda else workload.peak_rss_bytes()
    literl.close()
    return {"peak_gib": round(peak / GIB, 3), "before_step_gib": round(before / GIB, 3),
            "step_adds_gib": round((peak - before) / GIB, 3), "measure": "max_memory_allocated" if cuda
            else "peak RSS (ru_maxrss)", "step_s": round(record["step_s"], 2),
            "rollout_s": round(record["rollout_s"], 2), "update_s": round(record["update_s"], 2),
            "generated_tokens": record["generated_tokens"], "trained_tokens": record["trained_tokens"]}


def memory_record(args) -> dict:
    command = [sys.executable, __file__, "--memory-child", "--threads", str(args.threads),
               *(f"--override={override}" for override in args.override)]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    return {"benchmark": "step_speed_memory", "measured_at": datetime.date.today().isoformat(),
            "vocab": MEMORY_VOCAB, "responses": MEMORY_PROMPTS * MEMORY_GROUP, "max_new_tokens": MEMORY_TOKENS,
            **child, "limit_gib": MEMORY_LIMIT_GIB, "under_limit": child["peak_gib"] < MEMORY_LIMIT_GIB,
            "machine": {**workload.machine(), "threads": args.threads}}


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="group size × response length, literl only")
    mode.add_argument("--memory", action="store_true", help="peak memory of one step at vocabulary 151,936")
    mode.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=("native", "hf", "vllm"), default="native",
                        help="native (hf, its old name): literl's own engine; vllm: literl's step with "
                             "rollout.engine=vllm against vLLM generate alone + literl's update alone, in one run "
                             "(benchmarks/vllm_step.py)")
    parser.add_argument("--steps", type=int, help="timed steps per framework (default 5; sweep: 3 per point)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 2; sweep: 1 per point)")
    parser.add_argument("--threads", type=int, default=workload.TORCH_THREADS)
    parser.add_argument("--no-trl", action="store_true", help="literl only, even when TRL is installed")
    parser.add_argument("--no-trl-checkpointing", action="store_true",
                        help="skip TRL's run with its default gradient checkpointing")
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                        help="also time literl with rollout.compile=true and trainer.compile=true (its one-off "
                             "compile time is reported apart)")
    parser.add_argument("--trl-micro-batch", type=int,
                        help="TRL's per_device_train_batch_size (default: all P·G rows, no accumulation)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a literl config override for every literl variant (repeatable), e.g. "
                             "trainer.replay_max_gib=0 to compute the update's forward instead of replaying it")
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.threads, tuple(args.override))))
        return
    default_steps, default_warmup = (3, 1) if args.sweep else (5, 2)
    args.steps = default_steps if args.steps is None else args.steps
    args.warmup = default_warmup if args.warmup is None else args.warmup
    if args.engine == "vllm":
        from vllm_step import vllm_record

        record = vllm_record(args, problems())
    elif args.sweep:
        record = sweep_record(args)
    elif args.memory:
        record = memory_record(args)
    else:
        record = comparison_record(args)
    workload.print_json(record)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    log(f"done in {time.perf_counter() - start:.0f} s")
