"""Metrics written to metrics.jsonl, eval.jsonl, samples.jsonl and the trackers (how a step's values are combined
from its micro-batches: `literl.algorithm.metric_reduction`)."""

from __future__ import annotations

import json
import math
import os
import secrets
import string
import warnings
from pathlib import Path

from literl.data.files import write_text_atomic
from literl.data.no_follow import open_append


def _finite(value: float) -> float | None:
    # JSON has no NaN/inf; a non-finite metric is written as null so the file stays parseable.
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


class MetricsLog:
    """metrics.jsonl (always) plus TensorBoard / wandb when asked. One JSON object per step."""

    def __init__(self, run_dir: Path, trackers: list[str], config: dict, *, run_name: str):
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.eval_path = run_dir / "eval.jsonl"
        self._tb = self._wandb = None
        if "tensorboard" in trackers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError("trainer.trackers has tensorboard but it is not installed: "
                                   "pip install 'literl[tensorboard]'") from err
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            self._tb_dir = run_dir / "tensorboard"
        if "wandb" in trackers:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError("trainer.trackers has wandb but it is not installed: pip install 'literl[wandb]'") from err
            # The run id lives in the run directory, so a resumed run continues the same wandb run instead of
            # opening a second one (as TensorBoard continues its event files).
            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "literl"), name=run_name,
                                     config=config, dir=str(run_dir), id=wandb_run_id(run_dir), resume="allow")

    def truncate_after(self, step: int, *, retag_evaluations: dict[str, str | None] | None = None) -> None:
        """Drop records past `step` (a resumed run rewrites what came after its checkpoint). Evaluation records
        whose tag is a key of `retag_evaluations` get the new tag, or are dropped where it is None (the
        resumed run writes them again)."""
        retag = retag_evaluations or {}
        if self._tb is not None:
            # TensorBoard keeps every event it was sent: reopen so that the steps redone after `step` replace
            # the old ones instead of being drawn twice.
            from torch.utils.tensorboard import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self._tb_dir), purge_step=step + 1)
        for path in (self.path, self.samples_path, self.eval_path):
            if not path.exists():
                continue
            kept = []
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue   # a line cut short by a crash
                if _record_problem(record):
                    continue   # a damaged line (read_metrics skips it too, with a warning)
                if record.get("step", 0) > step:
                    continue
                if path == self.eval_path and record.get("tag") in retag:
                    if retag[record["tag"]] is None:
                        continue
                    line = json.dumps({**record, "tag": retag[record["tag"]]})
                kept.append(line)
            write_text_atomic(path, "".join(k + "\n" for k in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _finite(v) for k, v in sorted(metrics.items())}}
        with open_append(self.path) as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if _finite(value) is not None:
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def log_eval(self, step: int, tag: str, results: dict[str, float]) -> None:
        """One record per evaluation: {"step", "tag", "<benchmark>/<metric>": value, ...}."""
        with open_append(self.eval_path) as f:
            f.write(json.dumps({"step": step, "tag": tag, **{k: _finite(v) if isinstance(v, float) else v
                                                             for k, v in results.items()}}) + "\n")
        if self._tb is not None:
            for key, value in results.items():
                if isinstance(value, (int, float)) and _finite(value) is not None:
                    self._tb.add_scalar(f"eval/{key}", value, step)
        if self._wandb is not None:
            self._wandb.log({f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))}, step=step)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with open_append(self.samples_path) as f:
            for sample in samples:
                f.write(json.dumps({"step": step, **sample}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


WANDB_ID_FILE = Path("wandb") / "literl-run-id"


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of this run directory: the one stored by its first session, else $WANDB_RUN_ID or a
    fresh 8-character id, stored in <run>/wandb/literl-run-id for the sessions that resume it."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    alphabet = string.ascii_lowercase + string.digits
    run_id = os.environ.get("WANDB_RUN_ID") or "".join(secrets.choice(alphabet) for _ in range(8))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, run_id + "\n")
    return run_id


def read_metrics(run_dir: str | Path, name: str = "metrics.jsonl") -> list[dict]:
    """All records of a run's metrics.jsonl (or eval.jsonl), skipping a line cut short by a crash; a line that is
    not UTF-8, not a JSON object, or whose "step" is not a whole number (a damaged or hand-edited file) is skipped
    too, with a warning naming the file, the lines and the fix."""
    path = Path(run_dir) / name
    out = []
    damaged: dict[str, list[int]] = {}
    for number, raw in enumerate(path.read_bytes().splitlines() if path.exists() else [], start=1):
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            damaged.setdefault("not valid UTF-8", []).append(number)
            continue
        except (json.JSONDecodeError, RecursionError):
            continue
        problem = _record_problem(record)
        if problem:
            damaged.setdefault(problem, []).append(number)
        else:
            out.append(record)
    for problem, numbers in damaged.items():
        lines = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
        warnings.warn(f"{path}, line {lines}: {problem}; skipped {len(numbers)} line(s) of it (the file was damaged "
                      f"or edited; resuming the run from a checkpoint before those steps writes them again)",
                      UserWarning, stacklevel=2)
    return out


def _record_problem(record) -> str | None:
    """Why a parsed line is not a record literl wrote: every record is an object with a whole, finite "step"."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    step = record.get("step")
    if isinstance(step, bool) or not (isinstance(step, int) or (isinstance(step, float) and step.is_integer())):
        return f"\"step\" is {json.dumps(step)}, not a whole number"
    return None
