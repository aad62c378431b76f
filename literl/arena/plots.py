"""Learning-curve figures for the report, sized and styled for print (a paper's text width), as matplotlib
Figures: the report embeds them as PNG data URIs, `literl report --export` also writes PDF and SVG.

One figure is a grid: a row per metric and a column per scenario (with one scenario the metrics wrap into
SINGLE_SCENARIO_COLUMNS columns), a line per variant. A dense metric's line is the mean over seeds at each
step with a band from the lowest to the highest seed; training metrics are smoothed per seed with an
exponential moving average (TRAIN_SMOOTHING; the LitePPO paper smooths with 0.8 over 500 steps, our runs
are a few dozen steps); held-out curves are not smoothed. A sparse metric (logged at fewer than
SPARSE_FRACTION of a run's steps, e.g. repetition among truncated responses, which needs a truncated
response) is drawn as its raw points, one marker per seed and step: smoothing or joining its gaps would
invent a saw-tooth.

For print: panels of PANEL_SIZE inches with FONT_PT-point text at 100% scale, so a three-column figure fits a
6.6-inch text width without shrinking; every axis is labelled with its unit; colours are the Okabe-Ito
palette (distinguishable with the common colour-vision deficiencies) and each variant also has its own line
style and marker, so overlapping bands stay apart in greyscale too. A panel without signal in any run
(always exactly 0, or constant up to float noise: a range below NOISE_TOLERANCE of its magnitude, e.g.
1 ± 1e-14, or never above the panel's own floor, e.g. float32 rounding between engine and trainer) is not
drawn; `CurvesFigure.folded` says which and why.
"""

from __future__ import annotations

import base64
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, ScalarFormatter

from literl.arena.runs import RunRecord
from literl.data.files import write_atomic

TRAIN_SMOOTHING = 0.6
PNG_DPI = 200                      # the report's embedded images; exports also write vector PDF and SVG
PANEL_SIZE = (2.2, 1.8)            # inches per panel: three columns fit a 6.6-inch text width at 100%
FONT_PT = {"title": 9.0, "label": 8.5, "tick": 8.0, "legend": 9.0}
SINGLE_SCENARIO_COLUMNS = 3
MAX_PANELS = 60                    # a report of plain runs with many tiers must not make an unreadable giant
SPARSE_FRACTION = 0.5
NOISE_TOLERANCE = 1e-9
STEP_LABEL = "training step"
# Okabe & Ito (2008), "Color Universal Design": blue, vermillion, bluish green, orange, reddish purple, sky
# blue, black, yellow (yellow last: it is faint on white).
OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"]
LINE_STYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none", "font.family": "DejaVu Sans"}


@dataclass(frozen=True)
class Panel:
    """One metric row: what to read from a run, and how to label it (`unit` becomes the y-axis label)."""

    key: str
    title: str
    unit: str = ""
    source: str = "metrics"     # "metrics" (metrics.jsonl, smoothed) or "eval" (eval.jsonl, raw)
    # A magnitude this metric never exceeds without a real cause, and that cause's name: e.g. the training–
    # inference log-ratio of an engine computing in the trainer's float32 is rounding, |d| ~ 1e-6.
    floor: float = 0.0
    floor_cause: str = ""


@dataclass(frozen=True)
class Style:
    color: str
    linestyle: str
    marker: str


@dataclass
class CurvesFigure:
    """A drawn figure (None when no panel had signal) and what was left out of it, and why."""

    figure: Figure | None
    folded: list[str] = field(default_factory=list)
    panels: list[Panel] = field(default_factory=list)
    sparse: list[Panel] = field(default_factory=list)      # drawn as points

    @property
    def width_in(self) -> float:
        return self.figure.get_figwidth() if self.figure is not None else 0.0

    def data_uri(self) -> str | None:
        return None if self.figure is None else png_data_uri(self.figure)


def ema(values: Sequence[float], smoothing: float) -> list[float]:
    """y_k = smoothing · y_{k−1} + (1 − smoothing) · x_k, y_0 = x_0 (TensorBoard's smoothing, no debiasing)."""
    out, last = [], None
    for x in values:
        last = x if last is None else smoothing * last + (1 - smoothing) * x
        out.append(last)
    return out


