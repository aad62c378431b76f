"""The RL loop. It reads like the algorithm box of a paper and never looks at a trick's name:

    for step = 1 … S:
        batch   ← collect P groups of G samples (rewards, shaping, group filter; resampling if asked)
        old     ← log π_old(batch)           (skipped when it can be read off the update, or in bypass mode)
        ref     ← log π_ref(batch)           (only when the objective has a KL term)
        train   ← objective.prepare(batch, old, ref)      advantages, masks, IS weights, agg. weights
        for each of N mini-batches:  Σ_micro objective.loss(micro).backward();  optimizer.step()
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

from literl.training.checkpoint import (latest_checkpoint, load_checkpoint, restore_rng_state, rng_state,
                                        save_checkpoint, save_model)
from literl.components import RunComponents


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

    # ------------------------------------------------------------------------------------------ the loop
    def fit(self) -> Path:
        p, cfg = self.parts, self.cfg
        self._resume_if_asked()
        if self.step == 0 and cfg.eval.before:
            self._evaluate("before")
        p.console.start(total=cfg.trainer.steps, done=self.step)
        with _deferred_interrupts() as stop_requested:
            while self.step < cfg.trainer.steps and not stop_requested():
                metrics = self._train_step()
                self.step += 1
                p.log.log(self.step, metrics)
                p.console.update(self.step, metrics)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.trainer.steps:
                    self._evaluate(f"step_{self.step}")
                if cfg.trainer.save_every and self.step % cfg.trainer.save_every == 0:
                    self._save_checkpoint()
        p.console.stop()
        # Saving the same step again would move the complete checkpoint aside while the copy is written: with
        # keep_checkpoints=1 a crash in that window would leave nothing to resume from.
        path = self._saved[1] if self._saved and self._saved[0] == self.step else self._save_checkpoint()
        if self.step < cfg.trainer.steps:
            p.console.note(f"interrupted after step {self.step}: checkpoint saved at {path}; continue with "
                           f"trainer.resume=true trainer.output_dir={p.run_dir}")
            raise KeyboardInterrupt
        save_model(p.run_dir / "final", p.learner.policy(), p.tokenizer)
        self._evaluate("after")
        p.finish(self.eval_results)
        return p.run_dir

    def _train_step(self) -> dict[str, float]:
        p, cfg = self.parts, self.cfg
        timer = PhaseTimer()
        with timer("rollout"):
            batch, metrics = p.collector.collect(self.rng)
        if len(batch) == 0:
            # Every group was filtered out (e.g. dynamic sampling with all-equal groups): nothing to learn from.
            metrics.update({"loss/total": 0.0, "optim/grad_norm": 0.0, "optim/skipped_step": 1.0})
            return {**metrics, **self._timing(timer, batch, metrics)}
        n_minibatches = min(cfg.trainer.minibatches, max(len(torch.unique(batch.group_B)), 1))
        old_logp_BT = ref_logp_BT = None
        if p.objective.needs_old_logp_pass(n_minibatches):
            with timer("old_logp"):
                old_logp_BT = p.learner.logprobs(batch)
        if p.objective.needs_reference:
            with timer("ref_logp"):
                ref_logp_BT = p.learner.reference_logprobs(batch)
        train, prep_metrics = p.objective.prepare(batch, old_logp_BT=old_logp_BT, ref_logp_BT=ref_logp_BT,
                                                  minibatches=n_minibatches, rng=self.rng)
        metrics.update(prep_metrics)
        with timer("update"):
            metrics.update(self._update(train))
        with timer("sync"):
            # An engine with its own copy of the weights reports what the sync moved (sync/bytes, sync/seconds).
            metrics.update(p.engine.sync_weights(p.learner.weights()) or {})
        metrics.update(p.learner.take_metrics())
        metrics.update(p.diagnostics.observe_rollout(batch))
        p.log.log_samples(self.step + 1, _samples(batch, cfg.trainer.log_samples))
        return {**metrics, **self._timing(timer, batch, metrics)}

    def _update(self, train) -> dict[str, float]:
        """N optimizer steps; each accumulates its micro-batches' exact shares of the step loss
        (`literl.training.learner`: in this process, or spread over trainer ranks)."""
        return self.parts.learner.update(train, observe=self.parts.diagnostics.observe_update)

    @staticmethod
    def _timing(timer: PhaseTimer, batch, metrics: dict) -> dict[str, float]:
        total = sum(timer.seconds.values())
        generated = float(metrics.get("collect/generated_tokens", batch.num_tokens))
        out = {f"time/{k}": v for k, v in timer.seconds.items()}
        out.update({"time/step": total, "throughput/generated_tokens_per_s": generated / max(total, 1e-9),
                    "throughput/trained_tokens_per_s": batch.num_tokens / max(timer.seconds.get("update", 0), 1e-9)})
        for key in ("time/generate", "time/reward"):   # reported by the collector inside the rollout phase
            if key in metrics:
                out[key] = metrics[key]
        return out

    # ------------------------------------------------------------------------------------------ eval, save, resume
    def _evaluate(self, tag: str) -> None:
        p = self.parts
        # Evaluation seeds its own generators, so it never shifts the training random stream.
        results = p.evaluator(p.engine, progress=p.console.sub_progress)
        self.eval_results[tag] = {"step": self.step, **results}
        p.log.log_eval(self.step, tag, results)
        p.console.note_eval(tag, self.step, results)

    def _save_checkpoint(self) -> Path:
        p = self.parts
        state = {**p.learner.state_dict(), "rng": rng_state(self.rng), "stream": p.collector.stream.state_dict(),
                 "eval_results": self.eval_results, "diagnostics": p.diagnostics.state_dict()}
        path = save_checkpoint(p.run_dir, self.step, model=p.learner.policy(), tokenizer=p.tokenizer, trainer_state=state,
                               keep=self.cfg.trainer.keep_checkpoints)
        self._saved = (self.step, path)
        return path

    def _resume_if_asked(self) -> None:
        p = self.parts
        if not self.cfg.trainer.resume:
            return
        path = latest_checkpoint(p.run_dir)
        if path is None:
            p.console.note(f"trainer.resume=true but {p.run_dir} has no checkpoint yet: starting from step 0")
            # Records of an attempt that never checkpointed are redone, the evaluation before training included.
            p.log.truncate_after(0, retag_evaluations={"before": None} if self.cfg.eval.before else {})
            return
        state = load_checkpoint(path, p.learner.policy())
        p.learner.load_state_dict(state)
        restore_rng_state(state["rng"], self.rng)
        p.collector.stream.load_state_dict(state["stream"])
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
