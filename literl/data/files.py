"""Reading row files (JSON Lines, JSON, Parquet) and writing files atomically.

Atomic writes go to a temporary file in the target's directory and then `os.replace` it over the target,
so a crash or Ctrl-C leaves either the old file or the new one, never a half-written one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

ROW_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
BOM = "\ufeff"      # a UTF-8 byte order mark, read as the text's first character


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a `.jsonl` (one object per line), `.json` (a list of objects) or `.parquet` file; a text file may
    start with a UTF-8 byte order mark."""
    path = Path(path)
    if not path.is_file():
        hint = " (it is a directory)" if path.is_dir() else ""
        raise FileNotFoundError(f"problem file {path} does not exist{hint}; check the path, or pass a known "
                                "benchmark name instead")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json_list(path)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'literl[hub]' (or pip install pyarrow), "
                              "or convert the file to .jsonl") from None
        return pq.read_table(path).to_pylist()
    raise ValueError(f"cannot read {path}: unknown file type {suffix!r}; use one of {', '.join(ROW_FILE_SUFFIXES)}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _decode(raw, path, number)
            if number == 1:
                line = line.removeprefix(BOM)       # editors on Windows save UTF-8 with a byte order mark
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {number}: not valid JSON ({exc.msg}); each line of a .jsonl "
                                 "file must be one JSON object") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _decode(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}, line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                         f"{exc.start + 1}); save the file as UTF-8") from None


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as "
                         "UTF-8") from None
    try:
        data = json.loads(text.removeprefix(BOM))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise ValueError(f"{path}: a .json problem file must hold a list of objects; "
                         "for one object per line, name the file .jsonl")
    return data


def write_atomic(path: str | Path, write: Callable[[Any], None], *, binary: bool = False) -> Path:
    """Call `write(file)` on a temporary file next to `path`, then move it over `path` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o644)      # mkstemp makes it owner-only; results are meant to be shared
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text))


def write_json_atomic(path: str | Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, default=_json_default) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    def write(f):
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")

    return write_atomic(path, write)


def _json_default(value: Any) -> Any:
    # numpy / torch scalars and other number-likes that `json` does not know
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
