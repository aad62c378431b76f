"""A problem file that is not UTF-8 is a message naming the file and line, not a UnicodeDecodeError (issue 22)."""

from __future__ import annotations

import pytest

from literl.data.files import read_rows


@pytest.mark.parametrize("suffix, content, where", [
    (".jsonl", b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "1"}\n', "line 2"),
    (".json", b'[\n {"problem": "1+1", "answer": "2"},\n {"problem": "\xff", "answer": "1"}\n]\n', "line 3"),
])
def test_a_file_that_is_not_utf8_names_its_line(tmp_path, suffix, content, where):
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        read_rows(path)
    assert f"{path}, {where}: not valid UTF-8" in str(caught.value)
    assert not isinstance(caught.value, UnicodeDecodeError)
