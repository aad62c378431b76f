"""Every benchmark's gold answer, written as a model response ending in `\\boxed{gold}`, must score correct.

This checks the whole reward pipeline on real answers (balanced-brace extraction of matrices, intervals,
escaped set braces, `\\text{}`, units, ...) and then the comparison. Most golds come back verbatim and are
decided by the fast path; a sample is also run through Math-Verify itself, which the fast path would
otherwise hide.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from literl.data.problems import load_problems
from literl.rewards.math_answer import check_with_math_verify, is_equivalent, math_reward

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench", "gsm8k")
E_NOTATION = re.compile(r"([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)")


def as_response(gold: str) -> str:
    return f"Let me work through this step by step.\nSo we get the result.\nThe answer is $\\boxed{{{gold}}}$."


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_gold_answers_score_correct(shared_data, benchmark):
    problems = load_problems(benchmark, data_dir=shared_data)
    failures = [p["id"] for p in problems if math_reward(as_response(p["answer"]), p["answer"]) != 1.0]
    rate = 1 - len(failures) / len(problems)
    print(f"{benchmark}: {100 * rate:.1f}% of {len(problems)} gold answers score correct; failures {failures[:10]}")
    assert rate >= 0.99


def test_math_verify_accepts_gold_answers_on_a_sample(shared_data):
    """Every 10th gold of each benchmark, compared with itself by Math-Verify (no fast path)."""
    sample = [p["answer"] for name in BENCHMARKS for p in load_problems(name, data_dir=shared_data)[::10]]
    failures = [gold for gold in sample if not check_with_math_verify(gold, gold)]
    rate = 1 - len(failures) / len(sample)
    print(f"Math-Verify self-agreement on {len(sample)} sampled golds: {100 * rate:.1f}%; failures {failures}")
    assert rate >= 0.99


def test_minerva_scientific_golds_match_their_other_spellings(shared_data):
    """Minerva's `8.7e8` golds against `870000000`, `8.7 \\times 10^{8}` and `8.7E8`, in both roles."""
    golds = [p["answer"] for p in load_problems("minerva", data_dir=shared_data) if E_NOTATION.fullmatch(p["answer"])]
    assert len(golds) >= 50                                          # 58 of 272 in the shared file
    failures = []
    for gold in golds:
        mantissa, exponent = E_NOTATION.fullmatch(gold).groups()
        positional = format(Decimal(gold), "f")
        positional = positional.rstrip("0").rstrip(".") if "." in positional else positional
        for spelling in (positional, f"{mantissa} \\times 10^{{{exponent}}}", gold.upper()):
            if math_reward(as_response(spelling), gold) != 1.0 or not is_equivalent(gold, spelling):
                failures.append((gold, spelling))
    assert not failures, f"{len(failures)} of {3 * len(golds)} spellings do not match: {failures[:10]}"
