"""What a person watching a run sees: a progress bar with ETA and key metrics, evaluations, a summary.

On a terminal this is a rich progress bar; when output is captured (CI, the ablation runner, a log file) or
`trainer.progress=false`, it prints one plain line every few steps instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

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


class Console:
    def __init__(self, progress_bar: bool = True, *, stream=None, plain_every: int = 10, enabled: bool = True):
        self.rich = RichConsole(file=stream or sys.stderr)
        self.interactive = enabled and progress_bar and self.rich.is_terminal
        self.enabled = enabled
        self.plain_every = plain_every
        self._progress: Progress | None = None
        self._task = None
        self._started = time.perf_counter()

    def start(self, total: int, done: int = 0) -> None:
        self._started = time.perf_counter()
        self._total = total
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"),
                console=self.rich, transient=False)
            self._progress.start()
            self._task = self._progress.add_task("train", total=total, completed=done, metrics="")

    def update(self, step: int, metrics: dict) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, metrics=_fmt(metrics))
        elif self.enabled and (step % self.plain_every == 0 or step == self._total or step == 1):
            elapsed = time.perf_counter() - self._started
            self.rich.print(f"step {step}/{self._total}  {_fmt(metrics)}  [{elapsed:.0f}s]", highlight=False,
                            markup=False)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, text: str) -> None:
        if self.enabled:
            self.rich.print(f"[literl] {text}", highlight=False, markup=False)

    def note_eval(self, tag: str, step: int, results: dict) -> None:
        if not self.enabled:
            return
        shown = ", ".join(f"{k} {v:.3f}" for k, v in results.items()
                          if isinstance(v, float) and ("accuracy" in k))
        self.rich.print(f"[literl] eval {tag} (step {step}): {shown}", highlight=False, markup=False)

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
        self.rich.print(f"[literl] run directory: {run_dir}   wall time: {wall_seconds / 60:.1f} min", highlight=False,
                        markup=False)
