"""literl's RL step with the vLLM engine (`python benchmarks/step_speed.py --engine vllm`), on the step-speed
workload (benchmarks/workload.py: 16 prompts × 8 samples × up to 64 tokens, the 3.2 M-parameter Qwen3, fp32).

Each timed round runs, in one process and one engine:
  1. literl's full step with rollout.engine=vllm (rollout, reward, advantages, update, weight sync),
  2. vLLM generate alone: the engine's `generate` on the same prompts and sampling settings, nothing else,
  3. literl update alone: the same update on the step's batch from the same starting weights (policy and
     optimizer state are restored afterwards, so the run goes on as if it had not happened), after the engine
     has been idle for a moment.
The headline is median(step) / (median(generate alone) + median(update alone)): what literl adds around the two
parts that must run (sync, reward, batch assembly, the process hop); target ≤ 1.1. Load from other processes
slows all three alike within a round; the JSON reports the machine's load average.
"""

from __future__ import annotations

import copy
import datetime
import statistics
import sys
import time

import torch

import workload
from step_literl import LiterlStepper

TARGET_RATIO = 1.1
IDLE_BEFORE_UPDATE_S = 0.5


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def vllm_record(args, problems: list[dict]) -> dict:
    workload.set_threads(args.threads)
    model, tokenizer = workload.build_model()
    overrides = ("rollout.engine=vllm", *args.override)
    stepper = LiterlStepper(model, tokenizer, problems, threads=args.threads, group_size=workload.GROUP_SIZE,
                            max_new_tokens=workload.MAX_NEW_TOKENS, extra_overrides=overrides)
    parts, trainer = stepper.trainer.parts, stepper.trainer
    engine = parts.engine
    prompts = workload.rollout_prompts(tokenizer)
    sampling = parts.collector.sampling
    step_metrics = _keep_step_metrics(trainer)
    warm = [stepper.step() for _ in range(args.warmup)]
    rounds = []
    for r in range(args.steps):
        before = _training_state(parts)
        step = stepper.step()
        step["sync_s"] = step_metrics[-1].get("time/sync", 0.0)
        start = time.perf_counter()
        engine.generate(prompts, sampling, rng=torch.Generator().manual_seed(10_000 + r))
        step["generate_alone_s"] = time.perf_counter() - start
        step["update_alone_s"] = _update_alone(trainer, stepper._prepared[0], before)
        rounds.append(step)
        print(f"[step_speed] vllm round {r}: step {step['step_s']:.2f} s = generate {step['generate_s']:.2f} + sync "
              f"{step['sync_s']:.3f} + update {step['update_s']:.2f} + rest; alone: generate "
              f"{step['generate_alone_s']:.2f}, update {step['update_alone_s']:.2f}", file=sys.stderr, flush=True)
    stepper.close()
    engine.close()
    med = {key: _median([r[key] for r in rounds]) for key in ("step_s", "generate_s", "sync_s", "update_s",
                                                             "reward_s", "generate_alone_s", "update_alone_s",
                                                             "generated_tokens", "trained_tokens")}
    ratio = round(med["step_s"] / (med["generate_alone_s"] + med["update_alone_s"]), 3)
    cfg = stepper.cfg
    return {
        "benchmark": "step_speed_vllm", "measured_at": datetime.date.today().isoformat(),
        "step_over_generate_plus_update": ratio, "target_max": TARGET_RATIO, "met": ratio <= TARGET_RATIO,
        "median": med, "step_s_min": round(min(r["step_s"] for r in rounds), 4),
        "step_s_max": round(max(r["step_s"] for r in rounds), 4),
        "other_s": round(med["step_s"] - med["generate_s"] - med["sync_s"] - med["update_s"], 4),
        "sync_bytes": engine.last_sync.get("sync/bytes"), "engine_start_s": round(engine.start_seconds, 1),
        "engine": {"vllm": engine.process.info.get("vllm_version"), "dtype": cfg.rollout.dtype,
                   "enforce_eager": cfg.rollout.vllm.enforce_eager, "log": engine.log_path},
        "warmup_step_s": [round(w["step_s"], 2) for w in warm],
        "workload": {"prompts": workload.PROMPTS_PER_STEP, "group_size": workload.GROUP_SIZE,
                     "max_new_tokens": workload.MAX_NEW_TOKENS, "temperature": 1.0, "model_dtype": "float32",
                     "threads": args.threads, "warmup": args.warmup, "steps": args.steps,
                     "overrides": list(overrides)},
        "machine": workload.machine(),
    }


def _keep_step_metrics(trainer) -> list[dict]:
    """The metrics of every step run from now on (the step's phase times, `time/sync` among them)."""
    kept: list[dict] = []
    train_step = trainer._train_step

    def keeping():
        kept.append(train_step())
        return kept[-1]

    trainer._train_step = keeping
    return kept


def _training_state(parts) -> tuple:
    return tuple(copy.deepcopy(x.state_dict()) for x in (parts.policy, parts.optimizer, parts.scheduler))


def _load_training_state(parts, state: tuple) -> None:
    for x, saved in zip((parts.policy, parts.optimizer, parts.scheduler), state):
        x.load_state_dict(saved)


def _update_alone(trainer, train, before: tuple) -> float:
    """The step's update again on its batch, from the weights and optimizer state the step started from, timed
    alone after the engine has been idle for a moment; then the state after the step is put back."""
    parts = trainer.parts
    after = _training_state(parts)
    _load_training_state(parts, before)
    time.sleep(IDLE_BEFORE_UPDATE_S)
    start = time.perf_counter()
    trainer._update(train)
    seconds = time.perf_counter() - start
    _load_training_state(parts, after)
    return seconds
