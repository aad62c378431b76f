"""docs/migrating.md: every literl key it names exists, with a value the config accepts.

Each table with a `literl` column is read row by row: the cell's backticked spans that start with a config
section are key=value overrides (several in one span are split at each key), and every row's overrides must
load together on top of the real-model profile; a row without any says "not supported"."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from literl.config.schema import Config
from literl.config.load import load_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
SECTIONS = [f.name for f in dataclasses.fields(Config)]
KEY_START = re.compile(rf"(?:^|\s+)(?=(?:{'|'.join(SECTIONS)})(?:\.[\w]+)*=)")


def literl_cells() -> list[tuple[int, str, str]]:
    """(line number, the row's first cell, the literl cell) of every table row under a `literl` header."""
    rows, column = [], None
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("literl") if "literl" in cells else -1
        elif column >= 0 and not set(line) <= set("|- "):
            rows.append((number, cells[0], cells[column]))
    return rows


def overrides_of(cell: str) -> list[str]:
    spans = re.findall(r"`([^`]+)`", cell)
    return [part.strip() for span in spans for part in KEY_START.split(span) if part.strip()
            and part.strip().split("=", 1)[0].split(".")[0] in SECTIONS]


ROWS = literl_cells()


def test_the_doc_has_the_three_tables():
    assert len(ROWS) > 90
    firsts = {first for _, first, _ in ROWS}
    assert "`actor.ppo_mini_batch_size`" in firsts and "`num_generations`" in firsts and "`pg_clip: 0.2`" in firsts


@pytest.mark.parametrize("line,first,cell", ROWS, ids=[f"line{n}" for n, _, _ in ROWS])
def test_every_literl_key_named_exists_and_its_example_value_loads(line, first, cell):
    overrides = overrides_of(cell)
    if not overrides:
        assert cell.startswith("not supported"), f"line {line} ({first}): no literl key and not 'not supported'"
        return
    for item in overrides:
        assert "=" in item, f"line {line}: {item!r} should be key=value"
    load_config(overrides=["model.profile=real", *overrides])      # raises on an unknown key, trick or value
