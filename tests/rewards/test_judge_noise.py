"""The noisy judge's error term (`literl.rewards.judge_noise.judge_noise`): deterministic per (problem, text),
uniform over distinct texts, unrelated to correctness, and beside the correctness check a small graded term."""

from __future__ import annotations

import hashlib
import statistics

import torch

from literl.rewards import RewardSet
from literl.rewards.judge_noise import judge_noise


def test_the_score_is_the_blake2b_digest_of_problem_and_text_as_a_fraction():
    """Problem "1+1", response "2": blake2b(b"1+1\\x002", 8 bytes) read big-endian over 2⁶⁴."""
    digest = hashlib.blake2b(b"1+1\x002", digest_size=8).digest()
    assert judge_noise("2", {"problem": "1+1"}) == int.from_bytes(digest, "big") / 2.0 ** 64
    assert judge_noise("2", None) == judge_noise("2", {})


def test_one_text_always_scores_the_same_and_another_problem_scores_it_differently():
    assert judge_noise("4+5=9\n\\boxed{9}", {"problem": "4+5"}) == judge_noise("4+5=9\n\\boxed{9}", {"problem": "4+5"})
    assert judge_noise("4+5=9\n\\boxed{9}", {"problem": "4+5"}) != judge_noise("4+5=9\n\\boxed{9}", {"problem": "5+4"})


def test_distinct_texts_score_uniformly_on_the_unit_interval():
    """4,000 texts differing in one number: mean 0.5 and std 1/√12 = 0.2887 within sampling error (the mean's
    standard error is 0.0046, so ±0.02 is over 4 of them), every score in [0, 1), a tenth in each tenth (±3 %)."""
    scores = [judge_noise(f"x={i}", {"problem": "p"}) for i in range(4000)]
    assert all(0.0 <= s < 1.0 for s in scores)
    assert abs(statistics.fmean(scores) - 0.5) < 0.02
    assert abs(statistics.pstdev(scores) - 12 ** -0.5) < 0.01
    deciles = [sum(int(s * 10) == d for s in scores) / len(scores) for d in range(10)]
    assert all(abs(share - 0.1) < 0.03 for share in deciles)


def test_a_small_noise_weight_grades_equally_correct_responses_without_deciding_accuracy():
    """math_accuracy (weight 1) + 0.1 · noise: each score is correctness + 0.1 × its text's noise, and only the
    correctness check decides `correct`."""
    rewards = RewardSet([("literl.rewards.math_answer:math_accuracy", 1.0),
                         ("literl.rewards.judge_noise:judge_noise", 0.1)], n_workers=0)
    texts = ["\\boxed{7}", "so \\boxed{7}", "\\boxed{8}"]
    examples = [{"problem": "3+4", "answer": "7"}] * 3
    scores, correct, _ = rewards.score(texts, examples)
    expected = [c + 0.1 * judge_noise(t, e) for t, e, c in zip(texts, examples, (1.0, 1.0, 0.0))]
    torch.testing.assert_close(torch.as_tensor(scores, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64))
    assert [bool(c) for c in correct] == [True, True, False]
    rewards.close()
