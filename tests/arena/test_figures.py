"""Figures for print: labelled axes with units, readable sizes, colour-blind-safe styles, sparse metrics as
points, panels without signal folded with a note; `literl report --export` writes figures (PDF, SVG, PNG) and
tables (CSV, LaTeX); and the report, rendered in headless Chromium, shows its figures at a readable size."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from literl.arena import ablation, plots
from literl.arena.plots import Panel
from literl.arena.report import IS_PANELS, TRAINING_PANELS
from literl.arena.runs import load_run
from literl.cli import main
from tests.arena.fake_runs import write_run
from tests.arena.test_summary import make_ablation


def run_with(tmp_path: Path, name: str, values_by_step: dict[str, dict[int, float]], steps: int = 10):
    """A run directory whose metrics.jsonl holds exactly the given values (a step missing from a key's dict
    leaves that key out of the step)."""
    directory = write_run(tmp_path / name, [0.3, 0.5])
    with open(directory / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            record = {"step": step, "accuracy": 0.4 + 0.01 * step}
            record.update({k: v[step] for k, v in values_by_step.items() if step in v})
            f.write(json.dumps(record) + "\n")
    return load_run(directory, variant=name, scenario="run")


def test_no_signal_means_exactly_zero_or_float_noise():
    assert plots.no_signal([0.0, 0.0, 0.0]) == "always 0"
    assert plots.no_signal([1.0, 1.0 + 2e-14, 1.0 - 1e-14]) == "constant 1 (range 3e-14: float noise)"
    assert plots.no_signal([3e-13, 1e-13]) is not None        # |values| < 1: the tolerance is absolute 1e-9
    assert plots.no_signal([0.0, 1e-6]) is None                # a small KL is still a signal
    assert plots.no_signal([0.5, 0.5]) == "constant 0.5"
    assert plots.no_signal([]) is None


def test_panels_without_signal_are_folded_and_named(tmp_path):
    steps = range(1, 11)
    records = [run_with(tmp_path, f"v{i}", {
        "reward/mean": {s: 0.1 * s + i for s in steps},
        "policy_loss/clipfrac_binding_low": {s: 0.0 for s in steps},
        "share/ti": {s: 1.0 + (s % 3) * 1e-14 for s in steps}}) for i in range(2)]
    result = plots.curves_figure(records, TRAINING_PANELS + IS_PANELS, ["v0", "v1"], ["run"],
                                 plots.variant_styles(["v0", "v1"]))
    assert [p.key for p in result.panels] == ["accuracy", "reward/mean"]
    assert result.folded == ["clipped, low side: always 0 in every run",
                             "share train–inference: constant 1 (range 2e-14: float noise) in every run"]
    axes = [ax for ax in result.figure.axes if ax.get_visible()]
    assert len(axes) == 2


def test_every_axis_is_labelled_readable_and_the_figure_fits_a_text_width(tmp_path):
    records = [run_with(tmp_path, "a", {key: {s: 0.1 * s + i for s in range(1, 11)}
                                        for i, key in enumerate(p.key for p in TRAINING_PANELS)})]
    result = plots.curves_figure(records, TRAINING_PANELS, ["a"], ["run"], plots.variant_styles(["a"]))
    axes = [ax for ax in result.figure.axes if ax.get_visible()]
    assert len(axes) == 8 and result.width_in == pytest.approx(6.6)
    columns = plots.SINGLE_SCENARIO_COLUMNS
    for index, ax in enumerate(axes):
        assert ax.get_ylabel() and ax.get_title()
        assert bool(ax.get_xlabel()) == (index + columns >= len(axes)), index   # the lowest panel of each column
        fonts = [t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        assert min(fonts) >= 8 and ax.yaxis.label.get_fontsize() >= 8
    assert {ax.get_ylabel() for ax in axes} >= {"fraction of tokens", "tokens", "nats per token"}


def test_variants_differ_in_colour_line_style_and_marker():
    styles = plots.variant_styles([f"v{i}" for i in range(4)])
    assert [s.color for s in styles.values()] == plots.OKABE_ITO[:4]
    assert len({s.linestyle for s in styles.values()}) == 4 and len({s.marker for s in styles.values()}) == 4


def test_a_sparse_metric_is_drawn_as_points_unsmoothed(tmp_path):
    """Logged at steps 2, 7 and 9 of 10: joining or smoothing those would draw a trend that is not there."""
    sparse = {2: 0.5, 7: 0.1, 9: 0.9}
    records = [run_with(tmp_path, "a", {"repetition/truncated_repetitive_frac": sparse})]
    panel = Panel("repetition/truncated_repetitive_frac", "repetitive", "fraction of truncated")
    result = plots.curves_figure(records, [panel], ["a"], ["run"], plots.variant_styles(["a"]))
    assert result.sparse == [panel]
    (line,) = result.figure.axes[0].lines
    assert line.get_linestyle() == "None"
    assert list(line.get_xdata()) == [2, 7, 9] and list(line.get_ydata()) == [0.5, 0.1, 0.9]


def test_report_export_writes_figures_and_tables(tmp_path, capsys):
    out, export = tmp_path / "abl", tmp_path / "paper"
    make_ablation(out)
    assert main(["report", str(out), "--export", str(export)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for name in ("held_out", "training", "repetition", "reward_std_by_tier", "is_decomposition", "entropy"):
        assert (export / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
        assert (export / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        svg = (export / f"{name}.svg").read_text()
        assert "<svg" in svg and "training step" in svg          # text kept as text, searchable
    cells = list(csv.DictReader(open(export / "cells.csv")))
    base = next(c for c in cells if (c["variant"], c["scenario"]) == ("base", "s1"))
    assert float(base["final_mean"]) == pytest.approx(0.51) and float(base["final_half_width"]) == pytest.approx(
        next(c for c in summary["cells"] if c["variant"] == "base" and c["scenario"] == "s1")["final"]["half_width"])
    comparisons = list(csv.DictReader(open(export / "comparisons.csv")))
    same = next(c for c in comparisons if (c["variant"], c["scenario"], c["score"]) == ("same", "s1", "final"))
    assert same["verdict"] == "no detectable difference" and float(same["mde"]) == pytest.approx(0.061930, abs=1e-6)
    tex = (export / "comparisons.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and "$-$0.100" in tex     # worse − base, minus typeset
    body = [line for line in (export / "cells.tex").read_text().splitlines() if line.endswith("\\\\")]
    assert len(body) == 1 + len(summary["cells"]) and all(line.count("$\\pm$") == 3 for line in body[1:])
    assert "exported to" in capsys.readouterr().out


def test_latex_escapes_names():
    from literl.arena.export import latex_escape

    assert latex_escape("eps_high_0.28 & 50%") == r"eps\_high\_0.28 \& 50\%"


def chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)


PROBE = """<script>
window.addEventListener('load', () => {
  const rows = [...document.images].map(img => {
    const box = img.getBoundingClientRect();
    const pxPerInch = box.width / parseFloat(img.dataset.widthIn);
    return [img.alt, img.naturalWidth, Math.round(box.width),
            (parseFloat(img.dataset.minFontPt) / 72 * pxPerInch).toFixed(2)].join('|');
  });
  const out = document.createElement('pre'); out.id = 'probe'; out.textContent = rows.join('\\n');
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(chromium() is None, reason="no chromium on this machine (Debian: apt-get install chromium)")
def test_headless_chromium_shows_every_figure_decoded_at_a_readable_size(tmp_path):
    """The page as a browser lays it out at 1280 px: every figure decodes (natural width > 0) and its smallest
    text (FONT_PT's minimum, 8 pt at the figure's size in inches) is drawn at least 9 CSS pixels high."""
    out = tmp_path / "abl"
    make_ablation(out)
    ablation.summarize_ablation(out)
    page = (out / "report.html").read_text().replace("</body>", PROBE + "</body>")
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(page)
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
                          "--window-size=1280,2000", "--virtual-time-budget=20000", "--dump-dom",
                          probe_page.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    probe = re.search(r"<pre id=\"probe\">(.*?)</pre>", dom.stdout, re.S)
    assert probe, "the probe script did not run"
    rows = [line.split("|") for line in probe.group(1).strip().splitlines()]
    assert len(rows) == 6
    for alt, natural, shown, font_px in rows:
        assert int(natural) > 0 and int(shown) > 200, alt
        assert float(font_px) >= 9.0, f"{alt}: smallest text {font_px} px"
