"""report.html: self-contained, every section present, and it renders in headless Chromium when one is
installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from literl.arena import ablation
from literl.commands.report_command import report_runs
from tests.arena.fake_runs import write_run
from tests.arena.test_summary import make_ablation

SECTIONS = ["Setup", "What the paper found", "Statistics", "Paired difference against the baseline",
            "Learning curves", "Held-out accuracy", "Training", "Mechanism diagnostics", "Clipped tokens",
            "Repetition of truncated responses", "Reward std within groups, by difficulty tier",
            "Importance-weight decomposition", "Entropy"]


def chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def ablation_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ablation")
    spec, _ = make_ablation(out, skip={("worse", "s2", 2)})
    spec.raw  # noqa: B018 - the fixture only needs the folder
    ablation.summarize_ablation(out)
    return out / "report.html"


def test_the_report_is_one_self_contained_file(ablation_report):
    page = ablation_report.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*['"](?!data:)""", page), "every asset must be embedded"
    assert "<script" not in page and "<link" not in page and "http://" not in page and "https://" not in page
    images = re.findall(r"src='data:image/png;base64,", page)
    assert len(images) >= 6     # held-out, training, repetition, tiers, IS decomposition, entropy


def test_the_report_has_every_section_and_the_numbers(ablation_report):
    page = ablation_report.read_text()
    for section in SECTIONS:
        assert section in page, section
    assert "0.510 ± 0.025" in page                        # base/s1 final, t interval over 3 seeds
    assert "helps" in page and "hurts" in page and "no detectable difference" in page
    assert "worse/s2/seed_2: not run" in page
    assert "␣but" in page and "⏎" in page                 # clipped tokens with visible whitespace
    assert "alt='groups/reward_std/&lt;tier&gt;' src='data:image/png" in page


def test_a_report_of_plain_runs(tmp_path):
    write_run(tmp_path / "a" / "seed_0", [0.2, 0.3, 0.5])
    write_run(tmp_path / "b" / "seed_0", [0.2, 0.25, 0.3], finished=False)
    summary = report_runs([tmp_path / "a" / "seed_0", tmp_path / "b" / "seed_0"], tmp_path / "r.html")
    assert summary["variants"] == ["a/seed_0", "b/seed_0"]
    page = (tmp_path / "r.html").read_text()
    assert "a/seed_0" in page and "Runs" in page and "unfinished or failed" in page


def test_a_report_of_runs_that_logged_nothing_yet_still_renders(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("seed: 0\n")
    report_runs([tmp_path / "r"], tmp_path / "r" / "report.html")
    assert "No run logged held-out accuracy" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.skipif(chromium() is None, reason="no chromium on this machine")
def test_the_report_renders_in_headless_chromium(ablation_report, tmp_path):
    """--dump-dom prints the DOM after layout: the headings and tables must be there, images decoded."""
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]
    url = ablation_report.resolve().as_uri()
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for section in ("Statistics", "Learning curves", "Mechanism diagnostics", "Clipped tokens"):
        assert section in dom.stdout
    assert dom.stdout.count("<img") >= 6
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1280,2400", url], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