def seed_band(curves: Sequence[tuple[list[int], list[float]]]):
    """(steps, mean, low, high) over the seeds present at each step."""
    at_step: dict[int, list[float]] = {}
    for steps, values in curves:
        for s, v in zip(steps, values):
            at_step.setdefault(s, []).append(v)
    steps = sorted(at_step)
    mean = [float(np.mean(at_step[s])) for s in steps]
    return steps, mean, [min(at_step[s]) for s in steps], [max(at_step[s]) for s in steps]


def no_signal(values: Sequence[float]) -> str | None:
    """Why values carry no signal ('always 0', 'constant 1 (range 2e-14: float noise)'), or None if they do."""
    if not values:
        return None
    low, high = min(values), max(values)
    if low == high == 0:
        return "always 0"
    if high - low <= NOISE_TOLERANCE * max(1.0, abs(low), abs(high)):
        noise = f" (range {high - low:.0e}: float noise)" if high > low else ""
        return f"constant {low:.4g}{noise}"
    return None


def fold_reason(panel: Panel, values: Sequence[float]) -> str | None:
    """Why a panel with these values (all runs together) is not drawn, or None: `no_signal`, else every |value|
    at or below the panel's floor."""
    reason = no_signal(values)
    if reason is None and values and panel.floor > 0 and max(abs(v) for v in values) <= panel.floor:
        cause = f" ({panel.floor_cause})" if panel.floor_cause else ""
        reason = f"|value| ≤ {panel.floor:g} throughout{cause}"
    return reason


def is_sparse(records: Sequence[RunRecord], panel: Panel) -> bool:
    """A training metric logged at fewer than SPARSE_FRACTION of the steps of the runs that logged it."""
    if panel.source == "eval":
        return False
    fractions = [len(r.metric_curve(panel.key)[0]) / len(r.metrics) for r in records
                 if r.metrics and r.metric_curve(panel.key)[0]]
    return bool(fractions) and float(np.median(fractions)) < SPARSE_FRACTION


def _raw_curve(record: RunRecord, panel: Panel):
    return record.eval_curve(panel.key) if panel.source == "eval" else record.metric_curve(panel.key)


