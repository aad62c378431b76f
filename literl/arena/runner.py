"""Running an ablation's planned runs as ordinary `literl train` subprocesses, resumably.

* Each run lives in its own directory (`<out>/<variant>/<scenario>/seed_<s>/`) with its output in
  `train.log` there. A run with summary.json is finished and skipped; one with a checkpoint is resumed
  (`trainer.resume=true`); one without is restarted from scratch (its partial logs are cleared, the log
  file is kept and appended to).
* `jobs` runs at a time, each with `threads // jobs` torch threads (`trainer.threads=`), so parallel runs
  do not oversubscribe the cores. With device groups (`--gpus-per-run`, literl.arena.devices) each run gets a
  free group as its `CUDA_VISIBLE_DEVICES`, and a run waits until a group is free.
* Children run in their own session, so Ctrl-C reaches only the runner: it stops launching and sends each
  child one SIGTERM, on which the trainer finishes its step, saves a checkpoint and exits; a second Ctrl-C
  kills them (the last complete checkpoint stays usable). On Linux a child also gets SIGTERM if the runner
  itself dies.
* A failed run is reported with its log and the others continue.

The runner never imports `literl.algorithm.tricks`: a run is its command line.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from literl.arena.runs import METRICS_FILE, SUMMARY_FILE, checkpoint_step, is_finished, read_summary
from literl.arena.spec import PlannedRun
from literl.arena.summary import LOG_NAME
from literl.data.no_follow import LinkRefused, open_append
from literl.run.provenance import available_cpus

POLL_SECONDS = 0.2
INTERRUPTED_EXIT = 130
# What a run that crashed before its first checkpoint leaves behind; cleared before it restarts.
TRAINER_OUTPUTS = ("config.yaml", "run.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "diagnostics.json",
                   "checkpoints", "final", "tensorboard", "wandb")


@dataclass
class Outcome:
    """What one `run_ablation` call did."""

    finished: list[PlannedRun] = field(default_factory=list)    # completed in this call
    skipped: list[PlannedRun] = field(default_factory=list)     # already finished before
    failed: list[tuple[PlannedRun, int]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_EXIT if self.interrupted else (1 if self.failed else 0)


@dataclass
class _Active:
    run: PlannedRun
    process: subprocess.Popen
    log: object
    started: float
    total_steps: int
    task: object = None
    devices: tuple[str, ...] | None = None


def threads_per_run(jobs: int, threads: int | None = None) -> int:
    """Torch threads for each of `jobs` parallel runs sharing `threads` cores (default: the CPUs this process
    may use)."""
    total = threads or available_cpus()
    return max(1, total // max(1, jobs))


def prepare_directory(run: PlannedRun) -> int:
    """Make the run's directory ready to launch into; returns the step it will resume from. A damaged summary.json
    (the run counts as unfinished, `is_finished`) is kept beside as summary.json.damaged: the resumed run writes a
    new one from its last checkpoint."""
    run.directory.mkdir(parents=True, exist_ok=True)
    if read_summary(run.directory)[1]:
        os.replace(run.directory / SUMMARY_FILE, run.directory / (SUMMARY_FILE + ".damaged"))
    step = checkpoint_step(run.directory)
    if step is not None:
        return step
    for name in TRAINER_OUTPUTS:     # no checkpoint: what was logged cannot be continued, so start clean
        path = run.directory / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return 0


def steps_logged(run_dir: Path) -> int:
    """The last step in metrics.jsonl (0 when none), read from the file's tail."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError, OverflowError):
            continue     # the chunk's first line may be cut, the last one half written, a damaged one anything
    return 0


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the runner dies, so no orphan keeps training."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1 (Linux)
    except (AttributeError, OSError):
        pass


