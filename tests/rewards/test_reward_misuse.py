"""Rewards that would teach the wrong thing silently, and steps that could spend minutes checking (issue 22)."""

from __future__ import annotations

import time

import pytest

from literl.rewards import RewardSet, RewardWarning, time_bounded
from literl.rewards.isolation import IsolatedRunner

EXAMPLE = {"id": "e", "problem": "1+1", "answer": "2"}


@time_bounded
def returns_the_answer_text(response: str, example: dict, *, timeout_s: float = 5.0):
    """A common slip: returning the extracted answer ("2") instead of a score; float("2") would make it 2.0."""
    return response.strip()


def test_a_reward_returned_as_a_string_scores_zero_and_is_counted():
    rewards = RewardSet([(returns_the_answer_text, 1.0)])
    with pytest.warns(RewardWarning, match="returned str '2', not a number"):
        scores_B, _, metrics = rewards.score(["2", "1.0"], [EXAMPLE, EXAMPLE])
    assert scores_B.tolist() == [0.0, 0.0]
    assert metrics["reward/returns_the_answer_text/errors"] == 2.0


def test_a_steps_checking_time_is_bounded_by_its_budget():
    """Six hanging checks of 1 s each on one worker would take 6 s; a step budget of 1.5 s stops after it: the
    first call times out at 1 s, the second at the budget, the other four are not started. All six score 0 and
    count as timeouts."""
    rewards = RewardSet([("sample_reward_fns:sleeps_if_asked", 1.0)], timeout_s=1.0, step_timeout_s=1.5,
                        n_workers=1)
    rewards._runner = IsolatedRunner(1)
    rewards._runner.map("sample_reward_fns:sleeps_if_asked", [("fast", EXAMPLE)], 30.0)   # start-up: not timed
    try:
        start = time.perf_counter()
        with pytest.warns(RewardWarning, match="ran past its time limit"):
            scores_B, _, metrics = rewards.score(["slow"] * 6, [EXAMPLE] * 6)
        elapsed = time.perf_counter() - start
    finally:
        rewards.close()
    assert scores_B.tolist() == [0.0] * 6 and metrics["reward/sleeps_if_asked/timeouts"] == 6.0
    assert elapsed < 1.5 + 2.0          # the budget, plus killing and restarting a worker on a loaded machine


