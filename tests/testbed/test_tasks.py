"""The synthetic arithmetic task family: determinism, splits, tiers, worked solutions, slips, scoring."""

from __future__ import annotations

import re

import pytest

from literl.testbed.tasks import (MAX_VALUE, TIERS, expression_text, extract_boxed_integer, heldout_problems,
                                  is_correct, make_problems, solution_steps, train_problems)

STEP_LINE = re.compile(r"^(\d+)([+\-*])(\d+)=(-?\d+)$")
RECORD_KEYS = {"id", "problem", "answer", "solution", "tier", "num_ops", "difficulty"}


def _steps(solution: str) -> tuple[list[tuple[int, str, int, int]], str]:
    *lines, last = solution.split("\n")
    parsed = []
    for line in lines:
        match = STEP_LINE.match(line)
        assert match, f"malformed step line {line!r}"
        a, op, b, c = match.groups()
        parsed.append((int(a), op, int(b), int(c)))
    return parsed, last


def _true(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_same_seed_same_problems_and_different_seed_different_problems():
    first = make_problems(50, split="train", seed=3, slip_rate=0.15)
    again = make_problems(50, split="train", seed=3, slip_rate=0.15)
    other = make_problems(50, split="train", seed=4, slip_rate=0.15)
    assert first == again
    assert [r["problem"] for r in first] != [r["problem"] for r in other]


def test_records_have_the_documented_fields_and_the_prompt_ends_with_a_newline():
    for record in train_problems(20, seed=0) + heldout_problems(20):
        assert set(record) == RECORD_KEYS
        assert record["problem"].startswith("What is ") and record["problem"].endswith("?\n")
        assert isinstance(record["answer"], str)
        assert record["solution"].endswith(f"\\boxed{{{record['answer']}}}")


def test_train_and_heldout_are_disjoint_for_every_tier_and_seed():
    for tier in TIERS:
        heldout = {r["problem"] for r in heldout_problems(200, tier=tier)}
        train = {r["problem"] for seed in (0, 1) for r in train_problems(1000, tier=tier, seed=seed)}
        assert len(heldout) == 200, "held-out problems are distinct"
        assert not heldout & train


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_tiers_have_their_documented_op_counts_and_operand_sizes(tier):
    spec = TIERS[tier]
    records = train_problems(600, tier=tier, seed=1)
    ops = {r["num_ops"] for r in records}
    assert ops == set(range(spec.min_ops, spec.max_ops + 1)), "every op count of the tier occurs"
    assert all(r["difficulty"] == spec.difficulty(r["num_ops"]) for r in records)
    assert spec.ops_per_label > 1 or all(r["difficulty"] == f"{r['num_ops']}_ops" for r in records)
    operands = [int(x) for r in records for x in re.findall(r"\d+", r["problem"])]
    assert all(1 <= x <= MAX_VALUE for x in operands)
    two_digit = sum(x >= 10 for x in operands) / len(operands)
    # Expressions leaving 0-99 are redrawn, and those hold more two-digit operands, so the share that
    # survives (18-27%) is below the drawing probability.
    assert spec.two_digit_rate - 0.2 < two_digit < spec.two_digit_rate
    assert {r["tier"] for r in records} == {tier}


def test_hard_has_more_operations_and_two_digit_operands_than_easy():
    def profile(tier):
        records = train_problems(500, tier=tier, seed=2)
        operands = [int(x) for r in records for x in re.findall(r"\d+", r["problem"])]
        return sum(r["num_ops"] for r in records) / 500, sum(x >= 10 for x in operands) / len(operands)

    easy_ops, easy_two = profile("easy")
    hard_ops, hard_two = profile("hard")
    assert hard_ops > easy_ops + 1.5 and hard_two > easy_two


def test_clean_solutions_are_right_in_every_step_and_in_range():
    for record in train_problems(500, seed=5):
        steps, last = _steps(record["solution"])
        assert len(steps) == record["num_ops"]
        for a, op, b, c in steps:
            assert _true(a, op, b) == c
            assert 0 <= c <= MAX_VALUE
        assert last == f"\\boxed{{{steps[-1][3]}}}"
        assert is_correct(record["solution"], record["answer"])


def test_products_come_first_then_left_to_right():
    """3+4*5-2: the product 4*5=20 first, then 3+20=23, then 23-2=21."""
    steps, answer = solution_steps([3, 4, 5, 2], ["+", "*", "-"])
    assert steps == [(4, "*", 5, 20), (3, "+", 20, 23), (23, "-", 2, 21)]
    assert answer == 21
    assert expression_text([3, 4, 5, 2], ["+", "*", "-"]) == "3+4*5-2"


def test_out_of_range_intermediate_values_are_rejected():
    """3-5+9 goes negative at 3-5=-2; 12*9=108 is over 99: neither expression is generated."""
    assert solution_steps([3, 5, 9], ["-", "+"]) is None
    assert solution_steps([12, 9], ["*"]) is None


def test_slips_occur_at_about_the_requested_rate_and_are_carried_forward():
    records = train_problems(2000, seed=7, slip_rate=0.15)
    total = slipped = 0
    for record in records:
        steps, last = _steps(record["solution"])
        written = [c for *_, c in steps]
        for k, (a, op, b, c) in enumerate(steps):
            total += 1
            if _true(a, op, b) != c:
                slipped += 1
                assert 0 <= c <= MAX_VALUE
                # the wrong value is an operand of a later step, or it is the final answer
                later_operands = [x for a2, _, b2, _ in steps[k + 1:] for x in (a2, b2)]
                assert c in later_operands or k == len(steps) - 1
        assert last == f"\\boxed{{{written[-1]}}}", "the boxed answer is the last written value"
    assert 0.12 < slipped / total < 0.18
    wrong_answers = sum(not is_correct(r["solution"], r["answer"]) for r in records)
    assert wrong_answers > 0.2 * len(records), "slips change the final answer"


def test_heldout_solutions_never_carry_slips():
    assert all(is_correct(r["solution"], r["answer"]) for r in heldout_problems(200))


@pytest.mark.parametrize("response, answer, expected", [
    ("4*5=20\n3+20=23\n\\boxed{23}", "23", True),
    ("\\boxed{23}", 23, True),
    ("\\boxed{ 23 }", "23", True),
    ("\\boxed{023}", "23", True),          # an integer match, not a string match
    ("\\boxed{22}", "23", False),
    ("\\boxed{23}\n\\boxed{22}", "23", False),  # the last box counts
    ("\\boxed{22} then \\boxed{23}", "23", True),
    ("the answer is 23", "23", False),     # no box, no credit
    ("\\boxed{23.0}", "23", False),        # exact integers only
    ("\\boxed{2 3}", "23", False),
    ("\\boxed{}", "23", False),
    ("\\boxed{-4}", "-4", True),
    ("\\boxed{23", "23", False),           # unclosed (truncated) box
])
def test_is_correct_hand_cases(response, answer, expected):
    assert is_correct(response, answer) is expected


def test_extract_boxed_integer_returns_none_without_an_integer_box():
    assert extract_boxed_integer("\\boxed{x}") is None
    assert extract_boxed_integer("") is None
    assert extract_boxed_integer("\\boxed{7}") == 7


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="split"):
        make_problems(1, split="test", seed=0)
    with pytest.raises(ValueError, match="tier"):
        make_problems(1, split="train", tier="expert", seed=0)
    with pytest.raises(ValueError, match="slip_rate"):
        make_problems(1, split="train", seed=0, slip_rate=1.0)
