"""results/check_record.py, the check that moving the lab record out of the docs lost nothing, on hand-made pages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "results" / "check_record.py"
spec = importlib.util.spec_from_file_location("check_record", SCRIPT)
check_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_record)


def test_a_table_row_survives_cell_by_cell_and_separators_count_for_nothing():
    """'| a | b 0.25 |' → the cells 'a' and 'b 0.25'; '|---|---|' and a blank line hold nothing to keep."""
    assert check_record.pieces("| a | b 0.25 |") == ["a", "b 0.25"]
    assert check_record.pieces("|---|---|") == []
    assert check_record.pieces("   ") == []


def test_moved_text_is_kept_even_rewrapped_and_relinked():
    """The old line 'held-out 44.9% → 68.8% ([docs](docs/testbed.md))' moved into a results page, wrapped
    differently and with its link re-pointed (../../docs/testbed.md): kept verbatim, nothing reworded or lost."""
    old = {"docs/testbed.md": "held-out 44.9% → 68.8% ([docs](docs/testbed.md))\n"}
    corpus = "intro\nheld-out 44.9%\n→ 68.8% ([docs](../../docs/testbed.md)) and more"
    assert check_record.compare(old, corpus) == ([], [], 1)


def test_a_line_whose_figures_vanished_is_lost_and_one_rewritten_around_them_is_reworded():
    """Old: 'compile 21.6 s on an H200' and 'about 5.1x faster'. The corpus keeps 5.1 in other words but has no
    21.6 anywhere: the first line is lost (its number 21.6 is missing), the second reworded."""
    old = {"docs/speed.md": "compile 21.6 s on an H200\nabout 5.1x faster\n"}
    corpus = "the decode runs 5.1 times as fast (results/benchmarks/x.md); the compile takes tens of seconds"
    reworded, lost, total = check_record.compare(old, corpus)
    assert total == 2
    assert [piece for _, _, piece in lost] == ["compile 21.6 s on an H200"]
    assert [(line, piece) for _, line, piece in reworded] == [(2, "about 5.1x faster")]
