"""sample_next_token on crafted logits: the support of top-k / top-p, the reported log-prob, greedy, seeding."""

from __future__ import annotations

import math

import pytest
import torch

from literl.rollout.engine import SamplingParams
from literl.rollout.sampling import (filter_top_k_top_p, gumbel_noise, sample_from_uniform, sample_next_token,
                                     uniform_noise)

PROBS = [0.4, 0.3, 0.2, 0.1]


def _logits(rows=4000):
    """Rows of logits whose softmax is PROBS (log-probs shifted by a constant, which softmax ignores)."""
    return (torch.tensor(PROBS).log() + 3.0).expand(rows, -1).clone()


def _draw(params, rows=4000, seed=0):
    token_B, logp_B = sample_next_token(_logits(rows), params, torch.Generator().manual_seed(seed))
    return token_B, logp_B


@pytest.mark.parametrize("top_k, top_p, support", [
    (0, 1.0, {0, 1, 2, 3}),
    (2, 1.0, {0, 1}),            # the two most likely tokens
    (0, 0.5, {0, 1}),            # mass before token 1 is 0.4 < 0.5, before token 2 is 0.7 >= 0.5
    (0, 0.4, {0}),               # token 0 alone reaches 0.4
    (0, 0.05, {0}),              # the most likely token always stays
    (3, 0.75, {0, 1}),           # top-k renormalises to [4/9, 3/9, 2/9]: mass before token 2 is 7/9 >= 0.75
])
def test_top_k_top_p_support(top_k, top_p, support):
    token_B, _ = _draw(SamplingParams(top_k=top_k, top_p=top_p))
    assert set(token_B.tolist()) == support


def test_frequencies_follow_the_renormalised_distribution():
    """top_k=2 renormalises [0.4, 0.3] to [4/7, 3/7]; 20000 draws land within 4 standard errors."""
    token_B, _ = _draw(SamplingParams(top_k=2), rows=20000)
    freq = (token_B == 0).float().mean().item()
    assert abs(freq - 4 / 7) < 4 * math.sqrt((4 / 7) * (3 / 7) / 20000)


def test_reported_logp_is_full_vocabulary_at_temperature():
    """logp = log softmax(z / T) over all tokens, whatever top-k / top-p kept: T=2 gives log(p^0.5 / Σ p^0.5)."""
    params = SamplingParams(temperature=2.0, top_k=2, top_p=0.9)
    token_B, logp_B = _draw(params, rows=200)
    tempered = torch.tensor(PROBS).sqrt()
    expected = (tempered / tempered.sum()).log()
    torch.testing.assert_close(logp_B, expected[token_B])


def test_greedy_and_seeding():
    token_B, logp_B = _draw(SamplingParams(greedy=True), rows=5)
    assert token_B.tolist() == [0] * 5
    torch.testing.assert_close(logp_B, torch.full((5,), math.log(0.4)))
    a, _ = _draw(SamplingParams(), seed=1)
    b, _ = _draw(SamplingParams(), seed=1)
    c, _ = _draw(SamplingParams(), seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_given_noise_decides_the_sample():
    """With Gumbel noise g the sample is argmax(log q + g): a large g on a token makes it win."""
    noise_BV = torch.zeros(2, 4)
    noise_BV[0, 3] = 20.0
    noise_BV[1, 2] = 20.0
    token_B, _ = sample_next_token(_logits(2), SamplingParams(), gumbel_BV=noise_BV)
    assert token_B.tolist() == [3, 2]
    token_B, _ = sample_next_token(_logits(2), SamplingParams(top_k=2), gumbel_BV=noise_BV)
    assert token_B.tolist() == [0, 0]                    # filtered tokens never win, whatever the noise


def test_filter_keeps_values_of_allowed_tokens():
    logp_1V = torch.tensor([PROBS]).log()
    allowed = filter_top_k_top_p(logp_1V, top_k=3, top_p=1.0)
    assert torch.equal(allowed[0, :3], logp_1V[0, :3]) and allowed[0, 3] == float("-inf")


def test_uniform_draw_gives_the_same_sample_as_gumbel_noise_from_the_same_stream():
    """The engine draws U eagerly and the (compiled) step turns it into −log(−log U): the same random stream, and
    the same tokens, as drawing the Gumbel noise directly."""
    logits_BV = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    for params in (SamplingParams(), SamplingParams(top_k=5, top_p=0.9, temperature=0.7)):
        expected = sample_next_token(logits_BV, params,
                                     gumbel_BV=gumbel_noise(6, 50, device=logits_BV.device,
                                                            rng=torch.Generator().manual_seed(3)))
        got = sample_from_uniform(logits_BV, params,
                                  uniform_noise(6, 50, device=logits_BV.device, rng=torch.Generator().manual_seed(3)))
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    token_B, _ = sample_from_uniform(logits_BV, SamplingParams(greedy=True), None)
    assert torch.equal(token_B, logits_BV.argmax(-1))
