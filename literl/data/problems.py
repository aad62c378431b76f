"""Problem sets: load from a file, a benchmark name or a Hugging Face dataset, and normalise the records.

    load_problems("math500", data_dir="../shared/data")        # a registered benchmark name
    load_problems("my_problems.jsonl")                         # .jsonl / .json / .parquet
    load_problems("hkust-nlp/SimpleRL-Zoo-Data", split="train") # a hub dataset (needs the network)

Every record becomes a dict `{"id": str, "problem": str, "answer": str, ...the row's other fields}`. The
field names read are configurable (`problem_field`, `answer_field`, `id_field`); other columns that happen to be
named `id`, `problem` or `answer` are dropped, never put in their place. When the id field is
absent from the data the row number is the id. A non-string answer is converted (27.0 → "27", a one-element
list → its element). A row whose answer is missing, empty or not a value (true/false, NaN, an object) is skipped
and reported: one `DataWarning` naming the count and the ids, and `ProblemSet.skipped_ids`. It is never silently
used.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator, Sequence

from literl.data.benchmarks import benchmark_names, get_benchmark
from literl.data.files import ROW_FILE_SUFFIXES, read_rows
from literl.data.terminal_text import printable

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
NORMALISED = ("id", "problem", "answer")      # the keys every record has
FIELD_OPTION = "{role}_field=<one of them>"    # how a field is named in Python; commands pass their own option


class DataWarning(UserWarning):
    """Something in a problem set was skipped; the message names what and why."""


class MissingFieldError(ValueError):
    """A field named for the problem or answer is not in the data; the message lists the fields present."""


@dataclass
class ProblemSet(Sequence[dict]):
    """Normalised problem records and what was skipped while loading them."""

    name: str
    records: list[dict[str, Any]]
    source: str = ""
    skipped_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)


def load_problems(source: str | Path, *, data_dir: str | Path | None = None, split: str | None = None,
                  problem_field: str = "problem", answer_field: str = "answer", id_field: str = "id",
                  limit: int | None = None, name: str | None = None,
                  field_option: str = FIELD_OPTION) -> ProblemSet:
    """Load and normalise a problem set. `source`: a file path, a benchmark name or a hub dataset id.

    `split` applies to hub datasets (default "train"). `limit` keeps the first N usable problems. `field_option`
    is how the caller's command names a field (`{role}` is problem or answer), for the missing-field message:
    `literl train` takes `data.answer_field=...`, `literl eval` takes `--answer-field ...`.
    """
    source_text = str(source)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 (got {limit})")
    rows, resolved_name, origin = _read_source(source_text, data_dir=data_dir, split=split, limit=limit)
    records, skipped = normalize_records(rows, origin=origin, problem_field=problem_field,
                                         answer_field=answer_field, id_field=id_field, field_option=field_option)
    if limit is not None:
        records = records[:limit]
    return ProblemSet(name or resolved_name, records, origin, skipped)


def _read_source(source: str, *, data_dir, split, limit=None) -> tuple[list[dict], str, str]:
    """(raw rows, short name, description of where they came from). A sized benchmark generates `limit` rows."""
    path = Path(source).expanduser()
    if path.is_file():
        return read_rows(path), path.stem if path.stem not in ("test", "train") else path.parent.name, str(path)
    benchmark = get_benchmark(source)
    if benchmark is not None:
        where = Path(data_dir) if data_dir is not None else None
        rows = benchmark.loader(where, limit) if benchmark.sized else benchmark.loader(where)
        return rows, source, f"benchmark {source}"
    if path.suffix.lower() in ROW_FILE_SUFFIXES or path.is_dir():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"problem file {path} {what}; check the path, or use a benchmark name "
                                f"({', '.join(benchmark_names())})")
    if _HUB_ID.fullmatch(source):
        return _read_hub_dataset(source, split or "train"), source.rpartition("/")[2], f"hub dataset {source}"
    raise ValueError(f"unknown problem set {source!r}: not a file, not a known benchmark, not a hub id "
                     f"(owner/name). Known benchmarks: {', '.join(benchmark_names())}")


def _read_hub_dataset(dataset_id: str, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise ImportError(f"loading the Hugging Face dataset {dataset_id!r} needs the datasets library: pip install "
                          "'literl[hub]' (./run.sh test installs it), or pass a local .jsonl file") from None
    try:
        return list(datasets.load_dataset(dataset_id, split=split))
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types; all mean "could not load"
        raise RuntimeError(
            f"could not load Hugging Face dataset {dataset_id!r} (split {split!r}): {type(exc).__name__}: "
            f"{exc}. If the hub is unreachable (offline, or HF_DATASETS_OFFLINE=1), download the data "
            "elsewhere and pass a local .jsonl/.parquet file instead") from exc


def normalize_records(rows: Sequence[dict], *, origin: str = "problem set", problem_field: str = "problem",
                      answer_field: str = "answer", id_field: str = "id", field_option: str = FIELD_OPTION
                      ) -> tuple[list[dict[str, Any]], list[str]]:
    """Records `{"id", "problem", "answer", ...}` and the ids of rows skipped for a missing answer."""
    if not rows:
        return [], []
    present = sorted({key for row in rows for key in row})
    for role, name in (("problem", problem_field), ("answer", answer_field)):
        if not any(name in row for row in rows):
            raise MissingFieldError(f"{origin} has no {role} field {name!r}; its fields are: {', '.join(present)}. "
                                    f"Name the one to use: {field_option.format(role=role)}")
    has_ids = any(id_field in row for row in rows)
    records, skipped = [], []
    for index, row in enumerate(rows):
        row_id = str(row.get(id_field, index)) if has_ids else str(index)
        answer = answer_text(row.get(answer_field))
        if not answer:
            skipped.append(row_id)
            continue
        problem = row.get(problem_field)
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{origin}, row {row_id}: the problem field {problem_field!r} is empty or not text")
        # The named fields win: a column that happens to be called `problem`, `answer` or `id` (Hugging Face sets
        # often carry several answer columns) must not overwrite the one the user chose.
        others = {k: v for k, v in row.items() if k not in (problem_field, answer_field, id_field, *NORMALISED)}
        records.append({"id": row_id, "problem": problem, "answer": answer, **others})
    if skipped:
        shown = printable(", ".join(skipped[:20]) + (", ..." if len(skipped) > 20 else ""))
        warnings.warn(f"{origin}: skipped {len(skipped)} of {len(rows)} rows with a missing, empty or unusable "
                      f"answer (field {answer_field!r}; true/false, NaN and objects are not answers); ids: {shown}",
                      DataWarning, stacklevel=3)
    return records, skipped


def answer_text(value: Any) -> str:
    """A gold answer as a string; "" when there is none, or none that a response could be checked against (true /
    false, NaN or ±inf, an object): such rows are skipped and reported like empty ones, never trained on as the
    gold "True", "nan" or "{'v': 32}". 27.0 → "27", 1e-05 → "0.00001"; a one-element list → its element."""
    if value is None or isinstance(value, (bool, dict)):
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        # Positional, as answers are written: repr's `1e-05` is Python's spelling, which Math-Verify reads with
        # Euler's e. repr's shortest digits, because the binary value's are noise (int(1e300) is 1000...0525...).
        text = format(Decimal(repr(value)), "f")
        text = text.rstrip("0").rstrip(".") if "." in text else text
        return "0" if text == "-0" else text
    if isinstance(value, (list, tuple)):
        items = [answer_text(v) for v in value]
        return items[0] if len(items) == 1 else ", ".join(i for i in items if i)
    return str(value).strip()