def test_a_time_bounded_function_gets_only_what_is_left_of_the_budget():
    """In-process checks (the default math reward) are told the time left; at 0 they run their cheap checks
    only, so answers the fast path decides still score, and skipped slow checks count as timeouts."""
    seen = []

    @time_bounded
    def records_its_budget(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
        seen.append(timeout_s)
        time.sleep(0.3)
        return 1.0

    rewards = RewardSet([(records_its_budget, 1.0)], timeout_s=5.0, step_timeout_s=0.5)
    rewards.score(["a", "b", "c"], [EXAMPLE] * 3)
    assert seen[0] == pytest.approx(0.5, abs=0.05) and 0 <= seen[1] < 0.25 and seen[2] == 0.0

    from literl.rewards.math_answer import math_accuracy

    before = math_accuracy.timeout_counter()
    assert math_accuracy("\\boxed{2}", EXAMPLE, timeout_s=0.0) == 1.0            # decided by its text: scored
    assert math_accuracy("\\boxed{\\frac{4}{2}}", EXAMPLE, timeout_s=0.0) == 0.0  # needs Math-Verify: skipped
    assert math_accuracy.timeout_counter() == before + 1


# ------------------------------------------------------------------------------------------ issue 31.9
@pytest.mark.parametrize("response,problem", [("huge", "OverflowError"), ("no_float", "no float for you"),
                                              ("float32_inf", "1e\\+39.*float32")])
def test_a_reward_value_that_cannot_become_a_float32_scores_zero_and_is_counted(response, problem):
    """Issue 31.9: 10**400 (OverflowError) and an object whose __float__ raises, returned from a worker, killed the
    run; 1e39 (finite in float64, inf in float32) gave `reward/mean: null`. Each now scores 0, counted, the
    function named."""
    rewards = RewardSet([("sample_reward_fns:returns_hostile_values", 1.0)], n_workers=1)
    try:
        with pytest.warns(RewardWarning, match=f"returns_hostile_values.*{problem}"):
            scores_B, _, metrics = rewards.score([response, "ok"], [EXAMPLE, EXAMPLE])
    finally:
        rewards.close()
    assert scores_B.tolist() == [0.0, 0.5]
    assert metrics["reward/returns_hostile_values/errors"] == 1.0
    assert metrics["reward/returns_hostile_values/mean"] == 0.25


@time_bounded
def returns_a_float32_overflow(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    return 1e39


def test_an_in_process_reward_beyond_float32_scores_zero_and_is_counted():
    rewards = RewardSet([(returns_a_float32_overflow, 1.0)])
    with pytest.warns(RewardWarning, match="1e\\+39.*float32"):
        scores_B, _, metrics = rewards.score(["a"], [EXAMPLE])
    assert scores_B.tolist() == [0.0] and metrics["reward/returns_a_float32_overflow/errors"] == 1.0


def test_a_worker_result_that_cannot_be_read_back_scores_zero_and_the_worker_serves_on():
    """An exception instance that the parent cannot unpickle (`_receive`) used to end the run with a TypeError."""
    rewards = RewardSet([("sample_reward_fns:returns_an_unreadable_exception", 1.0)], n_workers=1)
    try:
        with pytest.warns(RewardWarning, match="could not be read back"):
            scores_B, _, metrics = rewards.score(["a", "b"], [EXAMPLE, EXAMPLE])
        assert rewards._runner.call("sample_reward_fns:length_bonus", ("x" * 50, EXAMPLE), 30.0).value == 0.5
    finally:
        rewards.close()
    assert scores_B.tolist() == [0.0, 0.0]
    assert metrics["reward/returns_an_unreadable_exception/errors"] == 2.0


# ------------------------------------------------------------------------------------------ issue 31.10
def test_rewards_that_fail_on_every_response_batch_after_batch_stop_the_run():
    """Issue 31.10: a hung TRL-style batched reward cost reward.step_timeout_s every step, forever, with zero
    signal. After `max_failed_batches` scored batches in a row in which every reward timed out or failed, scoring
    raises RewardsFailing naming the functions and the setting; a batch with one usable reward resets the count."""
    from literl.rewards import RewardsFailing

    rewards = RewardSet([("sample_reward_fns:trl_hangs", 1.0)], timeout_s=0.2, step_timeout_s=0.5, n_workers=1,
                        max_failed_batches=2)
    try:
        with pytest.warns(RewardWarning, match="ran past its time limit"):
            scores_B, _, _ = rewards.score(["a", "b"], [EXAMPLE, EXAMPLE])
        assert scores_B.tolist() == [0.0, 0.0]
        start = time.perf_counter()
        with pytest.raises(RewardsFailing, match=r"2 scored batches in a row.*trl_hangs.*reward.max_failed_batches"):
            rewards.score(["a", "b"], [EXAMPLE, EXAMPLE])
        assert time.perf_counter() - start < 0.5 + 5.0
    finally:
        rewards.close()


def test_one_usable_reward_in_a_batch_resets_the_failure_count():
    @time_bounded
    def fails_unless_told(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
        if response != "fine":
            raise ValueError("judge unreachable")
        return 1.0

    rewards = RewardSet([(fails_unless_told, 1.0)], max_failed_batches=2)
    with pytest.warns(RewardWarning):
        for responses in (["x", "y"], ["x", "fine"], ["x", "y"], ["fine", "y"], ["x", "y"]):
            rewards.score(responses, [EXAMPLE] * 2)
    with pytest.raises(Exception, match="2 scored batches in a row"):
        rewards.score(["x", "y"], [EXAMPLE] * 2)


# ------------------------------------------------------------------------------------------ issue 31.15
@time_bounded
def echoes_the_response_in_its_error(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    raise ValueError(f"cannot parse {response}")


def test_terminal_escapes_in_a_reward_error_are_printed_escaped():
    """Issue 31.15: a reward's error text can embed model output; OSC title/clipboard and screen-clearing
    sequences in it reached the terminal raw."""
    rewards = RewardSet([(echoes_the_response_in_its_error, 1.0)])
    hostile = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J"
    with pytest.warns(RewardWarning) as caught:
        rewards.score([hostile], [EXAMPLE])
    message = str(caught[0].message)
    assert "\x1b" not in message and "\x07" not in message and "\\x1b]52;c;cm0gLXJmIH4=\\x07" in message
