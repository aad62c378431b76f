"""Which file of a model directory is damaged, when transformers could not load it.

A weights file cut short (a copy or a save that stopped) makes safetensors raise `SafetensorError: invalid header
length`, and a tokenizer file cut short a bare `JSONDecodeError`: neither names the file. `damaged_model_file`
reads each file's header (safetensors) or parses it (JSON) to say which one it is, so the message can name it
and the fix (copy or save that file again).
"""

from __future__ import annotations

import json
from pathlib import Path


def damaged_model_file(model_dir: str | Path) -> str | None:
    """'<file>: <what is wrong>' for the first damaged weights or JSON file in `model_dir`, or None."""
    root = Path(model_dir)
    if not root.is_dir():
        return None
    for path in sorted(root.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem:
            return f"{path}: {problem}"
    for path in sorted(root.glob("*.json")):
        try:
            json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            return f"{path}: not valid UTF-8"
        except json.JSONDecodeError as err:
            return f"{path}: not valid JSON ({err})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    # The format: an 8-byte little-endian header length, the JSON header, then the tensors' bytes.
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return f"cut short ({size} bytes, less than a safetensors header)"
        length = int.from_bytes(prefix, "little")
        if 8 + length > size:
            return f"cut short ({size} bytes, its header alone declares {8 + length})"
        try:
            header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "its safetensors header is not valid JSON"
    ends = [entry["data_offsets"][1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2]
    if ends and 8 + length + max(ends) > size:
        return f"cut short ({size} bytes, its tensors need {8 + length + max(ends)})"
    return None


def load_failure_message(model_dir: str | Path, err: Exception) -> str | None:
    """The message for a model directory that failed to load with `err`, naming the damaged file and the fix; None
    when no file looks damaged (the error is then about something else)."""
    damaged = damaged_model_file(model_dir)
    if damaged is None:
        return None
    return (f"could not load the model in {model_dir}: {damaged}. Copy that file again, or save the model again "
            f"with save_pretrained ({type(err).__name__}: {' '.join(str(err).split())[:200]})")
