"""Reward functions in literl's, TRL's and verl's conventions, told apart by their signatures."""

from __future__ import annotations

import pytest

from literl.rewards import RewardSet, RewardWarning
from literl.rewards.conventions import detect_convention

EXAMPLES = [{"id": "a", "problem": "1+1", "answer": "2"}, {"id": "b", "problem": "2+22", "answer": "4"},
            {"id": "c", "problem": "3+3", "answer": "6", "data_source": "bonus"}]
RESPONSES = ["1+1=2\n\\boxed{2}", "2+2=5\n\\boxed{5}", "no answer at all"]


def literl_style(response, example):
    return 1.0


def trl_style(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def trl_named_columns(completions, solution, **kwargs):
    return [1.0] * len(completions)


def verl_style(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def anything(*args, **kwargs):
    return 1.0


def both_marks(completions, solution_str):
    return 1.0


def one_argument(response):
    return 1.0


@pytest.mark.parametrize("fn,convention", [(literl_style, "literl"), (trl_style, "trl"),
                                           (trl_named_columns, "trl"), (verl_style, "verl")])
def test_the_signature_tells_the_convention(fn, convention):
    assert detect_convention(fn) == convention


@pytest.mark.parametrize("fn,message", [
    (anything, r"ambiguous signature.*literl or as trl or as verl.*reward.fns.<i>.convention"),
    (both_marks, r"ambiguous signature.*trl or as verl"),
    (one_argument, r"must accept \(response: str, example: dict\)"),
])
def test_a_signature_that_fits_several_conventions_or_none_is_an_error_with_the_fix(fn, message):
    with pytest.raises(ValueError, match=message):
        detect_convention(fn)


def test_a_declared_convention_settles_an_ambiguous_signature_and_is_checked():
    assert detect_convention(anything, "trl") == "trl"
    with pytest.raises(ValueError, match="declared verl"):
        detect_convention(literl_style, "verl")


def test_trl_functions_score_the_batch_with_the_records_fields_as_columns():
    """trl_boxed_answer: 1 when \\boxed{answer} is in the completion -> [1, 0, 0]; trl_prompt_length: the prompt
    is the problem text -> [3, 4, 3]. Both run in a worker process, by path."""
    rewards = RewardSet([("sample_reward_fns:trl_boxed_answer", 1.0), ("sample_reward_fns:trl_prompt_length", 0.5)])
    try:
        scores_B, correct_B, metrics = rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    assert [e.convention for e in rewards.entries] == ["trl", "trl"]
    assert scores_B.tolist() == [1.0 + 0.5 * 3, 0.5 * 4, 0.5 * 3]
    assert correct_B.tolist() == [True, False, False]
    assert metrics["reward/trl_boxed_answer/errors"] == 0.0


def test_trl_functions_get_the_conversational_format_with_a_chat_template():
    """As TRL does for conversational data: prompts are message lists, completions [{"role": "assistant", ...}]."""
    seen = {}

    def conversational(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[0]["content"].endswith("}")) for c in completions]

    with pytest.warns(RewardWarning, match="WITHOUT a time limit"):
        rewards = RewardSet([(conversational, 1.0)],
                            chat_messages=lambda ex: [{"role": "system", "content": "S"},
                                                      {"role": "user", "content": ex["problem"]}])
    scores_B, _, _ = rewards.score(RESPONSES, EXAMPLES)
    assert scores_B.tolist() == [1.0, 1.0, 0.0]
    assert seen["prompts"][1] == [{"role": "system", "content": "S"}, {"role": "user", "content": "2+22"}]
    assert seen["completions"][2] == [{"role": "assistant", "content": "no answer at all"}]


def test_a_trl_function_naming_a_missing_column_is_a_setup_error_not_zero_rewards():
    rewards = RewardSet([("sample_reward_fns:trl_needs_solution", 1.0)])
    with pytest.raises(ValueError, match=r"needs the column\(s\) solution.*answer, data_source, id"):
        rewards.score(RESPONSES, EXAMPLES)
    rewards.close()


def test_a_trl_function_returning_the_wrong_count_scores_zero_and_warns():
    rewards = RewardSet([("sample_reward_fns:trl_wrong_length", 1.0)])
    try:
        with pytest.warns(RewardWarning, match="returned 1 rewards for 3 completions"):
            scores_B, _, metrics = rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    assert scores_B.tolist() == [0.0, 0.0, 0.0] and metrics["reward/trl_wrong_length/errors"] == 3.0


def test_none_from_a_trl_function_means_not_applicable_and_counts_zero():
    rewards = RewardSet([("sample_reward_fns:trl_not_applicable", 1.0)])
    try:
        scores_B, _, metrics = rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    assert scores_B.tolist() == [1.0, 1.0, 0.0] and metrics["reward/trl_not_applicable/errors"] == 0.0


@pytest.mark.parametrize("by_path", [True, False])
def test_verl_compute_score_gets_source_response_gold_and_record(by_path):
    """compute_score: 1 for \\boxed{ground_truth} in the response, +0.5 when data_source == "bonus" (the third
    record's field; the others have none, so "") -> [1.0, 0.0, 0.5]; the dict result gives its "score"."""
    from sample_reward_fns import compute_score

    rewards = RewardSet([("sample_reward_fns:compute_score" if by_path else compute_score, 1.0)])
    try:
        scores_B, correct_B, metrics = rewards.score(RESPONSES, EXAMPLES)
    finally:
        rewards.close()
    assert rewards.entries[0].convention == "verl" and not rewards.entries[0].in_process
    assert scores_B.tolist() == [1.0, 0.0, 0.5] and correct_B.tolist() == [True, False, True]
    assert metrics["reward/compute_score/errors"] == 0.0


def test_a_verl_function_run_in_process_is_called_by_keyword():
    calls = []

    def closure_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, ground_truth, extra_info["id"]))
        return float(ground_truth in solution_str)

    with pytest.warns(RewardWarning, match="WITHOUT a time limit"):
        rewards = RewardSet([(closure_score, 1.0)])
    assert rewards.score(RESPONSES, EXAMPLES)[0].tolist() == [1.0, 0.0, 0.0]
    assert calls == [("", "2", "a"), ("", "4", "b"), ("bonus", "6", "c")]
