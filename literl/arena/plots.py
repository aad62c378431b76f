"""Learning-curve figures for the report, as base64 PNG data URIs (the report embeds them; no files).

One figure is a grid: a row per metric, a column per scenario, a line per variant. A line is the mean over
seeds at each step and its shaded band spans the seeds (min to max), so three seeds show their spread
directly. Training metrics are smoothed per seed with an exponential moving average (TRAIN_SMOOTHING; the
LitePPO paper smooths with 0.8 over 500 steps, our runs are a few dozen steps); held-out curves are not.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from literl.arena.runs import RunRecord

TRAIN_SMOOTHING = 0.6
DPI = 80
PANEL_SIZE = (4.2, 2.6)   # inches per (scenario, metric) panel
SINGLE_SCENARIO_COLUMNS = 3
MAX_PANELS = 60           # a report of plain runs with many tiers must not make an unreadable giant


@dataclass(frozen=True)
class Panel:
    """One metric row: what to read from a run, and how to label it."""

    key: str
    title: str
    source: str = "metrics"     # "metrics" (metrics.jsonl, smoothed) or "eval" (eval.jsonl, raw)


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


def _curve(record: RunRecord, panel: Panel):
    if panel.source == "eval":
        return record.eval_curve(panel.key)
    steps, values = record.metric_curve(panel.key)
    return steps, ema(values, TRAIN_SMOOTHING)


def curves_figure(records: Sequence[RunRecord], panels: Sequence[Panel], variants: Sequence[str],
                  scenarios: Sequence[str], colors: dict[str, str]) -> str | None:
    """A data URI of the figure, or None when none of the panels has data in any run.

    With several scenarios a row is a metric and a column a scenario; with one, the panels wrap into
    SINGLE_SCENARIO_COLUMNS columns so that the page is not one long strip.
    """
    panels = [p for p in panels if any(_curve(r, p)[0] for r in records)][: max(1, MAX_PANELS // len(scenarios))]
    if not panels:
        return None
    cells = [(panel, scenario) for panel in panels for scenario in scenarios]
    columns = len(scenarios) if len(scenarios) > 1 else min(SINGLE_SCENARIO_COLUMNS, len(panels))
    rows = math.ceil(len(cells) / columns)
    # A bare Figure renders with Agg and never touches pyplot, so the caller's backend stays as it was.
    fig = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows + 0.4))
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    for ax, (panel, scenario) in zip(axes, cells):
        for variant in variants:
            group = [r for r in records if r.variant == variant and r.scenario == scenario]
            _draw_band(ax, [_curve(r, panel) for r in group], variant, colors[variant])
        ax.set_title(panel.title if len(scenarios) == 1 else f"{panel.title} · {scenario}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xlabel("step", fontsize=8)
    for ax in axes[len(cells):]:
        ax.set_visible(False)
    _legend(fig, variants, colors)
    return _to_data_uri(fig)


def _draw_band(ax, curves, label: str, color: str) -> None:
    curves = [c for c in curves if c[0]]
    if not curves:
        return
    steps, mean, low, high = seed_band(curves)
    ax.plot(steps, mean, color=color, label=label, linewidth=1.4, marker="o" if len(steps) < 12 else None,
            markersize=3)
    if len(curves) > 1:
        ax.fill_between(steps, low, high, color=color, alpha=0.18, linewidth=0)


def _legend(fig, variants: Sequence[str], colors: dict[str, str]) -> None:
    handles = [Line2D([], [], color=colors[v], linewidth=2) for v in variants]
    fig.legend(handles, list(variants), loc="upper center", ncol=min(len(variants), 6), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1.0))
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / height))   # keep ~0.35 inch on top for the legend


def _to_data_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def variant_colors(variants: Sequence[str]) -> dict[str, str]:
    """A fixed colour per variant (tab10 order), the same in every figure of a report."""
    palette = matplotlib.colormaps["tab10"].colors
    return {v: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, v in enumerate(variants)}


def keys_with_prefix(records: Sequence[RunRecord], prefix: str, keep: Callable[[str], bool] = lambda k: True):
    """Sorted metric keys starting with `prefix` that some run logged (e.g. the difficulty tiers)."""
    return sorted({k for r in records for k in r.metric_keys() if k.startswith(prefix) and keep(k)})
