"""Chunked token log-probs and entropies equal the direct full-logits computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from literl.model import grouping, head
from tests.conftest import build_tiny_qwen3, token_logprobs


def _batch(prompt_lens, response_lens, vocab=100, seed=0):
    """Right-padded rows of prompt + response with uneven lengths (pad 0)."""
    g = torch.Generator().manual_seed(seed)
    L = max(p + r for p, r in zip(prompt_lens, response_lens))
    T = max(response_lens)
    tokens_BL = torch.zeros(len(prompt_lens), L, dtype=torch.long)
    mask_BT = torch.zeros(len(prompt_lens), T, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        tokens_BL[b, :p + r] = torch.randint(3, vocab, (p + r,), generator=g)
        mask_BT[b, :r] = True
    return tokens_BL, torch.tensor(prompt_lens), T, mask_BT


def _direct(model, tokens_BL, prompt_len_B, T, temperature):
    """The reference: full logits, log_softmax, and H = lse − Σ p·z at every response position."""
    z_BLV = model(input_ids=tokens_BL).logits.float() / temperature
    B, L, V = z_BLV.shape
    pos_BT = (prompt_len_B[:, None] - 1 + torch.arange(T)[None, :]).clamp(max=L - 2)
    z_BTV = z_BLV.gather(1, pos_BT[:, :, None].expand(B, T, V))
    target_BT = tokens_BL.gather(1, pos_BT + 1)
    logp_BTV = torch.log_softmax(z_BTV, -1)
    entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    return logp_BTV.gather(-1, target_BT[..., None]).squeeze(-1), entropy_BT


def _loss_grads(model, logp_BT, entropy_BT, mask_BT):
    """A loss that uses both outputs with uneven token weights, so every gradient path is exercised."""
    w_BT = torch.linspace(-1.0, 2.0, mask_BT.numel()).view(mask_BT.shape) * mask_BT
    loss = (w_BT * logp_BT).sum() + 0.3 * (w_BT * entropy_BT).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("chunk_tokens, vocab_block", [(1, None), (7, 13), (None, 64), (None, None)])
def test_chunked_matches_direct_values_and_grads(use_mask, chunk_tokens, vocab_block):
    model = build_tiny_qwen3(seed=3)
    tokens_BL, prompt_len_B, T, mask_BT = _batch([3, 7, 1, 5], [6, 2, 9, 4])
    temperature = 0.7

    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, temperature)
    ref_grads = _loss_grads(model, ref_logp, ref_ent, mask_BT)

    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=temperature, with_entropy=True,
                               chunk_tokens=chunk_tokens, vocab_block=vocab_block,
                               mask_BT=mask_BT if use_mask else None)
    assert logp.shape == ent.shape == (4, T) and logp.dtype == torch.float32
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask_BT], ref_ent[mask_BT], rtol=0, atol=1e-5)
    if use_mask:
        assert (logp[~mask_BT] == 0).all() and (ent[~mask_BT] == 0).all()
    grads = _loss_grads(model, logp, ent, mask_BT)
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=1e-5, msg=name)
    # the tied embedding / head weight receives both its input and its output gradient
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_no_grad_pass_and_logp_only():
    model = build_tiny_qwen3(seed=1)
    tokens_BL, prompt_len_B, T, mask_BT = _batch([2, 4], [5, 3], seed=1)
    ref_logp, _ = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    with torch.no_grad():
        logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, chunk_tokens=3)
    assert ent is None and not logp.requires_grad
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)


def _forbid_chunked_head(monkeypatch):
    def fail(*args):
        raise AssertionError("the chunked head was used")
    monkeypatch.setattr(head.ChunkedHeadLogprobs, "apply", fail)


def test_softcapped_head_takes_the_direct_path(monkeypatch):
    """A config with logit soft-capping is not a plain linear head: the model's own forward is used."""
    _forbid_chunked_head(monkeypatch)
    model = build_tiny_qwen3(seed=2)
    model.config.final_logit_softcapping = 30.0   # Qwen3 ignores it, so both paths still agree here
    tokens_BL, prompt_len_B, T, mask_BT = _batch([3, 2], [4, 4], seed=2)
    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, with_entropy=True)
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask_BT], ref_ent[mask_BT], rtol=0, atol=1e-5)


def test_head_that_disagrees_with_forward_takes_the_direct_path(monkeypatch):
    """A model whose forward rescales the logits fails the one-off probe, so its own logits are used."""
    from transformers import Qwen3ForCausalLM

    class ScaledLogits(Qwen3ForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out

    from tests.conftest import tiny_qwen3_config
    torch.manual_seed(4)
    model = ScaledLogits(tiny_qwen3_config())
    _forbid_chunked_head(monkeypatch)
    tokens_BL, prompt_len_B, T, mask_BT = _batch([2, 3], [3, 5], seed=4)
    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, with_entropy=True)
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask_BT], ref_ent[mask_BT], rtol=0, atol=1e-5)


def test_length_buckets_hand_cases():
    """lengths [10, 100, 10, 100]: one group costs 4·100 + c, two groups 2·100 + 2·10 + 2c, so c = 5 splits
    them (230 < 405) and c = 1000 does not (1400 < 2220)."""
    lengths = torch.tensor([10, 100, 10, 100])
    groups = grouping.length_buckets(lengths, overhead_tokens=5)
    assert [sorted(g.tolist()) for g in groups] == [[1, 3], [0, 2]]
    assert [sorted(g.tolist()) for g in grouping.length_buckets(lengths, overhead_tokens=1000)] == [[0, 1, 2, 3]]
    many = torch.randint(1, 90, (300,), generator=torch.Generator().manual_seed(0))
    groups = grouping.length_buckets(many, max_buckets=4)
    assert len(groups) <= 4 and torch.equal(torch.cat(groups).sort().values, torch.arange(300))


def test_rows_grouped_by_length_keep_their_order(monkeypatch):
    """With every row in its own decoder call, in reverse order, results still land on the right rows."""
    monkeypatch.setattr(grouping, "length_buckets", lambda length_B: [torch.tensor([b]) for b in
                                                                        reversed(range(len(length_B)))])
    model = build_tiny_qwen3(seed=6)
    tokens_BL, prompt_len_B, T, mask_BT = _batch([4, 2, 6], [3, 7, 1], seed=6)
    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    ref_grads = _loss_grads(model, ref_logp, ref_ent, mask_BT)
    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, with_entropy=True, mask_BT=mask_BT)
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask_BT], ref_ent[mask_BT], rtol=0, atol=1e-5)
    for name, g in _loss_grads(model, logp, ent, mask_BT).items():
        torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=1e-5, msg=name)
