"""Named problem sets: a registry from a short name to a loader.

Built-in names resolve to files in the data directory (the `data_dir` argument, else the environment
variable `LITERL_DATA_DIR`), laid out as in the shared data MANIFEST:

    math500        math500/test.jsonl                       MATH-500 (500)
    aime24         aime24/test.jsonl                        AIME 2024 (30)
    aime25         aime25/test.jsonl                        AIME 2025 (30)
    amc23          amc23/test.jsonl                         AMC 2023 (40)
    minerva        minerva_math/test.jsonl                  Minerva Math / OCW (272)
    olympiadbench  olympiadbench/test.jsonl                 OlympiadBench, English open-ended math (675)
    gsm8k          gsm8k/test.jsonl                         GSM8K test (1319)
    math_train     math/train.jsonl                         MATH train (7500)
    math_test      math/test.jsonl                          MATH test (5000)
    simplerl_easy  simplerl_zoo/simplelr_qwen_gsm8k_level1/train.jsonl   SimpleRL-Zoo easy (8388)
    simplerl_medium simplerl_zoo/simplelr_qwen_level1to4/train.jsonl     SimpleRL-Zoo medium (8139)
    simplerl_hard  simplerl_zoo/simplelr_qwen_level3to5/train.jsonl      SimpleRL-Zoo hard (8523)
    dapo17k        dapo_math_17k/train.jsonl                DAPO-Math-17k, one copy per row (17917)
    deepmath       deepmath_103k_subset/train.jsonl         DeepMath-103K, ROLL's 4994-row subset

Other modules add names with `register_benchmark(name, loader)`; a loader takes the resolved-or-None data
directory and returns raw rows (dicts), which `problems.load_problems` then normalises. The embedded
testbed registers its held-out splits as `testbed` (mixed tier) and `testbed_<tier>` this way, as sized
benchmarks: generated, with `limit` problems (200 by default), the same ones training's evaluation takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from literl.data.files import read_rows

DATA_DIR_ENV = "LITERL_DATA_DIR"

BenchmarkLoader = Callable[[Path | None], list[dict[str, Any]]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    loader: BenchmarkLoader
    description: str = ""
    sized: bool = False
    """The loader generates its rows and takes the problem count: `loader(data_dir, limit)` (the testbed's held-out
    splits, whose `--limit N` means N problems — as `eval.limit` does in training — not the first N of a fixed set)."""


_BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, loader: BenchmarkLoader, *, description: str = "",
                       replace: bool = False, sized: bool = False) -> None:
    """Make `name` loadable by `load_problems(name)`. `loader(data_dir) -> list of row dicts`; with `sized`,
    `loader(data_dir, limit)`, for a generated set whose size the caller chooses (`limit` None: its default)."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"benchmark name {name!r} must be letters, digits, '_' or '-' (it appears in "
                         "metric names and on the command line)")
    if name in _BENCHMARKS and not replace:
        raise ValueError(f"benchmark {name!r} is already registered; pass replace=True to override it")
    _BENCHMARKS[name] = Benchmark(name, loader, description, sized)


def benchmark_names() -> list[str]:
    return sorted(_BENCHMARKS)


def get_benchmark(name: str) -> Benchmark | None:
    return _BENCHMARKS.get(name)


def resolve_data_dir(data_dir: str | Path | None, *, needed_for: str) -> Path:
    """The data directory from the argument, else $LITERL_DATA_DIR; an error says how to set it."""
    source = "data_dir"
    if data_dir is None:
        data_dir, source = os.environ.get(DATA_DIR_ENV) or None, f"${DATA_DIR_ENV}"
    if data_dir is None:
        raise FileNotFoundError(
            f"benchmark {needed_for!r} is read from the data directory, which is not set: pass "
            f"--data-dir DIR (data.dir=DIR in a config) or set {DATA_DIR_ENV}=DIR, where DIR holds the "
            "benchmark folders (math500/test.jsonl, aime24/test.jsonl, ...)")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data directory {path} (from {source}) does not exist; point it at the folder "
                                "that holds math500/, aime24/, ... ")
    return path


