"""Rows that share a prompt: the prompt runs once, and log-probs, entropies and gradients stay those of the
plain full-row computation."""

from __future__ import annotations

import pytest
import torch

from literl.model import capabilities as capabilities_module, grouping, kernels, policy, prompts as model_prompts
from literl.model.capabilities import Capabilities, capabilities
from tests.conftest import build_tiny_qwen3, token_logprobs
from tests.training.test_logprobs import _direct, _loss_grads


def _grouped_batch(prompts, response_lens, vocab=100, seed=0):
    """Right-padded rows: prompt i (a list of ids) repeated for each response length in response_lens[i]."""
    g = torch.Generator().manual_seed(seed)
    rows = [(p, n) for p, lengths in zip(prompts, response_lens) for n in lengths]
    L = max(len(p) + n for p, n in rows)
    T = max(n for _, n in rows)
    tokens_BL = torch.zeros(len(rows), L, dtype=torch.long)
    mask_BT = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, (p, n) in enumerate(rows):
        tokens_BL[b, :len(p)] = torch.tensor(p)
        tokens_BL[b, len(p):len(p) + n] = torch.randint(3, vocab, (n,), generator=g)
        mask_BT[b, :n] = True
    return tokens_BL, torch.tensor([len(p) for p, _ in rows]), T, mask_BT


def _spy_on_shared_path(monkeypatch, model) -> list:
    """Sizes of the distinct-prompt sets the shared path ran on (after the model's one-off probe)."""
    capabilities(model).shared_prompts
    calls = []
    original = policy.response_hidden

    def spy(*args, **kwargs):
        calls.append(args[4].ids_UX.shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(policy, "response_hidden", spy)
    return calls


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("layer_by_layer", [True, False])
def test_shared_prompts_match_full_rows_values_and_grads(monkeypatch, temperature, layer_by_layer):
    """Three prompts of different lengths (left padding in the shared cache), groups of uneven response lengths,
    a one-token response (predicted from the prompt alone) and an empty one; for the hand-applied layers and
    for the decoder's own forward on a cache."""
    monkeypatch.setattr(Capabilities, "layers", property(lambda self: layer_by_layer))
    model = build_tiny_qwen3(seed=5)
    calls = _spy_on_shared_path(monkeypatch, model)
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch(
        [[5, 6, 7, 8], [9, 10], [11, 12, 13]], [[6, 1, 3], [4, 4], [0, 7, 2, 5]])
    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, temperature)
    ref_grads = _loss_grads(model, ref_logp, ref_ent, mask_BT)

    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=temperature, with_entropy=True,
                               mask_BT=mask_BT)
    assert calls == [3]
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[mask_BT], ref_ent[mask_BT], rtol=0, atol=1e-5)
    assert (logp[~mask_BT] == 0).all()
    for name, grad in _loss_grads(model, logp, ent, mask_BT).items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=1e-5, msg=name)


def test_buckets_in_any_order_land_on_their_rows(monkeypatch):
    """Every row in its own response forward, in reverse order: results still land on the right rows."""
    monkeypatch.setattr(grouping, "length_buckets",
                        lambda length_B: [torch.tensor([b]) for b in reversed(range(len(length_B)))])
    model = build_tiny_qwen3(seed=7)
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch([[4, 5, 6], [7, 8, 9, 10]], [[2, 5], [3, 1, 6]])
    ref_logp, _ = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, tokens_BL, prompt_len_B, T, mask_BT=mask_BT)
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)


def test_distinct_prompts_take_the_plain_path(monkeypatch):
    model = build_tiny_qwen3(seed=8)
    calls = _spy_on_shared_path(monkeypatch, model)
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch([[4, 5], [6, 7]], [[3], [2]])
    with torch.no_grad():
        token_logprobs(model, tokens_BL, prompt_len_B, T, mask_BT=mask_BT)
    assert calls == []


