"""literl's RL step with the vLLM engine (`python benchmarks/step_speed.py --engine vllm`), on the step-speed
workload (benchmarks/workload.py: 16 prompts × 8 samples × up to 64 tokens, the 3.2 M-parameter Qwen3, fp32).

Each timed round runs, in one process and one engine:
  1. literl's full step with rollout.engine=vllm (rollout, reward, advantages, update, weight sync),
  2. vLLM generate alone: the engine's `generate` on the same prompts and sampling settings, nothing else,
  3. literl update alone: the same update on the step's batch from the same starting weights (policy and
     optimizer state are restored afterwards, so the run goes on as if it had not happened), after the engine
     has been idle for a moment.
The headline is the median over rounds of step / (generate alone + update alone) of the same round: what literl
adds around the two parts that must run (sync, reward, batch assembly, the process hop); target ≤ 1.1. Load from
other processes slows the three of a round about alike; the same ratio in CPU seconds (this process's and the
engine's) is steadier on a shared machine. The JSON reports the machine's load average.
"""

from __future__ import annotations

import copy
import datetime
import os
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


class Clock:
    """Wall seconds, and CPU seconds of this process and of the engine's (all their threads), since `start()`."""

    def __init__(self, engine_pid: int):
        self.engine_pid = engine_pid

    def _engine_cpu(self) -> float:
        with open(f"/proc/{self.engine_pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")     # utime + stime

    def start(self) -> None:
        self._wall, self._cpu, self._engine = time.perf_counter(), time.process_time(), self._engine_cpu()

    def read(self) -> tuple[float, float]:
        """(wall, CPU of both processes)."""
        return (time.perf_counter() - self._wall,
                time.process_time() - self._cpu + self._engine_cpu() - self._engine)


def vllm_record(args, problems: list[dict]) -> dict:
    workload.set_threads(args.threads)
    model, tokenizer = workload.build_model()
    overrides = ("rollout.engine=vllm", *args.override)
    stepper = LiterlStepper(model, tokenizer, problems, threads=args.threads, group_size=workload.GROUP_SIZE,
                            max_new_tokens=workload.MAX_NEW_TOKENS, extra_overrides=overrides)
    parts, trainer = stepper.trainer.parts, stepper.trainer
    engine = parts.engine
    clock = Clock(engine.process.proc.pid)
    prompts = workload.rollout_prompts(tokenizer)
    sampling = parts.collector.sampling
    step_metrics = _keep_step_metrics(trainer)
    warm = [stepper.step() for _ in range(args.warmup)]
    rounds = []
    for r in range(args.steps):
        before = _training_state(parts)
        clock.start()
        step = stepper.step()
        step["step_s"], step["step_cpu_s"] = clock.read()
        step["sync_s"] = step_metrics[-1].get("time/sync", 0.0)
        step["rest_s"] = step["step_s"] - step["generate_s"] - step["sync_s"] - step["update_s"]
        clock.start()
        engine.generate(prompts, sampling, rng=torch.Generator().manual_seed(10_000 + r))
        step["generate_alone_s"], step["generate_alone_cpu_s"] = clock.read()
        step["update_alone_s"], step["update_alone_cpu_s"] = _update_alone(trainer, stepper._prepared[0], before,
                                                                           clock)
        step["ratio"] = step["step_s"] / (step["generate_alone_s"] + step["update_alone_s"])
        step["ratio_cpu"] = step["step_cpu_s"] / (step["generate_alone_cpu_s"] + step["update_alone_cpu_s"])
        # What the step adds around its own generate and update phases (sync, reward, batch assembly): immune to
        # load that slows a phase in one measurement and not in the other.
        step["ratio_own"] = step["step_s"] / (step["generate_s"] + step["update_s"])
        rounds.append(step)
        print(f"[step_speed] vllm round {r}: step {step['step_s']:.2f} s = generate {step['generate_s']:.2f} + sync "
              f"{step['sync_s']:.3f} + update {step['update_s']:.2f} + rest {step['rest_s']:.2f}; alone: generate "
              f"{step['generate_alone_s']:.2f}, update {step['update_alone_s']:.2f}; ratio {step['ratio']:.3f} "
              f"(CPU time {step['ratio_cpu']:.3f})", file=sys.stderr, flush=True)
    stepper.close()
    engine.close()
    keys = ("step_s", "step_cpu_s", "generate_s", "sync_s", "update_s", "rest_s", "reward_s", "generate_alone_s",
            "generate_alone_cpu_s", "update_alone_s", "update_alone_cpu_s", "generated_tokens", "trained_tokens")
    med = {key: _median([r[key] for r in rounds]) for key in keys}
    ratio = _median([r["ratio"] for r in rounds])
    cfg = stepper.cfg
    return {
        "benchmark": "step_speed_vllm", "measured_at": datetime.date.today().isoformat(),
        # per round: its step over its own generate-alone + update-alone (load hits the three alike), then the median
        "step_over_generate_plus_update": ratio, "target_max": TARGET_RATIO, "met": ratio <= TARGET_RATIO,
        "step_over_generate_plus_update_cpu": _median([r["ratio_cpu"] for r in rounds]),
        "ratios": [round(r["ratio"], 3) for r in rounds], "ratios_cpu": [round(r["ratio_cpu"], 3) for r in rounds],
        "step_over_own_generate_plus_update": _median([r["ratio_own"] for r in rounds]),
        "median": med, "step_s_min": round(min(r["step_s"] for r in rounds), 4),
        "step_s_max": round(max(r["step_s"] for r in rounds), 4),
        "sync_bytes": engine.last_sync.get("sync/bytes"), "engine_start_s": round(engine.start_seconds, 1),
        "engine": {"vllm": engine.process.info.get("vllm_version"), "dtype": cfg.rollout.dtype,
                   "enforce_eager": cfg.rollout.vllm.enforce_eager, "threads": engine.process.info.get("threads"),
                   "log": engine.log_path},
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
    learner = parts.learner
    return tuple(copy.deepcopy(x.state_dict()) for x in (learner.policy(), learner.optimizer, learner.scheduler))


def _load_training_state(parts, state: tuple) -> None:
    for x, saved in zip((parts.learner.policy(), parts.learner.optimizer, parts.learner.scheduler), state):
        x.load_state_dict(saved)


def _update_alone(trainer, train, before: tuple, clock: Clock) -> tuple[float, float]:
    """The step's update again on its batch, from the weights and optimizer state the step started from, timed
    alone after the engine has been idle for a moment; then the state after the step is put back."""
    parts = trainer.parts
    after = _training_state(parts)
    _load_training_state(parts, before)
    time.sleep(IDLE_BEFORE_UPDATE_S)
    clock.start()
    trainer._update(train)
    seconds = clock.read()
    _load_training_state(parts, after)
    return seconds
