"""The 4-bit weight-only engine (rollout.dtype=int4): rounding by hand, and a larger gap than FP8's."""

from __future__ import annotations

import copy

import pytest
import torch

from literl.model.quantize import _rounded_int4, fake_quantize_, fake_quantize_fp8_, fake_quantize_int4_


def test_int4_rounding_hand():
    """Groups of 32 inputs, scale max|w| / 7. Group 0: [14, 5.2, −3, 0…] → s = 2, levels [7, 2.6→3, −1.5→−2]
    (round half to even) → [14, 6, −4]. Group 1: [0.875, −0.3125, 0.0625, 0…] → s = 0.125, levels [7, −2.5→−2,
    0.5→0] → [0.875, −0.25, 0]. A row of 20 inputs is one group: [3.5, 1, 0…] → s = 0.5 → [3.5, 1]."""
    w = torch.zeros(1, 64)
    w[0, :3] = torch.tensor([14.0, 5.2, -3.0])
    w[0, 32:35] = torch.tensor([0.875, -0.3125, 0.0625])
    expected = torch.zeros(1, 64)
    expected[0, :3] = torch.tensor([14.0, 6.0, -4.0])
    expected[0, 32:35] = torch.tensor([0.875, -0.25, 0.0])
    torch.testing.assert_close(_rounded_int4(w), expected)
    odd = torch.zeros(1, 20)
    odd[0, :2] = torch.tensor([3.5, 1.0])
    torch.testing.assert_close(_rounded_int4(odd), odd)


def test_an_int4_engine_is_further_from_the_trainer_than_an_fp8_one():
    from tests.conftest import build_tiny_qwen3

    model = build_tiny_qwen3().eval()
    ids = torch.randint(3, 100, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits.log_softmax(-1)

        def gap(round_):
            copy_ = round_(copy.deepcopy(model))
            return float((copy_(ids).logits.log_softmax(-1) - reference).abs().mean())

        fp8, int4 = gap(fake_quantize_fp8_), gap(fake_quantize_int4_)
    assert int4 > 3 * fp8 > 0
    assert torch.equal(model.lm_head.weight, fake_quantize_int4_(copy.deepcopy(model)).lm_head.weight), \
        "embeddings and the head are kept"
    with pytest.raises(ValueError, match="int8"):
        fake_quantize_(model, "int8")
