"""Build progress: a rich progress bar (phase, step, loss, ETA) on stderr, or silence.

When stderr is not a terminal (a log file, CI), a live bar shows nothing until it stops, so a plain line
is printed every tenth of a phase instead."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

REFRESH_EVERY_STEPS = 5   # updating the bar every step would cost more than the tiny model's step
LOG_LINES_PER_PHASE = 10  # without a terminal


class BuildProgress:
    """Reports build phases; with `enabled=False` every method is a no-op."""

    def __init__(self, title: str, *, enabled: bool = True):
        self.enabled = enabled
        self.title = title
        self._console = Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        self._started = time.monotonic()

    def __enter__(self) -> "BuildProgress":
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self._console,
            )
            self._progress.start()
            self.note(f"building testbed {self.title} (first use only; later runs load it from the cache)")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, description: str, total_steps: int) -> None:
        """Start a new bar for a training phase of `total_steps` steps."""
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.update(self._task, visible=False)
        self._task = self._progress.add_task(description, total=total_steps, loss="-")
        self._phase_started = time.monotonic()

    def step(self, step: int, loss: float) -> None:
        if self._progress is None or self._task is None:
            return
        task = self._progress.tasks[-1]
        if step % REFRESH_EVERY_STEPS == 0 or step == task.total:
            self._progress.update(self._task, completed=step, loss=f"{loss:.3f}")
        every = max(1, int(task.total or 1) // LOG_LINES_PER_PHASE)
        if not self._console.is_terminal and (step % every == 0 or step == task.total):
            spent = time.monotonic() - self._phase_started
            remaining = spent / max(step, 1) * (int(task.total or step) - step)
            self.note(f"{task.description} {step}/{int(task.total or step)} loss {loss:.3f} "
                      f"({spent:.0f} s, ~{remaining:.0f} s left)")

    def note(self, message: str) -> None:
        """A log line above the bar."""
        if self._progress is not None:
            self._progress.console.print(f"[dim]literl testbed[/dim] {message}", highlight=False)

    def elapsed(self) -> float:
        return time.monotonic() - self._started
