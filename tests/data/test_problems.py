"""Loading problem sets: normalisation, skipped rows, and errors that name the problem and the fix."""

from __future__ import annotations

import json
import time

import pytest

from literl.data.benchmarks import benchmark_names, register_benchmark
from literl.data.files import write_jsonl_atomic
from literl.data.problems import DataWarning, MissingFieldError, answer_text, load_problems

EXPECTED_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272, "olympiadbench": 675,
                  "gsm8k": 1319, "math_test": 5000, "simplerl_easy": 8388, "simplerl_medium": 8139,
                  "dapo17k": 17917, "deepmath": 4994}


@pytest.mark.parametrize("name", sorted(EXPECTED_SIZES))
def test_builtin_benchmarks_load_with_string_answers(shared_data, name):
    problems = load_problems(name, data_dir=shared_data)
    assert len(problems) == EXPECTED_SIZES[name] and problems.name == name
    first = problems[0]
    assert set(first) >= {"id", "problem", "answer"}
    assert all(isinstance(p["answer"], str) and p["answer"] for p in problems)
    assert all(isinstance(p["id"], str) for p in problems)


def test_rows_without_answer_are_skipped_and_reported(shared_data):
    """MATH train has two rows with an empty boxed answer (MANIFEST: train-5341, train-5343)."""
    with pytest.warns(DataWarning, match=r"skipped 2 of 7500 rows .*train-5341, train-5343"):
        problems = load_problems("math_train", data_dir=shared_data)
    assert len(problems) == 7498 and problems.skipped_ids == ["train-5341", "train-5343"]
    with pytest.warns(DataWarning, match="skipped 2 of 8523"):
        assert len(load_problems("simplerl_hard", data_dir=shared_data)) == 8521


def test_data_dir_from_environment(shared_data, monkeypatch):
    monkeypatch.setenv("LITERL_DATA_DIR", str(shared_data))
    assert len(load_problems("aime24", limit=5)) == 5


def test_missing_data_dir_says_how_to_set_it(monkeypatch, tmp_path):
    monkeypatch.delenv("LITERL_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="--data-dir DIR .* LITERL_DATA_DIR"):
        load_problems("math500")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_problems("math500", data_dir=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="expects math500/test.jsonl"):
        load_problems("math500", data_dir=tmp_path)


def test_unknown_benchmark_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown problem set 'math5000'.*aime24.*math500"):
        load_problems("math5000")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="mine.jsonl does not exist"):
        load_problems(tmp_path / "mine.jsonl")


def test_file_with_custom_fields_and_conversions(tmp_path):
    path = tmp_path / "custom.jsonl"
    rows = [{"qid": 7, "question": "What is 2+2?", "target": 4.0, "level": 1},
            {"qid": 8, "question": "Name it.", "target": ["\\frac{1}{2}"]},
            {"qid": 9, "question": "No answer here", "target": None},
            {"qid": 10, "question": "Blank answer", "target": "  "}]
    write_jsonl_atomic(path, rows)
    with pytest.warns(DataWarning, match=r"skipped 2 of 4 rows .*ids: 9, 10"):
        problems = load_problems(path, problem_field="question", answer_field="target", id_field="qid")
    assert problems.records == [
        {"id": "7", "problem": "What is 2+2?", "answer": "4", "level": 1},
        {"id": "8", "problem": "Name it.", "answer": "\\frac{1}{2}"},
    ]
    assert problems.name == "custom"


