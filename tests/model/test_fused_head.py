"""The LM head's tiles with their element-wise work compiled (`head.tile_statistics`, `head.tile_gradient`, what
`trainer.compile=true` runs on CUDA): the same arithmetic as the eager tiles, so log-probs, entropies and every
gradient agree with them within float32 rounding, for any tiling (a last token tile and a last vocabulary block
shorter than the others, targets in every block), temperature, with and without the entropy, and in bfloat16
over float32 weights (both read the same bf16 logits from the matmul). Nothing here needs a GPU: inductor compiles
the same graphs for the CPU."""

from __future__ import annotations

import pytest
import torch

from literl.model.capabilities import fuses_head_tiles
from literl.model.head import Tiling, head_logprobs, tile_gradient, tile_statistics

VOCAB, HIDDEN, TOKENS = 50, 32, 11


def _run(fused: bool, *, temperature: float, with_entropy: bool, tiling: Tiling, dtype=None):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=g))
    hidden = torch.randn(TOKENS, HIDDEN, generator=g).requires_grad_()
    target = torch.tensor([0, 49, 15, 16, 31, 32, 47, 48, 3, 20, 35])     # both ends of every 16-wide block
    logp, entropy = head_logprobs(head, hidden, target, temperature, with_entropy, tiling, dtype, fused=fused)
    weights = torch.linspace(-1.0, 1.0, TOKENS)
    loss = (weights * logp).sum() + (0.3 * (weights * entropy).sum() if with_entropy else 0.0)
    loss.backward()
    return logp.detach(), None if entropy is None else entropy.detach(), hidden.grad, head.weight.grad


@pytest.mark.parametrize("temperature, with_entropy", [(1.0, True), (0.7, True), (1.3, False)])
def test_fused_tiles_give_the_eager_tiles_values_and_gradients(temperature, with_entropy):
    """Tiles of 4 tokens × 16 vocabulary entries over 11 tokens and 50 entries: last tiles of 3 tokens and 2
    entries."""
    tiling = Tiling(tokens=4, vocab=16)
    fused = _run(True, temperature=temperature, with_entropy=with_entropy, tiling=tiling)
    eager = _run(False, temperature=temperature, with_entropy=with_entropy, tiling=tiling)
    for got, expected in zip(fused, eager):
        if expected is None:
            assert got is None
            continue
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert fused[0].shape == (TOKENS,) and (fused[0] < 0).all()


def test_fused_tiles_in_bfloat16_over_float32_weights_match_the_eager_ones():
    tiling = Tiling(tokens=4, vocab=16)
    fused = _run(True, temperature=0.7, with_entropy=True, tiling=tiling, dtype=torch.bfloat16)
    eager = _run(False, temperature=0.7, with_entropy=True, tiling=tiling, dtype=torch.bfloat16)
    assert fused[2].dtype == fused[3].dtype == torch.float32
    for got, expected in zip(fused, eager):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_one_tile_by_hand():
    """Two tokens over a 3-entry tile, temperature 2, from an empty running state (max −inf): logits
    z = [[2, 0, −2], [0, 0, 0]] / 2 = [[1, 0, −1], [0, 0, 0]]; targets 0 and 2 (both in the tile).
    Token 0: max 1, Σe^(z−1) = 1 + e⁻¹ + e⁻², Σe^(z−1)·z = 1 − e⁻²; token 1: max 0, Σ = 3, Σ·z = 0.
    Gradient of logp alone (g_logp = 1, no entropy): (onehot − softmax) / temperature."""
    zb = torch.tensor([[2.0, 0.0, -2.0], [0.0, 0.0, 0.0]])
    empty = torch.full((2,), float("-inf")), torch.zeros(2), torch.zeros(2), torch.zeros(2)
    local, in_tile = torch.tensor([0, 2]), torch.tensor([True, True])
    new_max, sum_exp, sum_exp_z, target_z = tile_statistics(zb, *empty, local, in_tile, 2.0, True)
    e1, e2 = torch.exp(torch.tensor(-1.0)), torch.exp(torch.tensor(-2.0))
    torch.testing.assert_close(new_max, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(sum_exp, torch.stack([1 + e1 + e2, torch.tensor(3.0)]))
    torch.testing.assert_close(sum_exp_z, torch.stack([1 - e2, torch.tensor(0.0)]))
    torch.testing.assert_close(target_z, torch.tensor([1.0, 0.0]))
    lse = new_max + sum_exp.log()
    grad = tile_gradient(zb, lse, sum_exp_z / sum_exp, local, in_tile, torch.ones(2), None, 2.0)
    softmax = torch.softmax(zb / 2.0, dim=-1)
    torch.testing.assert_close(grad, (torch.eye(3)[[0, 2]] - softmax) / 2.0)


def test_compiled_head_tiles_run_on_cuda_only_and_only_when_compiling():
    assert fuses_head_tiles(torch.device("cuda"), True)
    assert not fuses_head_tiles(torch.device("cuda"), False)
    assert not fuses_head_tiles(torch.device("cpu"), True)
