"""TRL's side of the step-speed benchmark: `trl.GRPOTrainer` on the same architecture (a fresh seed-0 init), the
same character tokenizer, prompts and reward, timed per optimizer step by a callback.

Configuration (TRL 1.16; `trl_settings` returns it for the JSON record). One optimizer step per rollout batch
of P·G responses: per_device_train_batch_size = P·G and gradient_accumulation_steps = 1 (or, with
--trl-micro-batch r, r and P·G / r), so TRL derives generation_batch_size = P·G (one generation per step);
its RepeatSampler then draws P distinct prompts, each repeated G times, per step (the dataset holds exactly P
prompts). num_iterations = 1 and beta = 0: no
old-log-prob pass (TRL reuses the detached log-probs, as literl does) and no reference model. Generation is
TRL's non-vLLM path (`model.generate`, sampling at temperature 1.0, top_p 1, top_k 0). Everything else is
TRL's default: loss_type "dapo" (token-level normalisation over the batch), scale_rewards "group", ε = 0.2,
AdamW (adamw_torch) at lr 1e-6 with a linear schedule, max_grad_norm 1.0, fp32 on the CPU (bf16 off).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import warnings

from transformers import TrainerCallback

from step_literl import digit_fraction


def trl_reward(prompts, completions, **kwargs) -> list[float]:
    """literl's `digit_fraction` in TRL's reward signature (the same score for the same text)."""
    return [digit_fraction(completion, {}) for completion in completions]


def trl_settings(*, prompts_per_step: int, group_size: int, max_new_tokens: int, steps: int,
                 gradient_checkpointing: bool, rows_per_micro_batch: int | None = None) -> dict:
    """The GRPOConfig fields the benchmark sets (everything else is TRL's default).

    `rows_per_micro_batch` < P·G splits the optimizer step into gradient-accumulation micro-batches; TRL then
    still generates all P·G responses at once (steps_per_generation = the accumulation steps).
    """
    rows = prompts_per_step * group_size
    per_device = rows_per_micro_batch or rows
    if rows % per_device:
        raise ValueError(f"rows_per_micro_batch ({per_device}) must divide P·G = {rows}")
    return {
        "num_generations": group_size, "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": rows // per_device, "num_iterations": 1, "beta": 0.0,
        "max_completion_length": max_new_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
        # transformers 5.23's name for gradient checkpointing (TRL's default: on)
        "activation_checkpointing": gradient_checkpointing, "use_vllm": False, "bf16": False, "fp16": False,
        "use_cpu": not _accelerator_available(), "max_steps": steps, "report_to": [], "logging_steps": 10 ** 9,
        "save_strategy": "no", "disable_tqdm": True, "dataloader_num_workers": 0, "seed": 0,
    }


def _accelerator_available() -> bool:
    import torch

    return torch.cuda.is_available()


class TrlRun:
    """A GRPOTrainer whose every optimizer step is timed; `between_steps` runs after each one (interleaving)."""

    def __init__(self, model, tokenizer, problems: list[dict], *, group_size: int, max_new_tokens: int,
                 steps: int, gradient_checkpointing: bool, rows_per_micro_batch: int | None = None):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        self._tmp = tempfile.TemporaryDirectory(prefix="trl-step-speed-")
        self.settings = trl_settings(prompts_per_step=len(problems), group_size=group_size,
                                     max_new_tokens=max_new_tokens, steps=steps,
                                     gradient_checkpointing=gradient_checkpointing,
                                     rows_per_micro_batch=rows_per_micro_batch)
        dataset = Dataset.from_list([{"prompt": p["problem"]} for p in problems])
        self.records: list[dict] = []
        self.between_steps = lambda: None
        with _quiet():
            args = GRPOConfig(output_dir=self._tmp.name, **self.settings)
            self.trainer = GRPOTrainer(model=model, reward_funcs=[trl_reward], args=args, train_dataset=dataset,
                                       processing_class=tokenizer, callbacks=[_StepTimer(self)])
        self._generation: dict[str, float] = {}
        self._wrap_generation()

    def _wrap_generation(self) -> None:
        """Time TRL's rollout phase (generation, rewards, advantages) and count the tokens it generated."""
        generate = self.trainer._generate_and_score_completions

        def timed(inputs):
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            out = generate(inputs)
            self._generation.update(rollout_s=time.perf_counter() - start_wall,
                                    rollout_cpu_s=time.process_time() - start_cpu,
                                    generated_tokens=float(out["completion_mask"].sum()),
                                    responses=float(out["completion_mask"].shape[0]))
            return out

        self.trainer._generate_and_score_completions = timed

    def train(self) -> list[dict]:
        """Run every step; return one record per optimizer step. TRL's own printout goes to stderr."""
        with _quiet():
            self.trainer.train()
        return self.records

    def close(self) -> None:
        self._tmp.cleanup()


@contextlib.contextmanager
def _quiet():
    """TRL's printout to stderr (stdout carries the JSON line); its internal deprecation warnings silenced."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


class _StepTimer(TrainerCallback):
    """on_step_begin → on_step_end covers the whole optimizer step: rollout, loss, backward, optimizer."""

    def __init__(self, run: TrlRun):
        self.run = run
        self._start = (0.0, 0.0)

    def on_step_begin(self, args, state, control, **kwargs):
        self.run._generation.clear()
        self._start = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs):
        wall, cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]
        gen = self.run._generation
        self.run.records.append({
            "step_s": wall, "step_cpu_s": cpu, "rollout_s": gen["rollout_s"], "rollout_cpu_s": gen["rollout_cpu_s"],
            "update_s": wall - gen["rollout_s"], "update_cpu_s": cpu - gen["rollout_cpu_s"],
            "generated_tokens": gen["generated_tokens"], "trained_tokens": gen["generated_tokens"],
            "responses": gen["responses"],
        })
        self.run.between_steps()