class AblationRunner:
    """Launches the planned runs `jobs` at a time and shows overall progress (runs done, steps, ETA)."""

    def __init__(self, runs: list[PlannedRun], total_steps: dict[Path, int], *, jobs: int = 1,
                 threads: int | None = None, console=None, python: str = sys.executable,
                 device_groups: list[tuple[str, ...]] | None = None):
        from rich.console import Console

        self.runs = runs
        self.total_steps = total_steps
        self.device_groups = device_groups      # None: runs see the devices the runner sees
        self.jobs = max(1, min(jobs, len(device_groups)) if device_groups else jobs)
        self.threads = threads_per_run(self.jobs, threads)
        self.console = console or Console(stderr=True)
        self.python = python
        self.outcome = Outcome()
        self.active: list[_Active] = []
        self._stop_signals = 0

    # ------------------------------------------------------------------------------------------ main loop
    def run(self) -> Outcome:
        pending = [r for r in self.runs if not is_finished(r.directory)]
        self.outcome.skipped = [r for r in self.runs if is_finished(r.directory)]
        for run in pending:
            problem = read_summary(run.directory)[1]
            if problem:
                self.console.print(f"\\[arena] {self._name(run)}: its {SUMMARY_FILE} is damaged ({escape(problem)}); "
                                   f"resuming the run to write it again (the old file is kept as "
                                   f"{SUMMARY_FILE}.damaged)", highlight=False)
        if self.outcome.skipped:
            self.console.print(f"\\[arena] {len(self.outcome.skipped)} of {len(self.runs)} runs already finished: "
                               "skipped", highlight=False)
        previous = self._install_signal_handlers()
        try:
            with self._progress() as progress:
                self._loop(pending, progress)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.outcome

    def _loop(self, pending: list[PlannedRun], progress) -> None:
        self._overall = progress.add_task("ablation", total=sum(self.total_steps.get(r.directory, 1)
                                                                 for r in self.runs),
                                          completed=self._steps_done_before(), detail=self._detail())
        while (pending and not self._stop_signals) or self.active:
            while pending and not self._stop_signals and len(self.active) < self.jobs:
                self._launch(pending.pop(0), progress)
            time.sleep(POLL_SECONDS)
            self._poll(progress)
        if self._stop_signals:
            self.outcome.interrupted = True

    def _steps_done_before(self) -> int:
        return sum(self.total_steps.get(r.directory, 1) for r in self.outcome.skipped)

    def _detail(self) -> str:
        done = len(self.outcome.skipped) + len(self.outcome.finished)
        failed = f", {len(self.outcome.failed)} failed" if self.outcome.failed else ""
        return f"{done}/{len(self.runs)} runs{failed}"

    def _progress(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                        console=self.console, speed_estimate_period=3600, transient=False)

    # ------------------------------------------------------------------------------------------ children
    def _launch(self, run: PlannedRun, progress) -> None:
        start_step = prepare_directory(run)
        command = run.command(self.python, self.threads)
        try:
            log = open_append(run.directory / LOG_NAME)
        except LinkRefused as err:      # a link planted as train.log: this run fails, the others still start
            self.outcome.failed.append((run, -1))
            self.console.print(f"\\[arena] [bold red]FAILED[/] {self._name(run)}: {escape(str(err))}", highlight=False)
            return
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} literl ablate: {' '.join(command)}\n")
        log.flush()
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
               "TOKENIZERS_PARALLELISM": "false"}
        devices = self._free_devices()
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        try:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as err:     # e.g. the interpreter is gone: this run fails, the others may still start
            log.write(f"could not start the run: {err}\n")
            log.close()
            self.outcome.failed.append((run, -1))
            self.console.print(f"\\[arena] [bold red]FAILED[/] {self._name(run)}: could not start "
                               f"({escape(str(err))})", highlight=False)
            return
        total = self.total_steps.get(run.directory, 1)
        active = _Active(run, process, log, time.perf_counter(), total, devices=devices)
        active.task = progress.add_task(f"  {self._name(run)}", total=total, completed=start_step,
                                        detail="steps")
        self.active.append(active)
        resumed = f" (resuming at step {start_step})" if start_step else ""
        on = f" on GPU {','.join(devices)}" if devices is not None else ""
        self.console.print(f"\\[arena] started {self._name(run)}{on}{resumed}", highlight=False)

    def _free_devices(self) -> tuple[str, ...] | None:
        """The first device group no active run holds (jobs <= groups, so one is free when a run launches)."""
        if not self.device_groups:
            return None
        taken = {a.devices for a in self.active}
        return next(group for group in self.device_groups if group not in taken)

    def _poll(self, progress) -> None:
        overall = self._steps_done_before() + sum(self.total_steps.get(r.directory, 1)
                                                  for r in self.outcome.finished)
        for active in list(self.active):
            done = min(steps_logged(active.run.directory), active.total_steps)
            code = active.process.poll()
            if code is None:
                progress.update(active.task, completed=done)
                overall += done
                continue
            active.log.close()
            self.active.remove(active)
            progress.remove_task(active.task)
            self._on_exit(active, code)
            if active.run in self.outcome.finished:
                overall += active.total_steps
        progress.update(self._overall, completed=overall, detail=self._detail())

    def _on_exit(self, active: _Active, code: int) -> None:
        name, seconds = self._name(active.run), time.perf_counter() - active.started
        if code == 0 and is_finished(active.run.directory):
            self.outcome.finished.append(active.run)
            self.console.print(f"\\[arena] [green]finished[/] {name} in {seconds:.0f} s", highlight=False)
        elif self._stop_signals:
            self.console.print(f"\\[arena] stopped {name} (exit {code}); it resumes from its checkpoint when the "
                               "ablation is run again", highlight=False)
        else:
            self.outcome.failed.append((active.run, code))
            log = active.run.directory / LOG_NAME
            self.console.print(f"\\[arena] [bold red]FAILED[/] {name} (exit code {code}) after {seconds:.0f} s; "
                               f"full log: {escape(str(log))}", highlight=False)
            for line in _tail(log, 8):
                self.console.print(f"    {line}", highlight=False, markup=False)

    @staticmethod
    def _name(run: PlannedRun) -> str:
        return f"{run.variant}/{run.scenario}/seed_{run.seed}"

    # ------------------------------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> dict:
        try:
            return {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:      # not the main thread: the caller owns signals
            return {}

    def _request_stop(self, signum, frame) -> None:
        self._stop_signals += 1
        if self._stop_signals == 1:
            self.console.print("\n\\[arena] stopping: no new runs; each running run saves a checkpoint and exits "
                               "(Ctrl-C again to kill them now). Rerun the same command to continue.",
                               highlight=False)
        for active in self.active:
            if active.process.poll() is None:
                active.process.send_signal(signal.SIGTERM if self._stop_signals == 1 else signal.SIGKILL)


def _tail(path: Path, n: int) -> list[str]:
    if not path.is_file():
        return []
    return path.read_text(errors="replace").splitlines()[-n:]


def run_ablation(runs: list[PlannedRun], total_steps: dict[Path, int], *, jobs: int = 1,
                 threads: int | None = None, console=None,
                 device_groups: list[tuple[str, ...]] | None = None) -> Outcome:
    """Run every planned run that is not finished yet; see the module docstring."""
    return AblationRunner(runs, total_steps, jobs=jobs, threads=threads, console=console,
                          device_groups=device_groups).run()
