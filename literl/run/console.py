"""What a person watching a run sees: a progress bar with ETA and key metrics, evaluations, a summary.

On a terminal this is a rich progress bar. When the output is not a terminal (a cluster job's log file, CI,
the ablation runner's train.log) or `trainer.progress=false`, every `trainer.log_every`-th step prints one
plain, unwrapped, flushed line with the elapsed time and an ETA, so that `tail -f` and `grep` work:

    step 12/100  acc 0.512  reward 0.512  loss +0.0012  entropy 0.110  len 31.2  s/step 0.61  [7s, eta 54s]

A `LoadWatch` (literl/run/load_watch.py) looks at every step and prints one warning when the machine
looks oversubscribed.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from literl.run.load_watch import LoadWatch

KEY_METRICS = [("accuracy", "acc", "{:.3f}"), ("reward/mean", "reward", "{:.3f}"), ("loss/total", "loss", "{:+.4f}"),
               ("entropy/mean", "entropy", "{:.3f}"), ("response_length/mean", "len", "{:.1f}"),
               ("time/step", "s/step", "{:.2f}")]


def _fmt(metrics: dict, keys=KEY_METRICS) -> str:
    parts = []
    for key, label, pattern in keys:
        value = metrics.get(key)
        if value is not None:
            parts.append(f"{label} {pattern.format(value)}")
    return "  ".join(parts)


def format_duration(seconds: float) -> str:
    """7s, 2m05s, 1h03m: short, fixed units, for log lines."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def plain_step_line(step: int, total: int, metrics: dict, elapsed: float, steps_done: int) -> str:
    """One step's log line; the ETA extrapolates this session's mean time per step (evaluations included)."""
    timing = format_duration(elapsed)
    if 0 < steps_done and step < total:
        timing += f", eta {format_duration(elapsed / steps_done * (total - step))}"
    return f"step {step}/{total}  {_fmt(metrics)}  [{timing}]"


class Console:
    def __init__(self, progress_bar: bool = True, *, stream=None, plain_every: int = 1, enabled: bool = True,
                 watch: LoadWatch | None = None, clock: Callable[[], float] = time.perf_counter):
        self.stream = stream or sys.stderr
        self.rich = RichConsole(file=self.stream)
        self.interactive = enabled and progress_bar and self.rich.is_terminal
        self.enabled = enabled
        self.plain_every = max(1, int(plain_every))
        self.watch = watch
        self._clock = clock
        self._progress: Progress | None = None
        self._task = None
        self._started = clock()
        self._first_step = 0

    def _line(self, text: str) -> None:
        """A plain line: never wrapped or marked up, flushed at once (log files are read while they grow)."""
        if self._progress is not None or self.interactive:
            self.rich.print(text, highlight=False, markup=False)
            return
        print(text, file=self.stream, flush=True)

    def start(self, total: int, done: int = 0) -> None:
        self._started = self._clock()
        self._total = total
        self._first_step = done
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"),
                console=self.rich, transient=False)
            self._progress.start()
            self._task = self._progress.add_task("train", total=total, completed=done, metrics="")

    def update(self, step: int, metrics: dict) -> None:
        elapsed = self._clock() - self._started
        if self._progress is not None:
            self._progress.update(self._task, completed=step, metrics=_fmt(metrics))
        elif self.enabled and (step % self.plain_every == 0 or step == self._total or step == self._first_step + 1):
            self._line(plain_step_line(step, self._total, metrics, elapsed, step - self._first_step))
        if self.watch is not None:
            warning = self.watch.observe(metrics, elapsed_s=elapsed)
            if warning:
                self.note(f"warning: {warning}")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, text: str) -> None:
        if self.enabled:
            self._line(f"[literl] {text}")

    def note_eval(self, tag: str, step: int, results: dict) -> None:
        if not self.enabled:
            return
        shown = ", ".join(f"{k} {v:.3f}" for k, v in results.items()
                          if isinstance(v, float) and ("accuracy" in k))
        self._line(f"[literl] eval {tag} (step {step}): {shown}")

    @contextmanager
    def sub_progress(self, description: str, total: int):
        """A transient bar for long inner work (evaluation); yields an `advance(n)` callback."""
        if not self.interactive:
            yield lambda n=1: None
            return
        if self._progress is not None:
            task = self._progress.add_task(description, total=total, metrics="")
            try:
                yield lambda n=1: self._progress.advance(task, n)
            finally:
                self._progress.remove_task(task)
            return
        with Progress(TextColumn(f"[bold]{description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=self.rich, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda n=1: progress.advance(task, n)

    def summary(self, run_dir, eval_results: dict, wall_seconds: float) -> None:
        if not self.enabled:
            return
        before, after = eval_results.get("before", {}), eval_results.get("after", {})
        keys = [k for k in after if isinstance(after[k], float) and ("accuracy" in k or "pass@" in k)]
        table = Table(title="held-out evaluation", show_lines=False)
        table.add_column("metric")
        table.add_column("before", justify="right")
        table.add_column("after", justify="right")
        table.add_column("change", justify="right")
        for key in keys:
            b, a = before.get(key), after[key]
            change = f"{(a - b) * 100:+.1f} pts" if isinstance(b, float) else ""
            table.add_row(key, f"{b:.3f}" if isinstance(b, float) else "–", f"{a:.3f}", change)
        self.rich.print(table)
        self._line(f"[literl] run directory: {run_dir}   wall time: {wall_seconds / 60:.1f} min")
