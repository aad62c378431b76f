"""Atomic writes leave the old file intact when writing fails."""

from __future__ import annotations

import pytest

from literl.data.files import read_rows, write_json_atomic, write_jsonl_atomic, write_text_atomic


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl_atomic(path, [{"a": 1}])

    def broken_rows():
        yield {"a": 2}
        raise RuntimeError("interrupted halfway")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(path, broken_rows())
    assert read_rows(path) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]          # no temporary left behind


def test_round_trips(tmp_path):
    write_json_atomic(tmp_path / "x.json", [{"b": 2}])
    assert read_rows(tmp_path / "x.json") == [{"b": 2}]
    write_text_atomic(tmp_path / "deep" / "t.txt", "hello")
    assert (tmp_path / "deep" / "t.txt").read_text() == "hello"