def test_wrong_field_lists_the_fields_present(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl_atomic(path, [{"id": 1, "question": "q", "answer": "1"}])
    with pytest.raises(MissingFieldError, match="no problem field 'problem'; its fields are: answer, id, question"):
        load_problems(path)


def test_rows_without_ids_are_numbered(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl_atomic(path, [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}])
    assert [p["id"] for p in load_problems(path)] == ["0", "1"]


def test_bad_json_line_is_located(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl, line 2: not valid JSON"):
        load_problems(path)


def test_parquet_and_json_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": "x", "problem": "p", "answer": "3"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    (tmp_path / "p.json").write_text(json.dumps(rows), encoding="utf-8")
    assert load_problems(tmp_path / "p.parquet").records == rows
    assert load_problems(tmp_path / "p.json").records == rows


def test_hub_dataset_offline_gives_a_clear_error():
    """Offline, with the datasets library (./run.sh installs it): the load fails fast and says to pass a local file.
    Without it (e.g. a bare GPU image): the error names the library and how to install it."""
    import importlib.util

    start = time.perf_counter()
    if importlib.util.find_spec("datasets") is None:
        expected, match = ImportError, "'literl-test/no-such-set' needs the datasets library: pip install"
    else:
        expected, match = RuntimeError, "could not load Hugging Face dataset 'literl-test/no-such-set'.*local"
    with pytest.raises(expected, match=match):
        load_problems("literl-test/no-such-set")
    assert time.perf_counter() - start < 30


def test_register_benchmark():
    register_benchmark("unit_test_set", lambda data_dir: [{"id": 1, "problem": "1+1", "answer": 2}],
                       description="for this test", replace=True)
    assert "unit_test_set" in benchmark_names()
    assert load_problems("unit_test_set").records == [{"id": "1", "problem": "1+1", "answer": "2"}]
    with pytest.raises(ValueError, match="already registered"):
        register_benchmark("unit_test_set", lambda data_dir: [])
    with pytest.raises(ValueError, match="letters, digits"):
        register_benchmark("bad name", lambda data_dir: [])


@pytest.mark.parametrize("value,text", [(27.0, "27"), (2.5, "2.5"), (204, "204"), (" 7 ", "7"), (None, ""),
                                        (["a"], "a"), (["1", "2"], "1, 2"), ("", ""), (-3.0, "-3"), (-0.0, "0")])
def test_answer_text(value, text):
    assert answer_text(value) == text


@pytest.mark.parametrize("value,text", [(1e-05, "0.00001"), (-1.5e-07, "-0.00000015"), (0.1, "0.1"),
                                        (0.1 + 0.2, "0.30000000000000004"), (1e300, "1" + "0" * 300)])
def test_float_answers_are_positional_without_binary_noise(value, text):
    assert answer_text(value) == text


def test_named_fields_win_over_columns_that_share_the_normalised_names(tmp_path):
    """Issue 31.1: a Hugging Face set often carries several answer columns. With data.problem_field=question and
    data.answer_field=final, the row's own `problem`/`answer` columns must not overwrite the mapped ones (the run
    trained on gold 999999 before), and an `id` column must not overwrite id_field's value."""
    path = tmp_path / "several.jsonl"
    write_jsonl_atomic(path, [{"qid": "q7", "id": "other-7", "question": "What is 25+7*1?", "final": "32",
                               "problem": "What is 1+1?", "answer": "999999", "level": 2}])
    record = load_problems(path, problem_field="question", answer_field="final", id_field="qid")[0]
    assert (record["id"], record["problem"], record["answer"]) == ("q7", "What is 25+7*1?", "32")
    assert record["level"] == 2


@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf"), {"v": 32}, [{"v": 32}], [True]],
                         ids=["true", "false", "nan", "inf", "dict", "list-of-dict", "list-of-bool"])
def test_answers_that_are_not_a_value_are_skipped_and_reported(tmp_path, value):
    """Issue 31.13: true, NaN and a dict became the gold strings "True", "nan" and "{'v': 32}", silently: no
    response can match them (or a wrong one does). They are skipped and counted as empty answers are."""
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"id": "odd", "problem": "What is 4*8?", "answer": value}) + "\n"
                    + json.dumps({"id": "fine", "problem": "What is 1+1?", "answer": 2}) + "\n")
    with pytest.warns(DataWarning, match=r"skipped 1 of 2 rows .*ids: odd"):
        problems = load_problems(path)
    assert [p["id"] for p in problems] == ["fine"] and problems.skipped_ids == ["odd"]


def test_a_file_that_starts_with_a_utf8_byte_order_mark_is_read(tmp_path):
    """Issue 31.14: Windows editors save UTF-8 with a BOM; the file was refused ("not valid JSON")."""
    rows = [{"id": "1", "problem": "What is 1+1?", "answer": "2"}]
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(rows[0]).encode() + b"\n")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode())
    assert load_problems(tmp_path / "bom.jsonl").records == rows
    assert load_problems(tmp_path / "bom.json").records == rows


def test_terminal_escapes_in_skipped_ids_are_printed_escaped(tmp_path):
    """Issue 31.15: ids come from the data; an id holding `ESC[2J` cleared the user's terminal when warned about."""
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps({"id": "\x1b[2J\x1b]0;owned\x07", "problem": "p", "answer": ""}) + "\n"
                    + json.dumps({"id": "ok", "problem": "p", "answer": "1"}) + "\n")
    with pytest.warns(DataWarning) as caught:
        load_problems(path)
    message = str(caught[0].message)
    assert "\x1b" not in message and "\x07" not in message
    assert "\\x1b[2J\\x1b]0;owned\\x07" in message


def test_the_testbed_benchmark_generates_as_many_problems_as_the_limit_asks_like_training_does():
    """`literl eval --benchmarks testbed --limit 1000` scores the first 1,000 distinct held-out problems, the set a
    run with eval.limit=1000 evaluated (it once truncated a fixed 200 silently); no limit: 200; a smaller limit:
    the first N of them."""
    from literl.data.problems import load_problems
    from literl.testbed.tasks import heldout_problems

    large = load_problems("testbed", limit=1000)
    assert len(large) == 1000 and len({r["problem"] for r in large}) == 1000
    assert [r["problem"] for r in large] == [r["problem"] for r in heldout_problems(1000)]
    assert len(load_problems("testbed")) == 200
    assert [r["problem"] for r in load_problems("testbed_long", limit=5)] == [
        r["problem"] for r in heldout_problems(5, tier="long")]


def test_a_sized_benchmark_gets_the_limit_and_a_plain_one_is_truncated():
    register_benchmark("unit_sized_set", lambda data_dir, limit: [{"id": i, "problem": f"{i}+1", "answer": i + 1}
                                                                  for i in range(limit or 3)], sized=True)
    register_benchmark("unit_plain_set", lambda data_dir: [{"id": i, "problem": f"{i}+1", "answer": i + 1}
                                                           for i in range(3)])
    assert len(load_problems("unit_sized_set")) == 3 and len(load_problems("unit_sized_set", limit=7)) == 7
    assert len(load_problems("unit_plain_set", limit=7)) == 3 and len(load_problems("unit_plain_set", limit=2)) == 2
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load_problems("unit_sized_set", limit=-1)