def _file_benchmark(name: str, relative_path: str, description: str) -> None:
    def load(data_dir: Path | None) -> list[dict[str, Any]]:
        root = resolve_data_dir(data_dir, needed_for=name)
        path = root / relative_path
        if not path.is_file():
            raise FileNotFoundError(f"benchmark {name!r} expects {relative_path} inside the data directory "
                                    f"{root}, but {path} does not exist; check that the directory is the "
                                    "shared data folder (see its MANIFEST.md)")
        return read_rows(path)

    register_benchmark(name, load, description=description)


for _name, _path, _description in [
    ("math500", "math500/test.jsonl", "MATH-500 (OpenAI PRM800K test split), 500 problems"),
    ("aime24", "aime24/test.jsonl", "AIME 2024, 30 problems"),
    ("aime25", "aime25/test.jsonl", "AIME 2025, 30 problems"),
    ("amc23", "amc23/test.jsonl", "AMC 2023, 40 problems"),
    ("minerva", "minerva_math/test.jsonl", "Minerva Math (MIT OCW), 272 problems"),
    ("olympiadbench", "olympiadbench/test.jsonl", "OlympiadBench English open-ended math, 675 problems"),
    ("gsm8k", "gsm8k/test.jsonl", "GSM8K test, 1319 problems"),
    ("math_train", "math/train.jsonl", "MATH train, 7500 problems"),
    ("math_test", "math/test.jsonl", "MATH test, 5000 problems"),
    ("simplerl_easy", "simplerl_zoo/simplelr_qwen_gsm8k_level1/train.jsonl", "SimpleRL-Zoo easy (GSM8K + MATH L1)"),
    ("simplerl_medium", "simplerl_zoo/simplelr_qwen_level1to4/train.jsonl", "SimpleRL-Zoo medium (MATH L1-4)"),
    ("simplerl_hard", "simplerl_zoo/simplelr_qwen_level3to5/train.jsonl", "SimpleRL-Zoo hard (MATH L3-5)"),
    ("dapo17k", "dapo_math_17k/train.jsonl", "DAPO-Math-17k (17917 rows)"),
    ("deepmath", "deepmath_103k_subset/train.jsonl", "DeepMath-103K, ROLL's 4994-row subset"),
]:
    _file_benchmark(_name, _path, _description)


TESTBED_TIER_BENCHMARKS = {"testbed": "mixed", "testbed_easy": "easy", "testbed_medium": "medium",
                           "testbed_hard": "hard", "testbed_long": "long"}
"""The testbed's held-out splits by name: `testbed` is the mixed tier (the default evaluation), `testbed_<tier>` the
held-out split of another tier (e.g. `testbed_long` for the long tier's regimes, docs/testbed.md)."""


TESTBED_DEFAULT_PROBLEMS = 200


def _testbed_heldout(tier: str) -> Callable[[Path | None, int | None], list[dict[str, Any]]]:
    def load(data_dir: Path | None, limit: int | None = None) -> list[dict[str, Any]]:
        # Generated, not read: the embedded testbed's held-out split needs no data directory. Its first N distinct
        # problems, as the trainer's evaluation with eval.limit=N takes them, so a run and `literl eval` agree.
        from literl.testbed.tasks import heldout_problems

        return heldout_problems(TESTBED_DEFAULT_PROBLEMS if limit is None else limit, tier=tier)
    return load


for _name, _tier in TESTBED_TIER_BENCHMARKS.items():
    register_benchmark(_name, _testbed_heldout(_tier), sized=True,
                       description=f"the embedded testbed's held-out arithmetic split ({_tier} tier), "
                                   f"{TESTBED_DEFAULT_PROBLEMS} problems, --limit N for N (raw template)")
