"""The RL loop. It reads like the algorithm box of a paper and never looks at a trick's name:

    for step = 1 … S:
        batch   ← collect P groups of G samples (rewards, shaping, group filter; resampling if asked)
        old     ← log π_old(batch)           (skipped when it can be read off the update, or in bypass mode)
        ref     ← log π_ref(batch)           (only when the objective has a KL term)
        train   ← objective.prepare(batch, old, ref)      advantages, masks, IS weights, agg. weights
        for each of E epochs, each of N mini-batches:  Σ_micro objective.loss(micro).backward();  optimizer.step()
                                              (the learner: in this process, or trainer ranks on a cluster)
        engine  ← θ                           (weight sync)
        log metrics; evaluate and checkpoint on schedule
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from literl.config.load import to_yaml
from literl.run.checkpoint import (load_latest_checkpoint, non_finite_parameters, restore_rng_state, rng_state,
                                        save_checkpoint, save_model)
from literl.training.components import RunComponents
from literl.model.lora import final_view
from literl.model.precision import MASTER_DTYPE, compute_dtype
from literl.run.step_outcomes import StepStopped
from literl.training.learning_signal import no_signal_reason, run_without_signal


class NonFiniteTraining(RuntimeError):
    """Training produced NaN/inf losses, gradients or weights; nothing non-finite was saved."""


class TrainingInterrupted(KeyboardInterrupt):
    """A stop request (Ctrl-C, SIGTERM) ended the loop after a checkpoint was saved at `.checkpoint`."""

    def __init__(self, checkpoint: Path):
        super().__init__(f"interrupted; checkpoint saved at {checkpoint}")
        self.checkpoint = checkpoint


class PhaseTimer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


class Trainer:
    """Owns the loop state (step, RNG) around the components a run is built from."""

    def __init__(self, parts: RunComponents):
        self.parts = parts
        self.cfg = parts.cfg
        self.step = 0
        self.rng = torch.Generator().manual_seed(self.cfg.seed)
        self.eval_results: dict[str, dict] = {}
        self._saved: tuple[int, Path] | None = None     # (step, path) of the checkpoint of the current state
        self._step_start: dict | None = None            # loop state before the step in progress (None: between steps)
        self._weights_moved = False                     # an optimizer step of the step in progress has run
        self._non_finite_in_a_row = 0
        self._signal_warnings: set[str] = set()
        self._last_step_end: float | None = None         # for the end-to-end token rate
        self._stop_requested = lambda: False             # Ctrl-C / SIGTERM seen (set by the loop)
        self._nothing_learned: str | None = None         # why no step had a learning signal, when none had

    # ------------------------------------------------------------------------------------------ the loop
    def fit(self) -> Path:
        try:
            return self._fit()
        finally:
            self.parts.release()        # the run directory is free for the next writer, however this ended

    def _fit(self) -> Path:
        p, cfg = self.parts, self.cfg
        self._resume_if_asked()
        p.record_start()            # config.yaml and run.json: after a resume's checkpoint has loaded
        if self.step == 0 and cfg.eval.before:
            self._evaluate("before")
        p.console.start(total=cfg.trainer.steps, done=self.step)
        last_save = time.monotonic()
        self._last_step_end = time.perf_counter()
        inner_collector = getattr(p.collector, "inner", p.collector)     # an asynchronous run's producer's
        if hasattr(inner_collector, "on_progress"):
            inner_collector.on_progress = p.console.note        # a step that resamples for long says how far it is
        with _deferred_interrupts() as stop_requested:
            self._stop_requested = stop_requested
            try:
                while self.step < cfg.trainer.steps and not stop_requested():
                    self._step_start, self._weights_moved = self._loop_state(), False
                    try:
                        metrics = self._train_step()
                    except StepStopped:
                        # Stopped inside a step that had not trained yet (resampling, or waiting for a batch):
                        # back to the state after the last complete step, which the code below saves.
                        self._restore_step_start()
                        self._step_start = None
                        break
                    self.step += 1
                    self._step_start = None
                    p.log.log(self.step, metrics)
                    p.console.update(self.step, metrics)
                    # Once a stop is requested, saving comes first: a scheduler's grace period is short.
                    if (cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.trainer.steps
                            and not stop_requested()):
                        self._evaluate(f"step_{self.step}")
                    if self._save_due(last_save):
                        self._save_checkpoint()
                        last_save = time.monotonic()
            except Exception as err:
                p.console.stop()
                self._save_after_failure(err)
                raise
        p.console.stop()
        # Saving the same step again would move the complete checkpoint aside while the copy is written: with
        # keep_checkpoints=1 a crash in that window would leave nothing to resume from.
        path = self._saved[1] if self._saved and self._saved[0] == self.step else self._save_checkpoint()
        if self.step < cfg.trainer.steps:
            p.console.note(f"interrupted after step {self.step}: checkpoint saved at {path}; continue with "
                           f"trainer.resume=true trainer.output_dir={p.run_dir}")
            raise TrainingInterrupted(path)
        self._warn_if_nothing_learned()
        self._refuse_non_finite_weights("final/")
        # In the compute dtype (model.dtype), as Hugging Face users expect; the checkpoints keep float32 masters.
        final_dtype = compute_dtype(cfg.model.dtype)
        save_model(p.run_dir / "final", final_view(p.learner.policy()), p.tokenizer,
                   dtype=None if final_dtype == MASTER_DTYPE else final_dtype)
        self._evaluate("after")
        p.finish(self.eval_results, steps=self.step, no_learning_signal=self._nothing_learned)
        return p.run_dir

    def _save_due(self, last_save: float) -> bool:
        t = self.cfg.trainer
        by_steps = t.save_every and self.step % t.save_every == 0
        by_time = t.save_every_minutes and time.monotonic() - last_save >= 60 * t.save_every_minutes
        return bool(by_steps or by_time) and self.step < t.steps     # the last step is saved after the loop

    def _loop_state(self) -> dict:
        """What a step changes besides the weights: restored when a step fails before its first optimizer step,
        so that the checkpoint written then is exactly the state after the previous step."""
        p = self.parts
        return {"rng": rng_state(self.rng), "collector": p.collector.position(),
                "diagnostics": p.diagnostics.state_dict()}       # state_dict()s are fresh copies

    def _restore_step_start(self) -> None:
        """Undo what the step in progress changed besides the weights (it had not stepped the optimizer yet)."""
        p = self.parts
        p.collector.rewind(self._step_start["collector"])
        restore_rng_state(self._step_start["rng"], self.rng)
        p.diagnostics.load_state_dict(self._step_start["diagnostics"])

    def _save_after_failure(self, err: Exception) -> None:
        """Best effort: a checkpoint of the last complete step, so that an exception (a full disk, out of
        memory, an I/O error) costs at most the step it happened in."""
        p = self.parts
        failed_in_step = self._step_start is not None
        if failed_in_step and self._weights_moved:
            p.console.note(f"step {self.step + 1} failed after an optimizer step had changed the weights, so no "
                           f"consistent checkpoint can be written; the last one is "
                           f"{self._saved[1] if self._saved else 'none'}")
            return
        if self.step == 0:
            return                      # nothing trained yet: a restart is as good as a checkpoint
        if failed_in_step:
            self._restore_step_start()
        if self._saved and self._saved[0] == self.step:
            path = self._saved[1]
        else:
            try:
                path = self._save_checkpoint()
            except Exception as save_err:  # noqa: BLE001 - the original error is the one to report
                p.console.note(f"the run failed ({type(err).__name__}: {err}) and the checkpoint after it could "
                               f"not be written either ({save_err})")
                return
        p.console.note(f"the run failed at step {self.step + 1} ({type(err).__name__}: {err}); the state after "
                       f"step {self.step} is saved at {path}. Fix the cause, then continue with "
                       f"trainer.resume=true trainer.output_dir={p.run_dir}")

    def _train_step(self) -> dict[str, float]:
        p, cfg = self.parts, self.cfg
        timer = PhaseTimer()
        with timer("rollout"):
            batch, metrics = p.collector.collect(self.rng, stop=self._stop_requested)
        if len(batch) == 0:
            # Every group was filtered out (e.g. dynamic sampling with all-equal groups): nothing to learn from.
            metrics.update({"loss/total": 0.0, "optim/grad_norm": 0.0, "optim/skipped_step": 1.0,
                            "advantage/all_zero": 1.0})
            self._warn_no_signal(metrics)
            return {**metrics, **self._timing(timer, batch, metrics)}
        n_minibatches = min(cfg.trainer.minibatches, max(len(torch.unique(batch.group_B)), 1))
        old_logp_BT = ref_logp_BT = None
        if p.objective.needs_old_logp_pass(n_minibatches * cfg.trainer.epochs):
            with timer("old_logp"):
                old_logp_BT = p.learner.logprobs(batch)
        if p.objective.needs_reference:
            with timer("ref_logp"):
                ref_logp_BT = p.learner.reference_logprobs(batch)
        train, prep_metrics = p.objective.prepare(batch, old_logp_BT=old_logp_BT, ref_logp_BT=ref_logp_BT,
                                                  minibatches=n_minibatches, epochs=cfg.trainer.epochs,
                                                  rng=self.rng)
        metrics.update(prep_metrics)
        metrics["advantage/all_zero"] = float(not bool(train.adv_BT.any()))
        if metrics["advantage/all_zero"]:
            self._warn_no_signal(metrics)
        with timer("update"):
            metrics.update(self._update(train))
        with timer("sync"):
            # An engine with its own copy of the weights reports what the sync moved (e.g. sync/bytes).
            metrics.update(p.engine.sync_weights(p.learner.weights()) or {})
        metrics.update(p.learner.take_metrics())
        metrics.update(p.diagnostics.observe_rollout(batch))
        p.log.log_samples(self.step + 1, _samples(batch, cfg.trainer.log_samples))
        return {**metrics, **self._timing(timer, batch, metrics)}

    def _update(self, train) -> dict[str, float]:
        """N optimizer steps; each accumulates its micro-batches' exact shares of the step loss
        (`literl.training.learner`: in this process, or spread over trainer ranks)."""
        return self.parts.learner.update(train, observe=self.parts.diagnostics.observe_update,
                                         on_step=self._after_optimizer_step)

    def _after_optimizer_step(self, report) -> None:
        """Each optimizer step's outcome (`learner.StepReport`): a non-finite one is counted (and stops the run
        after trainer.max_non_finite_steps in a row), a taken one resets the count and marks the weights moved."""
        if report.non_finite:
            self._on_non_finite_step(report.loss, report.grad_norm)
        elif report.stepped:
            self._non_finite_in_a_row = 0
            self._weights_moved = True

    def _warn_no_signal(self, metrics: dict[str, float]) -> None:
        """Loudly, once per reason: a run whose weights never change should not look like a run that learns."""
        reason = no_signal_reason(metrics, group_size=self.cfg.rollout.group_size)
        if reason not in self._signal_warnings:
            self._signal_warnings.add(reason)
            self.parts.console.note(f"WARNING: no learning signal at step {self.step + 1}: {reason}. "
                                    "(advantage/all_zero counts such steps in metrics.jsonl)")

    def _warn_if_nothing_learned(self) -> None:
        """At the end: a run none of whose steps had a learning signal says so, and its summary.json records it, so
        that it cannot be taken for a run that learned (its final/ is the starting model, or moved only by KL,
        entropy or momentum)."""
        reason = run_without_signal(self.parts.log.path)
        self._nothing_learned = reason
        if reason:
            self.parts.console.note(f"WARNING: this run learned nothing: {reason}")

    def _on_non_finite_step(self, loss: float, grad_norm: float) -> None:
        self._non_finite_in_a_row += 1
        limit = self.cfg.trainer.max_non_finite_steps
        what = f"loss {loss}, gradient norm {grad_norm}"
        if limit and self._non_finite_in_a_row >= limit:
            raise NonFiniteTraining(
                f"{self._non_finite_in_a_row} optimizer steps in a row had a non-finite loss or gradient ({what}); "
                f"stopping at step {self.step + 1} (trainer.max_non_finite_steps={limit}). The weights are still "
                "those of the last good step. Usual causes: a learning rate far too high (optim.lr), rewards of "
                "an extreme scale, or a policy loss without clipping (log_ratio_clamp, caps)")
        self.parts.console.note(f"WARNING: skipped an optimizer step at step {self.step + 1}: non-finite {what} "
                                f"({self._non_finite_in_a_row} in a row; the run stops after "
                                f"trainer.max_non_finite_steps={limit})")

    def _timing(self, timer: PhaseTimer, batch, metrics: dict) -> dict[str, float]:
        total = sum(timer.seconds.values())
        generated = float(metrics.get("collect/generated_tokens", batch.num_tokens))
        out = {f"time/{k}": v for k, v in timer.seconds.items()}
        out.update({"time/step": total, "throughput/generated_tokens_per_s": generated / max(total, 1e-9),
                    "throughput/trained_tokens_per_s": batch.num_tokens / max(timer.seconds.get("update", 0), 1e-9)})
        # Generated tokens per wall second from the end of the previous step to the end of this one (evaluations and
        # checkpoints in between included): the rate an asynchronous run raises by overlapping the phases.
        now = time.perf_counter()
        if self._last_step_end is not None:
            out["throughput/end_to_end_tokens_per_s"] = generated / max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        for key in ("time/generate", "time/reward"):   # reported by the collector inside the rollout phase
            if key in metrics:
                out[key] = metrics[key]
        return out

    # ------------------------------------------------------------------------------------------ eval, save, resume
    def _evaluate(self, tag: str) -> None:
        p = self.parts
        # Evaluation seeds its own generators, so it never shifts the training random stream.
        results = p.evaluator(p.eval_engine(), progress=p.console.sub_progress)
        self.eval_results[tag] = {"step": self.step, **results}
        p.log.log_eval(self.step, tag, results)
        p.console.note_eval(tag, self.step, results)

    def _save_checkpoint(self) -> Path:
        p = self.parts
        self._refuse_non_finite_weights("a checkpoint")
        # The collector's state: the prompt stream's position (and an asynchronous run's batches in flight).
        state = {**p.learner.state_dict(), "rng": rng_state(self.rng), **p.collector.state_dict(),
                 "eval_results": self.eval_results, "diagnostics": p.diagnostics.state_dict()}
        path = save_checkpoint(p.run_dir, self.step, model=p.learner.policy(), tokenizer=p.tokenizer,
                               trainer_state=state, keep=self.cfg.trainer.keep_checkpoints,
                               config_text=to_yaml(self.cfg))
        self._saved = (self.step, path)
        return path

    def _refuse_non_finite_weights(self, what: str) -> None:
        bad = non_finite_parameters(self.parts.learner.policy())
        if bad:
            last = self._saved[1] if self._saved else "none"
            raise NonFiniteTraining(f"{len(bad)} weight tensors hold NaN or inf after step {self.step} (first: "
                                    f"{bad[0]}); not writing them as {what}. The last checkpoint is {last}")

    def _resume_if_asked(self) -> None:
        p = self.parts
        if not self.cfg.trainer.resume:
            return
        resumed = load_latest_checkpoint(p.run_dir, p.learner.policy())
        if resumed is None:
            p.console.note(f"trainer.resume=true but {p.run_dir} has no checkpoint yet: starting from step 0")
            # Records of an attempt that never checkpointed are redone, the evaluation before training included.
            p.log.truncate_after(0, retag_evaluations={"before": None} if self.cfg.eval.before else {})
            return
        for note in resumed.notes:
            p.console.note(f"WARNING: {note}")
        path, state = resumed.path, resumed.state
        p.learner.load_state_dict(state)
        restore_rng_state(state["rng"], self.rng)
        p.collector.load_state_dict(state)
        p.diagnostics.load_state_dict(state.get("diagnostics", {}))
        self.eval_results = state.get("eval_results", {})
        self.step = int(state["step"])
        self._saved = (self.step, path)
        p.engine.sync_weights(p.learner.weights())
        # The closing evaluation runs again at the last step. A run extended past its old end keeps the old
        # closing evaluation as an intermediate one.
        extended = self.step < self.cfg.trainer.steps
        p.log.truncate_after(self.step, retag_evaluations={"after": f"step_{self.step}" if extended else None})
        p.console.note(f"resumed from {path} at step {self.step}")
        if self.step > self.cfg.trainer.steps:
            p.console.note(f"trainer.steps={self.cfg.trainer.steps} is below the checkpoint's step {self.step}: "
                           f"nothing to train; final/ holds the model of step {self.step}")


def _samples(batch, n: int) -> list[dict]:
    return [{"problem": batch.problems[i].get("problem", ""), "gold": batch.problems[i].get("answer", ""),
             "response": batch.responses[i], "reward": float(batch.rewards_B[i]),
             "correct": bool(batch.correct_B[i]), "truncated": bool(batch.truncated_B[i])}
            for i in range(min(n, len(batch)))]


@contextmanager
def _deferred_interrupts():
    """Ctrl-C (or SIGTERM, e.g. from the ablation runner) finishes the current step, then the loop saves a
    checkpoint and stops; a second Ctrl-C aborts at once (the last saved checkpoint stays intact)."""
    requested = []

    def handler(signum, frame):
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)
        print("\n[literl] stopping after this step to save a checkpoint (Ctrl-C again to abort without saving)",
              flush=True)

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:          # not the main thread (e.g. a notebook worker): leave signals alone
        yield lambda: False
        return
    try:
        yield lambda: bool(requested)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
