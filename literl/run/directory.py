"""The run directory of `literl train`: claimed and locked for one writer, checked before anything slow loads (a
folder literl did not write is refused, a finished run is not silently redone, a resumed run's config is compared
with the saved one), its config and run record written atomically, and `runs/latest` pointed at it."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path

from literl.config.schema import Config
from literl.config.load import from_yaml_file, to_yaml
from literl.data.files import write_text_atomic
from literl.config.errors import ConfigError
from literl.run.lock import LOCK_NAME, DirectoryLock
from literl.run.checkpoint import checkpoint_candidates, remove_stale_temporaries
from literl.run.console import Console
from literl.run.manifest import Inputs, config_header, write_run_record


def claim_run_dir(cfg: Config, console: Console) -> tuple[Path, DirectoryLock, bool]:
    """The run directory, locked for this process (one writer per run) and checked (before anything slow loads);
    also whether this call created it."""
    if cfg.trainer.output_dir:
        run_dir = Path(cfg.trainer.output_dir)
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{cfg.preset or 'custom'}-{stamp}"
    _refuse_a_folder_that_is_not_a_run(run_dir, cfg)      # before the lock: its file would change the folder
    created = not run_dir.exists()
    lock = DirectoryLock(run_dir).acquire()
    try:
        _check_run_dir(run_dir, cfg, console)
        removed = remove_stale_temporaries(run_dir)     # under the lock: no other process is writing them
    except BaseException:
        give_up_run_dir(run_dir, lock, created)
        raise
    if removed:
        console.note(f"removed {len(removed)} unfinished temporary file(s) left by an interrupted save: "
                     + ", ".join(str(p.relative_to(run_dir)) for p in removed[:3]) + (" …" if len(removed) > 3 else ""))
    return run_dir, lock, created


def give_up_run_dir(run_dir: Path, lock: DirectoryLock, created: bool) -> None:
    """A start that failed leaves the directory as it found it (a directory it created is removed when empty)."""
    lock.release()
    if created:
        try:
            (run_dir / LOCK_NAME).unlink(missing_ok=True)
            run_dir.rmdir()
        except OSError:
            pass        # something else was written there: keep it


# Names that only literl writes into a run directory (train.log: an ablation's console output, written before the
# run's first start): a folder holding none of them is not a run, whatever else it holds.
RUN_MARKERS = ("config.yaml", "run.json", "metrics.jsonl", "checkpoints", "summary.json", "final", "train.log")


def _refuse_a_folder_that_is_not_a_run(run_dir: Path, cfg: Config) -> None:
    """A non-empty folder that literl did not write is the user's: training (or "resuming") into it would mix a run
    into their files, and cleaning a run's leftovers there could delete theirs."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"trainer.output_dir={run_dir} is a file, not a folder; choose a new or empty "
                              "folder (the file was not changed)")
    if not run_dir.is_dir() or any((run_dir / name).exists() for name in RUN_MARKERS):
        return
    entries = sorted(entry.name for entry in run_dir.iterdir() if entry.name != LOCK_NAME)
    if entries:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        why = "trainer.resume=true continues a run that literl wrote there. " if cfg.trainer.resume else ""
        raise FileExistsError(
            f"trainer.output_dir={run_dir} is not empty and is not a literl run (it holds {shown}; a run has "
            f"config.yaml, run.json, metrics.jsonl or checkpoints/). {why}Choose a new or empty "
            "trainer.output_dir (nothing there was changed).")


def _check_run_dir(run_dir: Path, cfg: Config, console: Console) -> None:
    """Refuse a directory that holds a run unless resuming, and a resume that would redo a finished run."""
    config_path = run_dir / "config.yaml"
    # A lone config.yaml (+ run.json) is what a start that failed while loading left behind.
    if run_dir.exists() and any(entry.name not in ("config.yaml", "run.json", LOCK_NAME)
                                for entry in run_dir.iterdir()):
        if not cfg.trainer.resume:
            raise FileExistsError(
                f"run directory {run_dir} already holds a run. Continue it with trainer.resume=true, or choose "
                f"another trainer.output_dir (nothing there was changed).")
        finished = [name for name in ("summary.json", "final") if (run_dir / name).exists()]
        if finished and not checkpoint_candidates(run_dir):
            raise FileExistsError(
                f"run directory {run_dir} holds a finished run ({' and '.join(finished)}) whose checkpoints were "
                "deleted, so it cannot be continued: resuming would retrain from step 0 and overwrite final/. "
                "Start a new run in another trainer.output_dir (nothing there was changed).")
        if config_path.exists():
            try:
                saved = from_yaml_file(config_path)
            except ConfigError as err:
                console.note(f"not comparing with the saved config: {err}")
            else:
                _warn_config_changes(saved, cfg, console)


def write_run_config(run_dir: Path, cfg: Config, inputs: Inputs, engine) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", config_header(inputs) + to_yaml(cfg))
    # An engine in its own process and environment (vLLM) reports its own versions: the trainer's are not its.
    info = getattr(getattr(engine, "process", None), "info", None) or {}
    write_run_record(run_dir, inputs, resume=cfg.trainer.resume,
                     engine={"name": cfg.rollout.engine, **{k: v for k, v in info.items() if k != "pid"}})
    if not cfg.trainer.output_dir:
        _point_latest(run_dir)


def _point_latest(run_dir: Path) -> None:
    link = run_dir.parent / "latest"
    try:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(run_dir.name)
    except OSError:
        pass    # a convenience only (e.g. filesystems without symlinks)


def _warn_config_changes(old: Config, new: Config, console: Console) -> None:
    old_d, new_d = _flatten(_as_dict(old)), _flatten(_as_dict(new))
    ignored = ("trainer.resume", "trainer.steps", "trainer.progress", "trainer.output_dir", "trainer.threads",
               "trainer.compile", "eval.", "cluster.", "trainer.log_every")
    changed = [k for k in sorted(set(old_d) | set(new_d))
               if old_d.get(k) != new_d.get(k) and not k.startswith(ignored)]
    if changed:
        console.note("resuming with a config that differs from the saved one in: " + ", ".join(changed))


def _as_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in ("params",):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
