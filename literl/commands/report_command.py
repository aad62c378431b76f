"""`literl report DIR...`: build report.html from an ablation folder (also rewriting its summary.json) or
from plain run directories (one page comparing them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
examples:
  literl report runs/ablations/advantage_norm     # the ablation's summary.json and report.html, rebuilt
  literl report runs/lite_ppo-20260101-120000     # one run: RUN/report.html
  literl report runs/a runs/b --out compare.html  # several runs side by side
  literl report runs/ablations/clip_higher --export paper/   # + figures (PDF, SVG, PNG), tables (CSV, LaTeX)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="ablation folders or run directories")
    parser.add_argument("--out", help="report file (default: DIR/report.html for one folder, else ./report.html)")
    parser.add_argument("--export", metavar="EXPORT_DIR", default=None,
                        help="also write every figure as PDF, SVG and PNG and every table as CSV and LaTeX "
                             "(booktabs) into this folder")
    parser.add_argument("--metric", default=None,
                        help="held-out key to score plain runs by (default: testbed/accuracy, or the first "
                             "*/accuracy key in their eval.jsonl)")


def run(args: argparse.Namespace) -> int:
    from literl.arena.ablation import is_ablation_directory, summarize_ablation
    from literl.arena.runs import is_run_directory
    from literl.arena.summary import print_summary
    from rich.console import Console

    export_problem = _export_problem(args.export)
    if export_problem:
        print(f"literl report: {export_problem}", file=sys.stderr)
        return 2
    dirs = [Path(d) for d in args.dirs]
    unknown = [d for d in dirs if not is_ablation_directory(d) and not is_run_directory(d)]
    if unknown:
        print(f"literl report: {unknown[0]} is neither a run directory (config.yaml, metrics.jsonl or "
              "summary.json) nor an ablation folder (plan.json)", file=sys.stderr)
        return 2
    ablations = [d for d in dirs if is_ablation_directory(d)]
    if ablations and len(dirs) > 1:
        print("literl report: give one ablation folder at a time (or only run directories)", file=sys.stderr)
        return 2
    console = Console()
    if ablations:
        report = Path(args.out) if args.out else ablations[0] / "report.html"
        print_summary(summarize_ablation(ablations[0], report_path=report, export_dir=args.export), console)
    else:
        report = Path(args.out) if args.out else (dirs[0] / "report.html" if len(dirs) == 1 else Path("report.html"))
        print_summary(report_runs(dirs, report, metric=args.metric, export_dir=args.export), console)
    console.print(f"report: {report}", highlight=False, markup=False)
    if args.export:
        files = sorted(p.name for p in Path(args.export).iterdir() if p.is_file())
        console.print(f"exported to {args.export}: {', '.join(files)}", highlight=False, markup=False)
    return 0


def _export_problem(export: str | None) -> str | None:
    """Why --export cannot be the folder the figures and tables go to (checked before anything is read)."""
    if export is None:
        return None
    path = Path(export)
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                return (f"--export {export}: {folder} is a file, not a folder; name a folder (it is created when "
                        f"missing) to hold the figures and tables")
            break
    return None


def report_runs(dirs: list[Path], report: Path, *, metric: str | None = None,
                export_dir: str | Path | None = None) -> dict:
    """One report for plain runs, each its own 'variant' labelled by the shortest distinguishing path."""
    from literl.arena.report import build_report
    from literl.arena.runs import load_run
    from literl.arena.summary import summarize

    labels = _labels(dirs)
    records = [load_run(d, variant=label, scenario="run") for d, label in zip(dirs, labels)]
    metric = metric or _default_metric(records)
    summary = summarize(records, metric=metric, variants=labels, scenarios=["run"], name="runs")
    title = f"Run report: {labels[0]}" if len(labels) == 1 else f"Run report: {len(labels)} runs"
    build_report(report, records, summary, title=title, export_dir=export_dir)
    return summary


def _labels(dirs: list[Path]) -> list[str]:
    """Directory names, lengthened with parent folders until they are unique (seed_0 → lite/seed_0)."""
    for depth in range(1, 1 + max(len(d.resolve().parts) for d in dirs)):
        labels = ["/".join(d.resolve().parts[-depth:]) for d in dirs]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]


def _default_metric(records) -> str:
    keys = set().union(*(r.eval_keys() for r in records)) if records else set()
    if "testbed/accuracy" in keys or not keys:
        return "testbed/accuracy"
    accuracy = sorted(k for k in keys if k.endswith("/accuracy"))
    return accuracy[0] if accuracy else sorted(keys)[0]
