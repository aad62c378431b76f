"""docs/config-reference.md is generated from the sources `literl config --explain` prints (literl/config/reference.py):
the committed page must equal a fresh rendering, and every key and trick --explain lists must be on it."""

from __future__ import annotations

import re
from pathlib import Path

from literl.config.load import explain
from literl.config.reference import PAGE, _cell, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_config_reference_equals_a_fresh_rendering():
    """A knob's help edited without regenerating the page makes the two differ; the message says how to fix it."""
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    assert committed == markdown(), (f"{PAGE} is stale: run `literl config --markdown > {PAGE}` "
                                     "(PYTHONPATH at this checkout) and commit the result")


def test_every_key_explain_prints_is_a_row_of_the_page_with_the_same_help():
    """--explain prints `  trainer.steps = 100    # help  [valid: >= 0]`; the page must hold the row
    | `trainer.steps` | ... | `>= 0` | help |, so the two cannot list different keys, help or valid values (a
    rendering that dropped a key fails here)."""
    page = markdown()
    leaves = re.findall(r"^  ([a-z_.0-9]+) = .*?    # (.*?)(?:  \[valid: (.*)\])?$", explain(), re.M)
    assert len(leaves) > 100, "the --explain scan found almost no keys: has its line format changed?"
    assert sum(bool(valid) for _, _, valid in leaves) > 50, "almost no key shows its valid values"
    for key, help_text, valid in leaves:
        assert f"| `{key}` |" in page, f"{key} is in --explain but not on {PAGE}"
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.endswith(f"| {_cell(help_text)} |"), f"{key}: its help on {PAGE} differs from --explain's"
        shown = f"`{_cell(valid)}`" if valid else ""
        assert row.endswith(f"| {shown} | {_cell(help_text)} |"), f"{key}: its valid values differ from --explain's"


def test_every_trick_explain_lists_has_a_row_under_its_axis():
    """--explain lists `    name(params)  — doc` under `  axis:`; the page has a table per axis with a row per
    name."""
    page = markdown()
    tricks = explain().split("\nTricks (", 1)[1]
    axis = None
    count = 0
    for line in tricks.splitlines():
        if re.match(r"^  [a-z_]+:$", line):
            axis = line.strip()[:-1]
        elif (match := re.match(r"^    ([a-z0-9_]+)\(", line)):
            section = page.split(f"### `{axis}`", 1)[1].split("\n### ", 1)[0]
            assert f"| `{match.group(1)}` |" in section, f"{axis}.{match.group(1)} is missing from {PAGE}"
            count += 1
    assert count > 30, "the trick scan found almost nothing: has --explain's format changed?"
