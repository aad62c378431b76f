"""Repetition of truncated responses (algorithms.md §8.2.7): the periodic-tail share, by hand and batched."""

from __future__ import annotations

import pytest
import torch

from literl.algorithm.diagnostics.mechanisms import (MechanismDiagnostics, repeated_suffix_fraction,
                                          repeated_suffix_fractions)


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_hand_computed_tails():
    assert repeated_suffix_fraction(_ids("ababab")) == 1.0
    assert repeated_suffix_fraction(_ids("xyzab")) == 0.0
    # "xyz" + "ababab": period 2 runs back 4 comparisons (b=b, a=a, b=b, a=a, then b≠z): tail 4 + 2 = 6 of 9;
    # period 4 gives a tail of 6 < 2·4 full periods, which does not count
    assert repeated_suffix_fraction(_ids("xyzababab")) == 6 / 9
    assert repeated_suffix_fraction(_ids("aaaa")) == 1.0
    assert repeated_suffix_fraction(_ids("a")) == 0.0          # no period fits twice
    assert repeated_suffix_fraction([]) == 0.0
    # a tail longer than max_period's loops still counts through a shorter period that divides it
    assert repeated_suffix_fraction(_ids("qabcabcabc"), max_period=3) == 9 / 10
    assert repeated_suffix_fraction(_ids("qabcabcabc"), max_period=2) == 0.0


def test_batched_rows_of_different_lengths_match_each_row_alone():
    g = torch.Generator().manual_seed(0)
    texts = ["ababab", "xyzababab", "xyzab", "a", "", "qabcabcabc", "mnopmnopmnopz"]
    rows = [_ids(t) for t in texts] + [torch.randint(0, 3, (n,), generator=g).tolist() for n in (5, 17, 40)]
    L = max(len(r) for r in rows) + 3
    ids_NL = torch.zeros(len(rows), L, dtype=torch.long)
    mask_NL = torch.zeros(len(rows), L, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids_NL[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask_NL[i, :len(r)] = True
    got = repeated_suffix_fractions(ids_NL, mask_NL)
    expected = torch.tensor([_one_row(r) for r in rows], dtype=torch.float64)
    assert torch.equal(got, expected), (got, expected)


def _one_row(y: list[int]) -> float:
    """The definition, row by row, as a reference."""
    n, best = len(y), 0
    for p in range(1, n // 2 + 1):
        run = 0
        while run < n - p and y[n - 1 - run] == y[n - 1 - run - p]:
            run += 1
        if run + p >= 2 * p:
            best = max(best, run + p)
    return best / n if n else 0.0


def test_observe_rollout_splits_truncated_rows_by_reward():
    class Batch:
        response_ids_BT = torch.tensor([_ids("abababab"), _ids("abcdefgh"), _ids("zzzzzzzz"), _ids("abababab")])
        mask_BT = torch.ones(4, 8, dtype=torch.bool)
        truncated_B = torch.tensor([True, True, True, False])
        correct_B = torch.tensor([True, False, False, True])

    out = MechanismDiagnostics().observe_rollout(Batch())
    assert out["repetition/truncated_repetitive_frac"] == pytest.approx(2 / 3)
    assert out["repetition/truncated_repetitive_frac_correct"] == 1.0
    assert out["repetition/truncated_repetitive_frac_wrong"] == 0.5
