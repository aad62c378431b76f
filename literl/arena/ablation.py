"""An ablation's output folder: its plan, its runs, its summary.json and report.html.

    <out>/plan.json                        the spec as run (preset, base, variants, scenarios, seeds) and
                                           every run's identity; checked when the ablation is resumed
    <out>/<variant>/<scenario>/seed_<s>/   one `literl train` run directory each (+ train.log)
    <out>/summary.json                     statistics (literl.arena.summary)
    <out>/report.html                      the report (literl.arena.report)

Resuming with a changed spec would mix runs of two experiments in one table, so `record_plan` refuses when
a run directory that already holds a run was planned with other overrides.
"""

from __future__ import annotations

import json
from pathlib import Path

from literl.arena.report import build_report
from literl.arena.runs import is_run_directory, load_run
from literl.arena.sequential import decisions, design_from_dict
from literl.arena.spec import AblationSpec, PlannedRun
from literl.arena.summary import summarize
from literl.data.files import write_json_atomic
from literl.config.errors import ConfigError

PLAN_FILE, SUMMARY_FILE, REPORT_FILE = "plan.json", "summary.json", "report.html"


def default_out_dir(spec: AblationSpec) -> Path:
    return Path("runs") / "ablations" / spec.name


def spec_info(spec: AblationSpec) -> dict:
    """The parts of a spec the report and a later `literl report` need (JSON-ready); `sequential` only for a
    spec run in waves, so a fixed-seed spec's plan and summary stay as they were."""
    info = {"name": spec.name, "description": spec.description, "paper_finding": spec.paper_finding,
            "preset": spec.preset, "base": list(spec.base), "baseline": spec.baseline, "metric": spec.metric,
            "metric_source": spec.metric_source, "mechanism": list(spec.mechanism), "seeds": spec.seeds,
            "source": spec.source,
            "variants": {v.name: {"preset": v.preset, "overrides": list(v.overrides)} for v in spec.variants},
            "scenarios": {s.name: {"overrides": list(s.overrides)} for s in spec.scenarios}}
    if spec.sequential is not None:
        info["sequential"] = spec.sequential.as_dict()
    return info


def record_plan(out_dir: Path, spec: AblationSpec, runs: list[PlannedRun]) -> None:
    """Write plan.json, after checking that no existing run directory belongs to a different experiment."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PLAN_FILE
    before = {}
    if path.is_file():
        before = {entry["directory"]: entry for entry in _read_plan(path)["runs"]}
    conflicts = []
    for run in runs:
        relative = str(run.directory.relative_to(out_dir))
        old = before.get(relative)
        if old is not None and is_run_directory(run.directory):
            old_identity = {k: old.get(k) for k in run.identity()}
            if old_identity != run.identity():
                changed = [k for k in run.identity() if old_identity[k] != run.identity()[k]]
                conflicts.append(f"{relative} (changed: {', '.join(changed)})")
    if conflicts:
        raise ConfigError(
            f"{out_dir} holds runs of a different version of this ablation: {'; '.join(conflicts[:5])}"
            f"{' …' if len(conflicts) > 5 else ''}. Their results would be mixed with the new ones. Use another "
            f"--out, or delete those run directories to rerun them.")
    entries = [{**run.identity(), "directory": str(run.directory.relative_to(out_dir))} for run in runs]
    write_json_atomic(path, {"spec": spec_info(spec), "runs": entries})


def load_plan(out_dir: Path) -> dict:
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        raise ConfigError(f"{out_dir} is not an ablation folder (no {PLAN_FILE}); pass run directories "
                          "or the --out folder of `literl ablate`")
    return _read_plan(path)


def _is_plan(plan) -> bool:
    spec, runs = (plan.get("spec"), plan.get("runs")) if isinstance(plan, dict) else (None, None)
    return (isinstance(spec, dict) and all(k in spec for k in ("name", "metric", "baseline", "variants", "scenarios"))
            and isinstance(runs, list)
            and all(isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("directory", "variant", "scenario"))
                    and isinstance(r.get("seed"), int) for r in runs))


def _read_plan(path: Path) -> dict:
    """plan.json as `record_plan` wrote it, or a ConfigError naming the damage and the fix."""
    try:
        plan = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        problem = "is not valid UTF-8"
    except json.JSONDecodeError as err:
        problem = f"is not valid JSON ({err})"
    else:
        if _is_plan(plan):
            return plan
        problem = "does not hold the spec and the runs an ablation writes there"
    raise ConfigError(f"{path} {problem}: it is damaged. The runs in {path.parent} are intact; to write the plan "
                      f"again, move it aside (mv {path} {path}.damaged) and run the same `literl ablate SPEC --out "
                      f"{path.parent}`, which keeps and resumes them")


def is_ablation_directory(path: str | Path) -> bool:
    return (Path(path) / PLAN_FILE).is_file()


def summarize_ablation(out_dir: str | Path, *, report: bool = True, report_path: str | Path | None = None,
                       export_dir: str | Path | None = None) -> dict:
    """Read every planned run, write summary.json (and report.html, or `report_path`; with `export_dir` the
    report's figures and tables as files), return the summary."""
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    info = plan["spec"]
    records, expected = [], []
    for entry in plan["runs"]:
        directory = out_dir / entry["directory"]
        expected.append((entry["variant"], entry["scenario"], entry["seed"], directory))
        if is_run_directory(directory):
            records.append(load_run(directory, variant=entry["variant"], scenario=entry["scenario"],
                                    seed=entry["seed"]))
    summary = summarize(records, metric=info["metric"], variants=list(info["variants"]),
                        scenarios=list(info["scenarios"]), baseline=info["baseline"], expected=expected,
                        name=info["name"], metric_source=info.get("metric_source", "eval"))
    summary["spec"] = info
    if info.get("sequential"):       # seeds in waves: what the design decided on the runs so far
        summary["sequential"] = decisions(summary, design_from_dict(info["sequential"]), info["seeds"],
                                          len(info["variants"]) * len(info["scenarios"]))
    write_json_atomic(out_dir / SUMMARY_FILE, summary)
    if report:
        build_report(report_path or out_dir / REPORT_FILE, records, summary, title=f"Ablation: {info['name']}",
                     spec_info=info, export_dir=export_dir)
    return summary
