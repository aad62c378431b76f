"""Training problems: the testbed's train split, a file or benchmark name, or a list passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class TrainingData:
    problems: list[dict]
    is_testbed: bool          # testbed problems are prompted with the raw template
    description: str


def training_problems(cfg, *, problems: Sequence[dict] | str | None = None, testbed: bool = False) -> TrainingData:
    d = cfg.data
    source = problems if problems is not None else d.train
    if source is None:
        from literl.testbed.tasks import train_problems

        rows = train_problems(d.size, tier=d.difficulty)
        return TrainingData(rows[:d.limit] if d.limit else rows, True, f"testbed, {d.difficulty} tier")
    if isinstance(source, str):
        from literl.data.problems import load_problems

        rows = load_problems(source, data_dir=d.dir, problem_field=d.problem_field, answer_field=d.answer_field,
                             id_field=d.id_field, limit=d.limit, field_option="data.{role}_field=<one of them>")
        if not rows:
            raise ValueError(f"{rows.source} holds no usable problem: "
                             + (f"all {len(rows.skipped_ids)} of its rows have an empty or unusable answer (field "
                                f"data.answer_field={d.answer_field})" if rows.skipped_ids else
                                "it has no rows (an empty or blank file)")
                             + ". data.train takes a .jsonl/.json/.parquet file of rows with a problem and an answer")
        return TrainingData(rows, False, source)
    rows = [dict(r) for r in source]
    if not rows:
        raise ValueError("the problems passed in are an empty list: there is nothing to train on")
    for i, row in enumerate(rows):
        if "problem" not in row or "answer" not in row:
            raise ValueError(f"training problem {i} lacks a 'problem' or 'answer' key (has: {sorted(row)}); "
                             "pass dicts with both")
    return TrainingData(rows[:d.limit] if d.limit else rows, False, "problems passed in")
