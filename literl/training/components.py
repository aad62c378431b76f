"""What the training loop reads: the parts a run is built from (by `literl.assembly.builder.build_components`), its
bookkeeping at the start and the end, and the one teardown.

The loop sees the rollout side only through the collector and the engine (`literl.rollout.engine.Engine`), and
the update side only through the learner (`literl.training.learner.Learner`): the policy module, its forwards and
the optimizer are the learner's (`learner.policy()`, and `policy_forward`, `reference`, `optimizer`, `scheduler` on
the in-process learner).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from literl.algorithm.diagnostics.mechanisms import MechanismDiagnostics
from literl.algorithm.objective import Objective
from literl.config.schema import Config
from literl.data.files import write_json_atomic
from literl.run.console import Console
from literl.run.lock import DirectoryLock
from literl.run.metrics_log import MetricsLog


@dataclass
class RunComponents:
    cfg: Config
    run_dir: Path
    tokenizer: Any
    engine: Any                             # samples the rollouts (the Engine protocol)
    learner: Any                            # the update and the no-grad passes (literl.training.learner)
    objective: Objective
    collector: Any                          # collect(rng) → (batch, metrics); the rollout side of a step
    evaluator: Callable
    eval_engine: Callable[[], Any]          # the engine the held-out evaluation samples with (eval.policy)
    log: MetricsLog
    console: Console
    diagnostics: MechanismDiagnostics
    started: float = field(default_factory=time.perf_counter)
    lock: DirectoryLock | None = None       # held from build_components until the run ends (one writer per run)
    write_record: Callable[[], None] | None = None      # config.yaml and run.json's session, not yet written
    _released: bool = field(default=False, repr=False)

    def record_start(self) -> None:
        """Write config.yaml and this session's entry in run.json, once the run has really started: for a resume,
        after its checkpoint loaded, so that a resume refused there (an override that does not fit the
        checkpoint) changes neither and a later plain resume still works."""
        if self.write_record is not None:
            self.write_record()
            self.write_record = None

    def finish(self, eval_results: dict, steps: int | None = None, no_learning_signal: str | None = None) -> None:
        """Write the run's summary and diagnostics, print the before/after table. `steps`: the steps the final
        model was trained for (a resume with trainer.steps below its checkpoint keeps the checkpoint's);
        `no_learning_signal`: why no step of the run had a learning signal, when none had (kept in summary.json)."""
        wall = time.perf_counter() - self.started
        steps = self.cfg.trainer.steps if steps is None else steps
        summary = {"run_dir": str(self.run_dir), "steps": steps, "wall_seconds": wall,
                   "preset": self.cfg.preset, "seed": self.cfg.seed, "eval": eval_results,
                   **({"no_learning_signal": no_learning_signal} if no_learning_signal else {})}
        write_json_atomic(self.run_dir / "summary.json", summary)
        write_json_atomic(self.run_dir / "diagnostics.json", self.diagnostics.summary())
        self.log.close()
        self.console.summary(self.run_dir, eval_results, wall)

    def release(self) -> None:
        """The one teardown, however the run ends (once; later calls do nothing): stop the asynchronous producer
        thread first (it may be using the engine), then the engine (its own process, or Ray rollout workers) and
        the learner's trainer ranks, and let another process write to the run directory."""
        if self._released:
            return
        self._released = True
        for part in (self.collector, self.engine, self.learner):
            for stop in ("shutdown", "close"):      # Ray actors and threads shut down; an engine process closes
                method = getattr(part, stop, None)
                if method is not None:
                    method()
        if self.lock is not None:
            self.lock.release()
