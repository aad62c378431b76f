"""Loss masks (§4.1)."""

from __future__ import annotations

import torch

from literl.algorithm.tricks import LOSS_MASKS


def test_overlong_hand():
    """mask [[1,1,0],[1,1,1],[0,0,0]], truncated [False, True, False]: row 1 (cut by the cap) is dropped,
    row 0 (EOS) kept, row 2 stays empty: keep = [[1,1,0],[0,0,0],[0,0,0]]."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    keep = LOSS_MASKS.get("overlong")(mask, torch.tensor([False, True, False]))
    assert keep.dtype == torch.bool
    assert keep.tolist() == [[True, True, False], [False, False, False], [False, False, False]]


HAND_CASES = {"overlong": test_overlong_hand}


def test_overlong_only_removes():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(8, 5, generator=g) > 0.3
    keep = LOSS_MASKS.get("overlong")(mask, torch.rand(8, generator=g) > 0.5)
    assert not (keep & ~mask).any()