def test_a_decoder_that_rejects_a_cache_takes_the_plain_path(monkeypatch):
    """A model outside the hand-applied structure whose decoder raises on past_key_values: the once-per-model
    probe fails, so whole rows run."""
    monkeypatch.setattr(capabilities_module, "has_layer_structure", lambda model: False)
    model = build_tiny_qwen3(seed=9)
    decoder_forward = model.model.forward

    def no_cache(*args, past_key_values=None, **kwargs):
        if past_key_values is not None:
            raise TypeError("this decoder takes no cache")
        return decoder_forward(*args, **kwargs)

    monkeypatch.setattr(model.model, "forward", no_cache)
    calls = _spy_on_shared_path(monkeypatch, model)
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch([[4, 5, 6]], [[3, 5]])
    ref_logp, _ = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, tokens_BL, prompt_len_B, T, mask_BT=mask_BT)
    assert calls == [] and not capabilities(model).shared_prompts
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)


def test_attention_dropout_keeps_the_decoder_forward():
    """The hand-applied layers leave attention dropout out, so a model that has some uses its own forward."""
    assert capabilities(build_tiny_qwen3(seed=10)).layers
    assert not capabilities(build_tiny_qwen3(seed=10, attention_dropout=0.1)).layers


def test_hand_applied_prompt_pass_matches_the_decoders_own_forward():
    """`prompts_by_layers` (the prompts' pass through the layer body) against `prompts_by_model` (the decoder's
    forward on a cache): the same hidden states, keys and values at every real prompt position of left-padded
    prompts, and nothing but finite numbers at the padding (a NaN there would reach the responses)."""
    model = build_tiny_qwen3(seed=3)
    decoder = model.get_decoder()
    prompts = model_prompts.distinct_prompts([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], pad_id=0,
                                             device=torch.device("cpu"))
    with torch.no_grad():
        hidden, kv = model_prompts.prompts_by_layers(decoder, prompts)
        ref_hidden, ref_kv = model_prompts.prompts_by_model(decoder, prompts)
    real_UX = prompts.real_UX
    assert not bool(real_UX.all())      # the case has left padding
    torch.testing.assert_close(hidden[real_UX], ref_hidden[real_UX], rtol=0, atol=1e-5)
    for (keys, values), (ref_keys, ref_values) in zip(kv, ref_kv):
        for got, want in ((keys, ref_keys), (values, ref_values)):
            torch.testing.assert_close(got.transpose(1, 2)[real_UX], want.transpose(1, 2)[real_UX], rtol=0,
                                       atol=1e-5)
            assert bool(got.isfinite().all())
    assert bool(hidden.isfinite().all())


def test_rms_norm_backward_matches_autograd_of_the_module():
    """The hand-written backward against the Qwen3 norm module's own autograd, with a non-trivial weight, on a
    [rows, heads, D] input (as q_norm sees it); and numerically (float64 gradcheck)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(0)
    norm = Qwen3RMSNorm(8, eps=1e-6)
    norm.weight.data = torch.rand(8, generator=g) + 0.5
    x = torch.randn(3, 2, 8, generator=g, requires_grad=True)
    grad = torch.randn(3, 2, 8, generator=g)
    expected = torch.autograd.grad(norm(x), [x, norm.weight], grad)
    got_y = kernels.apply_norm(norm, x)
    torch.testing.assert_close(got_y, norm(x))
    for got, want in zip(torch.autograd.grad(got_y, [x, norm.weight], grad), expected):
        torch.testing.assert_close(got, want)
    x64 = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w64 = (torch.rand(5, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: kernels._RMSNorm.apply(a, b, 1e-6), (x64, w64))


def test_compiled_layers_match_the_eager_path_values_and_grads():
    """`compiled=True` (trainer.compile) runs the layers through torch.compile: the same log-probs, entropies and
    gradients as the eager hand-applied layers, on batches whose forwards have one row, a width of one, a
    one-token prompt, and rows == width; the graphs the first batch compiles (the responses' layers, the
    prompts' layers; fewer when an earlier test compiled them) serve them all: no recompile mid-run."""
    from torch._dynamo.utils import counters

    model = build_tiny_qwen3(seed=11)
    batches = [
        ([[5, 6, 7, 8], [9, 10], [11, 12, 13]], [[6, 1, 3], [4, 4], [0, 7, 2, 5]]),
        ([[5, 6, 7], [4, 4]], [[5, 5], [5, 5]]),      # 4 rows x width 4
        ([[5, 6, 7]], [[2, 2]]),                      # width 1
        ([[5, 6, 7]], [[6, 1]]),                      # one row
        ([[5], [4]], [[3, 3], [2, 4]]),               # one-token prompts
    ]
    counters.clear()
    graphs_after_first = None
    for prompts, lengths in batches:
        tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch(prompts, lengths)
        results = {}
        for compiled in (False, True):
            logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, with_entropy=True, mask_BT=mask_BT,
                                       compiled=compiled)
            results[compiled] = (logp, ent, _loss_grads(model, logp, ent, mask_BT))
        (eager_logp, eager_ent, eager_grads), (logp, ent, grads) = results[False], results[True]
        torch.testing.assert_close(logp, eager_logp, rtol=0, atol=1e-5)
        torch.testing.assert_close(ent, eager_ent, rtol=0, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, eager_grads[name], rtol=0, atol=1e-5, msg=name)
        if graphs_after_first is None:
            graphs_after_first = counters["stats"]["unique_graphs"]
    assert graphs_after_first <= 2 and counters["stats"]["unique_graphs"] == graphs_after_first


