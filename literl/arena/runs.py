"""Reading training runs back, only through the files of a run directory (docs/run-directory.md).

A `RunRecord` is one run directory labelled with its place in an ablation (variant, scenario, seed); plain
runs given to `literl report` are labelled by their directory name. Nothing here imports the trainer.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from literl.run.metrics_log import read_metrics

EVAL_FILE, METRICS_FILE = "eval.jsonl", "metrics.jsonl"
SUMMARY_FILE, DIAGNOSTICS_FILE, CONFIG_FILE = "summary.json", "diagnostics.json", "config.yaml"


def is_finished(run_dir: str | Path) -> bool:
    """A run is finished when the trainer wrote its summary.json (the last thing it writes) and it reads back as
    a JSON object. `literl report` and `literl ablate` both decide by this function, so they agree: a damaged
    summary.json is unfinished for both (the ablation resumes the run, which writes it again)."""
    return read_summary(run_dir)[0] is not None


def read_summary(run_dir: str | Path) -> tuple[dict | None, str | None]:
    """(summary, None) for a finished run, (None, None) when there is no summary.json, (None, why) when it is
    damaged."""
    return _read_json_object(Path(run_dir) / SUMMARY_FILE)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint (`checkpoints/latest` names it), or None.

    As for the trainer's resume (literl/run/checkpoint.py), `latest` counts only when it names a step_<n>
    folder of the run; otherwise the newest such folder does (a damaged pointer must not make the runner
    think the run has no checkpoint and clear it).
    """
    root = run_dir / "checkpoints"
    pointer = root / "latest"
    name = pointer.read_bytes().decode("utf-8", errors="replace").strip() if pointer.is_file() else ""
    if re.fullmatch(r"step_\d+", name) and (root / name).is_dir():
        return int(name[len("step_"):])
    steps = [int(p.name[len("step_"):]) for p in root.glob("step_*")
             if re.fullmatch(r"step_\d+", p.name) and p.is_dir()] if root.is_dir() else []
    return max(steps, default=None)


def is_run_directory(path: str | Path) -> bool:
    path = Path(path)
    return any((path / name).is_file() for name in (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE))


@dataclass
class RunRecord:
    directory: Path
    variant: str
    scenario: str
    seed: int
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    summary: dict | None = None
    diagnostics: dict | None = None
    damaged: dict[str, str] = field(default_factory=dict)     # file name → what is wrong with it

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def eval_curve(self, metric: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a held-out metric, one point per step (a rewritten step keeps its last value)."""
        return _curve(self.evals, metric)

    def metric_curve(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a per-step training metric; null (non-finite) values are left out."""
        return _curve(self.metrics, key)

    def metric_keys(self) -> set[str]:
        return {k for record in self.metrics for k in record if k != "step"}

    def eval_keys(self) -> set[str]:
        return {k for record in self.evals for k, v in record.items()
                if k not in ("step", "tag") and isinstance(v, (int, float))}


def _curve(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, float] = {}
    for record in records:
        value = record.get(key)
        step = _whole_number(record.get("step"))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and step is not None:
            by_step[step] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def load_run(directory: str | Path, *, variant: str | None = None, scenario: str = "run",
             seed: int | None = None) -> RunRecord:
    """Read what a run directory holds so far (an unfinished run gives what it has logged)."""
    directory = Path(directory)
    summary, summary_problem = read_summary(directory)
    diagnostics, diagnostics_problem = _read_json_object(directory / DIAGNOSTICS_FILE)
    damaged = {name: problem for name, problem in ((SUMMARY_FILE, summary_problem),
                                                   (DIAGNOSTICS_FILE, diagnostics_problem)) if problem}
    if diagnostics_problem:     # a damaged summary.json is named where the run is counted missing
        warnings.warn(f"{directory / DIAGNOSTICS_FILE} is {diagnostics_problem}: the report's mechanism sections "
                      f"leave this run out. Resuming the run from its last checkpoint (trainer.resume=true, or "
                      f"rerunning the ablation after deleting its {SUMMARY_FILE}) writes it again", UserWarning,
                      stacklevel=2)
    if seed is None:
        seed = _whole_number((summary or {}).get("seed"))
        seed = _seed_from_config(directory) if seed is None else seed
    return RunRecord(directory=directory, variant=variant or directory.name, scenario=scenario, seed=seed,
                     metrics=read_metrics(directory, METRICS_FILE), evals=read_metrics(directory, EVAL_FILE),
                     summary=summary, diagnostics=diagnostics, damaged=damaged)


def _read_json_object(path: Path) -> tuple[dict | None, str | None]:
    """(object, None); (None, None) when the file is absent; (None, why) when it is not one JSON object in UTF-8
    (cut short by a crash, or damaged on disk)."""
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not valid UTF-8"
    except (json.JSONDecodeError, RecursionError) as err:
        return None, f"not valid JSON ({err})" if isinstance(err, json.JSONDecodeError) else "not valid JSON"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    return data, None


def _whole_number(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():      # finite and whole (1e400 is inf: refused)
        return int(value)
    return None


def _seed_from_config(directory: Path) -> int:
    import yaml

    path = directory / CONFIG_FILE
    if not path.is_file():
        return 0
    try:
        return _whole_number((yaml.safe_load(path.read_bytes().decode("utf-8")) or {}).get("seed", 0)) or 0
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
        return 0
