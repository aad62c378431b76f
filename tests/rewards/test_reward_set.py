"""RewardSet: weighted reward functions, accuracy from the first one, failures scored 0 and counted."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from literl.rewards import RewardSet, RewardWarning, load_reward_fn
from literl.rewards.functions import DEFAULT_REWARD_FN

EXAMPLES = [{"id": "a", "problem": "1+1", "answer": "2"}, {"id": "b", "problem": "2+2", "answer": "4"},
            {"id": "c", "problem": "3+3", "answer": "6"}]
RESPONSES = ["1+1=2\n\\boxed{2}", "2+2=5\n\\boxed{5}", "no answer at all"]


def test_default_math_accuracy_scores_in_process():
    rewards = RewardSet([(DEFAULT_REWARD_FN, 1.0)])
    scores_B, correct_B, metrics = rewards.score(RESPONSES, EXAMPLES)
    assert scores_B.dtype == torch.float32 and correct_B.dtype == torch.bool
    assert scores_B.tolist() == [1.0, 0.0, 0.0]
    assert correct_B.tolist() == [True, False, False]
    assert metrics == {"reward/math_accuracy/mean": pytest.approx(1 / 3), "reward/math_accuracy/timeouts": 0.0,
                       "reward/math_accuracy/errors": 0.0}
    assert rewards._runner is None             # a time-bounded function never starts the worker pool


def test_weights_add_and_the_first_function_decides_accuracy():
    """score = 1.0·accuracy + 0.5·min(1, len/100): for 'no answer at all' (16 chars) 0 + 0.5·0.16 = 0.08."""
    rewards = RewardSet([(DEFAULT_REWARD_FN, 1.0), ("sample_reward_fns:length_bonus", 0.5)])
    try:
        scores_B, correct_B, metrics = rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    bonus = [min(1.0, len(r) / 100) for r in RESPONSES]
    expected = [1.0 + 0.5 * bonus[0], 0.5 * bonus[1], 0.5 * bonus[2]]
    torch.testing.assert_close(scores_B, torch.tensor(expected))
    assert correct_B.tolist() == [True, False, False]
    assert metrics["reward/length_bonus/mean"] == pytest.approx(sum(bonus) / 3)


@pytest.mark.parametrize("path,kind", [("sample_reward_fns:always_raises", "errors"),
                                       ("sample_reward_fns:returns_nan", "errors"),
                                       ("sample_reward_fns:returns_text", "errors")])
def test_a_failing_function_scores_zero_counts_and_warns_once(path, kind):
    rewards = RewardSet([(path, 1.0)])
    try:
        with pytest.warns(RewardWarning) as caught:
            scores_B, correct_B, metrics = rewards.score(RESPONSES, EXAMPLES)
            rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    assert len(caught) == 1
    assert scores_B.tolist() == [0.0, 0.0, 0.0] and not correct_B.any()
    name = path.rpartition(":")[2]
    assert metrics[f"reward/{name}/{kind}"] == 3.0


def test_a_hanging_function_times_out_and_training_goes_on():
    rewards = RewardSet([("sample_reward_fns:sleeps_if_asked", 1.0)], timeout_s=0.5)
    responses = ["fast", "slow", "fast", "slow"]
    try:
        start = time.perf_counter()
        with pytest.warns(RewardWarning, match="ran past its time limit"):
            scores_B, _, metrics = rewards.score(responses, [EXAMPLES[0]] * 4)
        elapsed = time.perf_counter() - start
    finally:
        rewards.close()
    assert scores_B.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert metrics["reward/sleeps_if_asked/timeouts"] == 2.0
    assert metrics["reward/sleeps_if_asked/errors"] == 0.0
    assert elapsed < 10          # two deadlines of 0.5 s plus worker start-ups, never the 600 s sleep


def test_math_reward_inside_a_worker_checks_in_process():
    rewards = RewardSet([("sample_reward_fns:math_in_worker", 1.0)])
    try:
        scores_B, _, metrics = rewards.score(["\\boxed{\\frac{4}{2}}", "\\boxed{3}"], EXAMPLES[:1] * 2)
    finally:
        rewards.close()
    assert scores_B.tolist() == [1.0, 0.0] and metrics["reward/math_in_worker/errors"] == 0.0


def test_math_accuracy_timeouts_are_counted():
    rewards = RewardSet([(DEFAULT_REWARD_FN, 1.0)], timeout_s=0.5)
    with pytest.warns(RewardWarning, match="ran past"):
        scores_B, _, metrics = rewards.score(["\\boxed{7^{7^{7^{7^{7}}}}}"], [EXAMPLES[0]])
    assert scores_B.tolist() == [0.0]
    assert metrics["reward/math_accuracy/timeouts"] == 1.0


def test_callables_are_accepted_and_unisolatable_ones_warn():
    from sample_reward_fns import length_bonus

    rewards = RewardSet([(length_bonus, 1.0)])
    assert not rewards.entries[0].in_process and rewards.entries[0].path == "sample_reward_fns:length_bonus"
    with pytest.warns(RewardWarning, match="WITHOUT a time limit"):
        rewards = RewardSet([(lambda response, example: 1.0, 1.0)])
    assert rewards.score(["x"], [EXAMPLES[0]])[0].tolist() == [1.0]


@pytest.mark.parametrize("path,message", [
    ("literl.rewards.math_answer", "must look like 'package.module:function'"),
    ("literl.rewards.nope:math_accuracy", "cannot import module"),
    ("literl.rewards.math_answer:math_acuracy", "has no function 'math_acuracy'.*math_accuracy"),
    ("__main__:my_reward", "move it into a module"),
    ("sample_reward_fns:takes_one_argument", r"must accept \(response: str, example: dict\)"),
])
def test_load_reward_fn_errors(path, message):
    with pytest.raises(ValueError, match=message):
        load_reward_fn(path)


def test_bad_construction_and_mismatched_batches():
    with pytest.raises(ValueError, match="at least one"):
        RewardSet([])
    with pytest.raises(ValueError, match="distinct names"):
        RewardSet([(DEFAULT_REWARD_FN, 1.0), (DEFAULT_REWARD_FN, 0.5)])
    with pytest.raises(ValueError, match="finite number"):
        RewardSet([(DEFAULT_REWARD_FN, float("nan"))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rewards = RewardSet([(DEFAULT_REWARD_FN, 1.0)])
    with pytest.raises(ValueError, match="2 responses but 1 examples"):
        rewards.score(["a", "b"], [EXAMPLES[0]])