def test_rows_longer_than_a_sliding_window_take_the_plain_path(monkeypatch):
    """Mistral with a window of 16 passes the shared path's short probe; rows of up to 22 tokens would attend
    past the window there (log-prob errors ~1e-2), so they run through the model's own forward."""
    from tests.rollout.test_engine import _tiny_mistral

    model = _tiny_mistral(window=16)
    calls = _spy_on_shared_path(monkeypatch, model)
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch(
        [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [9, 10]], [[12, 5], [9, 3]])
    ref_logp, ref_ent = _direct(model, tokens_BL, prompt_len_B, T, 1.0)
    ref_grads = _loss_grads(model, ref_logp, ref_ent, mask_BT)
    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=1.0, with_entropy=True,
                               mask_BT=mask_BT)
    assert capabilities(model).shared_prompts and calls == []
    torch.testing.assert_close(logp[mask_BT], ref_logp[mask_BT], rtol=0, atol=1e-5)
    for name, grad in _loss_grads(model, logp, ent, mask_BT).items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=1e-5, msg=name)


def test_two_thread_gradients_of_shared_prompts_reproduce_bit_for_bit():
    """At 2 threads the same backward gives the same gradients, bit for bit, and the 1-thread ones: the G rows of
    a group add their gradients into their shared prompt's last hidden state in a fixed order. (Indexing's
    backward, an accumulating index_put, adds them in whichever order its 2 threads get there: for rows as wide as
    these, 16 prompts × 8 shuffled rows × 256 features, the default job's 2-thread updates did not reproduce
    themselves.)"""
    model = build_tiny_qwen3(seed=7, hidden_size=256, num_hidden_layers=1, intermediate_size=64)
    prompts = [[5 + i, 6 + i % 7, 7] for i in range(16)]
    tokens_BL, prompt_len_B, T, mask_BT = _grouped_batch(prompts, [[3, 5, 1, 4, 6, 2, 5, 3]] * 16, seed=2)
    # Rows in a shuffled order, as a micro-batch sorted by length holds them: each thread's share of the rows
    # then reaches every prompt.
    order = torch.randperm(len(tokens_BL), generator=torch.Generator().manual_seed(0))
    tokens_BL, prompt_len_B, mask_BT = tokens_BL[order], prompt_len_B[order], mask_BT[order]
    threads = torch.get_num_threads()

    def grads():
        logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, with_entropy=True, mask_BT=mask_BT)
        return _loss_grads(model, logp, ent, mask_BT)

    try:
        torch.set_num_threads(1)
        one_thread = grads()
        torch.set_num_threads(2)
        runs = [grads() for _ in range(4)]
    finally:
        torch.set_num_threads(threads)
    for run in runs:
        for name, grad in run.items():
            assert torch.equal(grad, one_thread[name]), name
