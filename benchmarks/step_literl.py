"""literl's side of the step-speed benchmark: a run assembled from a Config by `build_components` (the path
`literl.train` takes), stepped with `Trainer._train_step`, timed per phase in wall and CPU time.

The objective mirrors TRL's defaults: GRPO group advantages (std-scaled), PPO clip ε = 0.2, token-mean
aggregation over the step (TRL's `loss_type="dapo"`), no KL, no reference model, one on-policy optimizer step
per rollout batch (so the old-log-prob pass is skipped, as TRL does with num_iterations=1), AdamW at TRL's
default learning rate 1e-6, gradient clipping at 1.0. literl's defaults stay on, the update replaying the
rollout's forward among them (`replayed_update` in each step's record).
"""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager

import torch

from literl.rewards.isolation import time_bounded


@time_bounded
def digit_fraction(response: str, example: dict, *, timeout_s: float | None = None) -> float:
    """Fraction of the response's characters that are digits (0 for an empty response).

    The benchmark's reward: a random-weight policy gets it nearly always different for the samples of a group,
    so every response carries a nonzero advantage and both frameworks update on all of them. It bounds its own
    time (a character count), so literl calls it in-process, as TRL does.
    """
    return sum(ch.isdigit() for ch in response) / len(response) if response else 0.0


def literl_overrides(*, threads: int, prompts_per_step: int, group_size: int, max_new_tokens: int,
                     output_dir: str) -> list[str]:
    """The key=value overrides on the grpo preset that make the benchmark run (see the module docstring)."""
    return [
        # The testbed's defaults for everything left null: a model passed in memory would otherwise get the
        # real-model profile (top-p 0.99 / top-k 100 sampling, a system prompt), not the workload TRL runs.
        "model.profile=testbed",
        f"rollout.prompts_per_step={prompts_per_step}", f"rollout.group_size={group_size}",
        f"rollout.max_new_tokens={max_new_tokens}", "rollout.temperature=1.0",
        "algorithm.aggregation.name=token_mean", "optim.lr=1e-6", "optim.max_grad_norm=1.0",
        "trainer.minibatches=1", f"trainer.threads={threads}", "trainer.progress=false", "trainer.device=cpu",
        "trainer.log_samples=0", "trainer.save_every=0", f"trainer.output_dir={output_dir}",
        "eval.before=false", "eval.every=0",
    ]


class LiterlStepper:
    """One literl run on the given model and problems; `step()` runs and times one full RL step."""

    def __init__(self, model, tokenizer, problems: list[dict], *, threads: int, group_size: int,
                 max_new_tokens: int, extra_overrides: tuple[str, ...] = ()):
        import literl
        from literl.assembly.builder import build_components
        from literl.training.trainer import Trainer

        self._tmp = tempfile.TemporaryDirectory(prefix="literl-step-speed-")
        overrides = literl_overrides(threads=threads, prompts_per_step=len(problems), group_size=group_size,
                                     max_new_tokens=max_new_tokens, output_dir=f"{self._tmp.name}/run")
        self.cfg = literl.load_config(preset="grpo", overrides=overrides + list(extra_overrides))
        parts = build_components(self.cfg, model=model, tokenizer=tokenizer, problems=problems,
                                 reward_fns=[digit_fraction])
        self.trainer = Trainer(parts)
        self._cpu: dict[str, float] = {}
        self._prepared = None
        self._replayed = False
        self._instrument(parts)

    def _instrument(self, parts) -> None:
        """CPU time of the rollout and update phases, and the prepared batch (to count what was trained on)."""
        collect, update, prepare = parts.collector.collect, self.trainer._update, parts.objective.prepare

        def timed(phase, fn):
            def wrapper(*args, **kwargs):
                with self._cpu_time(phase):
                    return fn(*args, **kwargs)
            return wrapper

        def keep_prepared(*args, **kwargs):
            self._prepared = prepare(*args, **kwargs)
            return self._prepared

        def update_noting_replay(train):
            # Asked before the update: its optimizer step makes the record stale.
            self._replayed = parts.learner.policy_forward.replays(train.forward_record)
            return update(train)

        parts.collector.collect = timed("rollout", collect)
        self.trainer._update = timed("update", update_noting_replay)
        parts.objective.prepare = keep_prepared

    @contextmanager
    def _cpu_time(self, phase: str):
        start = time.process_time()
        yield
        self._cpu[phase] = time.process_time() - start

    def step(self) -> dict[str, float]:
        """Rollout, reward, advantages, update and weight sync for one batch; its timings and token counts."""
        self._cpu.clear()
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        metrics = self.trainer._train_step()
        wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        self.trainer.step += 1
        train, _ = self._prepared
        return {
            "step_s": wall, "step_cpu_s": cpu,
            "rollout_s": metrics["time/rollout"], "generate_s": metrics["time/generate"],
            "reward_s": metrics["time/reward"], "update_s": metrics["time/update"],
            "old_logp_s": metrics.get("time/old_logp", 0.0),
            "other_s": wall - metrics["time/rollout"] - metrics["time/update"] - metrics.get("time/old_logp", 0.0),
            "rollout_cpu_s": self._cpu["rollout"], "update_cpu_s": self._cpu["update"],
            "generated_tokens": metrics["collect/generated_tokens"],
            "trained_tokens": float(train.loss_mask_BT.sum()),
            "responses": float(len(train)),
            "zero_advantage_responses": float(_zero_advantage_rows(train.adv_BT, train.loss_mask_BT)),
            "zero_reward_std_groups": metrics["groups/zero_std_frac"] * len(train) / self.cfg.rollout.group_size,
            # 1: the update replayed the rollout's forward (literl/model/record.py), 4N FLOPs per trained token
            "replayed_update": float(self._replayed),
        }

    def close(self) -> None:
        self.trainer.parts.log.close()
        self._tmp.cleanup()


def _zero_advantage_rows(adv_BT: torch.Tensor, mask_BT: torch.Tensor) -> int:
    """Responses whose every trained token has advantage 0 (they contribute no policy gradient)."""
    nonzero_B = ((adv_BT != 0) & mask_BT).any(-1)
    return int((mask_BT.any(-1) & ~nonzero_B).sum())