def curves_figure(records: Sequence[RunRecord], panels: Sequence[Panel], variants: Sequence[str],
                  scenarios: Sequence[str], styles: dict[str, Style]) -> CurvesFigure:
    """The grid of `panels` × `scenarios` with a line (or points) per variant; see the module docstring.
    With several scenarios each column is a sub-figure headed by its scenario."""
    drawn, folded = [], []
    for panel in panels:
        values = [v for r in records for v in _raw_curve(r, panel)[1]]
        if not values:
            continue            # not logged by any run: the report says so when no panel at all is left
        reason = fold_reason(panel, values)
        if reason:
            folded.append(f"{panel.title}: {reason} in every run")
        else:
            drawn.append(panel)
    drawn = drawn[: max(1, MAX_PANELS // len(scenarios))]
    if not drawn:
        return CurvesFigure(None, folded)
    sparse = [p for p in drawn if is_sparse(records, p)]
    if len(scenarios) > 1:
        columns, rows = len(scenarios), len(drawn)
    else:
        columns = min(SINGLE_SCENARIO_COLUMNS, len(drawn))
        rows = math.ceil(len(drawn) / columns)
    # A bare Figure renders with Agg and never touches pyplot, so the caller's backend stays as it was.
    fig = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows + 0.5 + 0.25 * (len(scenarios) > 1)),
                 layout="constrained")
    if len(scenarios) > 1:
        for sub, scenario in zip(fig.subfigures(1, columns, squeeze=False)[0], scenarios):
            sub.suptitle(plain_text(scenario), fontsize=FONT_PT["title"], fontweight="bold")
            for row, (ax, panel) in enumerate(zip(sub.subplots(rows, 1, squeeze=False)[:, 0], drawn)):
                _draw_panel(ax, records, panel, scenario, variants, styles, panel in sparse,
                            ylabel=scenario == scenarios[0], xlabel=row == rows - 1)
    else:
        axes = fig.subplots(rows, columns, squeeze=False)
        for index, panel in enumerate(drawn):
            below = index + columns < len(drawn)      # no panel under this one: it carries the x label
            _draw_panel(axes[index // columns][index % columns], records, panel, scenarios[0], variants, styles,
                        panel in sparse, ylabel=True, xlabel=not below)
        for index in range(len(drawn), rows * columns):
            axes[index // columns][index % columns].set_visible(False)
    _legend(fig, variants, styles)
    return CurvesFigure(fig, folded, drawn, sparse)


def _draw_panel(ax, records, panel: Panel, scenario: str, variants, styles, sparse: bool, *, ylabel: bool,
                xlabel: bool) -> None:
    for variant in variants:
        curves = [_raw_curve(r, panel) for r in records if r.variant == variant and r.scenario == scenario]
        if sparse:
            _draw_points(ax, curves, styles[variant])
            continue
        if panel.source != "eval":
            curves = [(steps, ema(values, TRAIN_SMOOTHING)) for steps, values in curves]
        _draw_band(ax, curves, styles[variant])
    ax.set_title(panel.title, fontsize=FONT_PT["title"])
    if ylabel:
        ax.set_ylabel(panel.unit or panel.title, fontsize=FONT_PT["label"])
    if xlabel:
        ax.set_xlabel(STEP_LABEL, fontsize=FONT_PT["label"])
    _style_axes(ax)


def _style_axes(ax) -> None:
    ax.tick_params(labelsize=FONT_PT["tick"])
    formatter = ScalarFormatter(useOffset=False)      # "1e-14 + 1" offsets are unreadable in print
    formatter.set_powerlimits((-3, 4))
    ax.yaxis.set_major_formatter(formatter)
    ax.yaxis.get_offset_text().set_fontsize(FONT_PT["tick"])
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.grid(alpha=0.3, linewidth=0.5)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_band(ax, curves, style: Style) -> None:
    curves = [c for c in curves if c[0]]
    if not curves:
        return
    steps, mean, low, high = seed_band(curves)
    ax.plot(steps, mean, color=style.color, linestyle=style.linestyle, linewidth=1.5,
            marker=style.marker if len(steps) < 12 else None, markersize=3.5)
    if len(curves) > 1:
        ax.fill_between(steps, low, high, color=style.color, alpha=0.12, linewidth=0)
        for edge in (low, high):     # thin edges keep overlapping bands of several variants apart
            ax.plot(steps, edge, color=style.color, linestyle=style.linestyle, linewidth=0.5, alpha=0.6)


def _draw_points(ax, curves, style: Style) -> None:
    for steps, values in curves:
        if steps:
            ax.plot(steps, values, linestyle="none", marker=style.marker, markersize=3, color=style.color,
                    alpha=0.75)


def _legend(fig, variants: Sequence[str], styles: dict[str, Style]) -> None:
    handles = [Line2D([], [], color=styles[v].color, linestyle=styles[v].linestyle, marker=styles[v].marker,
                      linewidth=1.5, markersize=4) for v in variants]
    fig.legend(handles, [plain_text(v) for v in variants], loc="outside upper center", ncol=min(len(variants), 4),
               fontsize=FONT_PT["legend"], frameon=False)


def plain_text(label: str) -> str:
    """A run or variant name as matplotlib draws it literally: two `$` would start mathtext (and a label like
    `cost $5 vs $6` then fails to parse)."""
    return label.replace("$", r"\$")


def variant_styles(variants: Sequence[str]) -> dict[str, Style]:
    """A fixed colour, line style and marker per variant, the same in every figure of a report."""
    return {v: Style(OKABE_ITO[i % len(OKABE_ITO)], LINE_STYLES[i % len(LINE_STYLES)], MARKERS[i % len(MARKERS)])
            for i, v in enumerate(variants)}


def png_data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def save_figure(fig: Figure, stem: str | Path, formats: Sequence[str] = ("pdf", "svg", "png")) -> list[Path]:
    """Write fig as stem.pdf / .svg / .png (fonts embedded as TrueType in PDF, text kept as text in SVG)."""
    written = []
    with matplotlib.rc_context(RC):
        for fmt in formats:
            path = Path(f"{stem}.{fmt}")
            write_atomic(path, lambda f, fmt=fmt: fig.savefig(f, format=fmt, dpi=PNG_DPI), binary=True)
            written.append(path)
    return written


def natural_key(key: str) -> list:
    """Sort key that orders the numbers inside a name by value: "…/4-6_ops" before "…/10-12_ops", "mb2" before
    "mb10"."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", key)]


def keys_with_prefix(records: Sequence[RunRecord], prefix: str, keep: Callable[[str], bool] = lambda k: True):
    """Sorted metric keys starting with `prefix` that some run logged (e.g. the difficulty tiers)."""
    return sorted({k for r in records for k in r.metric_keys() if k.startswith(prefix) and keep(k)})
