"""`literl report --export DIR`: the report's tables as CSV (every number, for analysis) and LaTeX (booktabs
tabulars, formatted as in the report, for a paper); the figures are written by `plots.save_figure`.

    cells.csv / cells.tex               mean and 95% t interval over seeds, per (variant, scenario)
    comparisons.csv / comparisons.tex   paired Δ against the baseline per score: bootstrap and t intervals,
                                        verdict, s_d, minimum detectable effect, seeds needed
    per_run.csv / per_run.tex           each run's final / best / AUC
    missing_runs.csv                    runs left out of the statistics, with the reason (when there are any)
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Sequence

from literl.arena.stats import SCORES
from literl.data.files import write_text_atomic

SCORE_NAMES = {"final": "Final", "best": "Best", "auc": "AUC"}
LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: Any) -> str:
    return "".join(LATEX_SPECIAL.get(c, c) for c in str(text))


def _csv(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    return out.getvalue()


def _latex(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int, comment: str) -> str:
    """A booktabs tabular; cells are already LaTeX (escaped where they are text)."""
    spec = "l" * left + "r" * (len(header) - left)
    lines = [f"% {line}" for line in comment.splitlines()] + ["% needs \\usepackage{booktabs}",
                                                              f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
                                                              " & ".join(header) + " \\\\", "\\midrule"]
    lines += [" & ".join(row) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "--" if value is None else fmt.format(value).replace("-", "$-$")


def _pm(entry: dict) -> str:
    if entry["mean"] is None:
        return "--"
    half = entry.get("half_width")
    return _num(entry["mean"]) + (f" $\\pm$ {_num(half)}" if half is not None else "")


def cells_tables(summary: dict) -> tuple[str, str]:
    header = ["variant", "scenario", "n"] + [f"{s}_{part}" for s in SCORES for part in ("mean", "low", "high",
                                                                                          "half_width")]
    rows = [[c["variant"], c["scenario"], c["n"]] + [c[s][part] for s in SCORES for part in ("mean", "low", "high",
                                                                                           "half_width")]
            for c in summary["cells"]]
    tex_rows = [[latex_escape(c["variant"]), latex_escape(c["scenario"]), str(c["n"])] + [_pm(c[s]) for s in SCORES]
                for c in summary["cells"]]
    comment = (f"{summary['name'] or 'runs'}: {summary['metric']}, mean $\\pm$ half-width of the 95% Student-t "
               "interval over seeds")
    return _csv(header, rows), _latex(["Variant", "Scenario", "$n$"] + [SCORE_NAMES[s] for s in SCORES], tex_rows,
                                      left=2, comment=comment)


COMPARISON_FIELDS = ("n_pairs", "mean_diff", "ci_low", "ci_high", "t_ci_low", "t_ci_high", "verdict", "sd_diff",
                     "mde", "seeds_needed")


def comparisons_tables(summary: dict) -> tuple[str, str]:
    header = ["variant", "baseline", "scenario", "score", *COMPARISON_FIELDS]
    rows, tex_rows = [], []
    for comp in summary["comparisons"]:
        for score in SCORES:
            entry = comp[score]
            rows.append([comp["variant"], comp["baseline"], comp["scenario"], score,
                         *(entry.get(k) for k in COMPARISON_FIELDS)])
            ci = ("--" if entry["ci_low"] is None
                  else f"[{_num(entry['ci_low'], '{:+.3f}')}, {_num(entry['ci_high'], '{:+.3f}')}]")
            needed = entry.get("seeds_needed")
            tex_rows.append([latex_escape(comp["variant"]), latex_escape(comp["scenario"]), SCORE_NAMES[score],
                             str(entry["n_pairs"]), _num(entry["mean_diff"], "{:+.3f}"), ci,
                             latex_escape(entry["verdict"]), _num(entry.get("mde")),
                             "--" if needed is None else str(needed)])
    comment = (f"paired difference against the baseline '{summary['baseline']}' ({summary['metric']}): mean, 95% "
               "percentile bootstrap interval, verdict;\nMDE: minimum detectable effect at alpha 0.05 two-sided, "
               "power 80% (paired t); seeds: needed to detect the observed difference")
    return _csv(header, rows), _latex(["Variant", "Scenario", "Score", "Pairs", "$\\Delta$", "95\\% CI", "Verdict",
                                       "MDE", "Seeds"], tex_rows, left=3, comment=comment)


def per_run_tables(summary: dict) -> tuple[str, str]:
    header = ["variant", "scenario", "seed", *SCORES, "directory"]
    rows = [[r["variant"], r["scenario"], r["seed"], *(r[s] for s in SCORES), r["directory"]]
            for r in summary["per_run"]]
    tex_rows = [[latex_escape(r["variant"]), latex_escape(r["scenario"]), str(r["seed"]),
                 *(_num(r[s]) for s in SCORES)] for r in summary["per_run"]]
    return _csv(header, rows), _latex(["Variant", "Scenario", "Seed"] + [SCORE_NAMES[s] for s in SCORES], tex_rows,
                                      left=2, comment=f"each run's scores of {summary['metric']}")


def write_tables(summary: dict, directory: str | Path) -> list[Path]:
    """Every table of the report as CSV and LaTeX under `directory` (atomic writes); returns the paths."""
    directory = Path(directory)
    written = []
    tables = {"cells": cells_tables(summary), "per_run": per_run_tables(summary)}
    if summary["comparisons"]:
        tables["comparisons"] = comparisons_tables(summary)
    for name, (csv_text, tex_text) in tables.items():
        written += [write_text_atomic(directory / f"{name}.csv", csv_text),
                    write_text_atomic(directory / f"{name}.tex", tex_text)]
    missing = summary["runs"]["missing"]
    if missing:
        keys = ["variant", "scenario", "seed", "directory", "reason"]
        written.append(write_text_atomic(directory / "missing_runs.csv",
                                         _csv(keys, [[m[k] for k in keys] for m in missing])))
    return written
