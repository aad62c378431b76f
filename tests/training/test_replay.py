"""The update's forward replayed from the rollout's record: the log-probs, entropies and gradients of the plain
path, on the rows of any micro-batch, and the plain path whenever the record cannot stand in."""

from __future__ import annotations

import pytest
import torch

from literl.model import forward, grouping
from literl.model.record import Recorder, ReplayedProjections
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3, token_logprobs
from tests.rollout.test_engine import MANY_EOS, PAD, _prompts
from tests.rollout.test_recording import _tiny_qwen2
from tests.training.test_logprobs import _loss_grads


def _rollout(model, prompts, max_new_tokens=16, seed=0):
    """A recorded generation laid out as a training batch: (tokens_BL, prompt_len_B, T, mask_BT, record)."""
    engine = NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, recorder=Recorder(model, 2 << 30))
    gen = engine.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=max_new_tokens, keep_forward=True),
                          rng=torch.Generator().manual_seed(seed))
    mask_BT = gen.mask_BT.clone()
    B, T = mask_BT.shape
    tokens_BL = torch.full((B, max(len(p) for p in prompts) + T), PAD, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        n = int(mask_BT[b].sum())
        tokens_BL[b, :len(prompt)] = torch.tensor(prompt)
        tokens_BL[b, len(prompt):len(prompt) + n] = gen.response_ids_BT[b, :n]
    return tokens_BL, torch.tensor([len(p) for p in prompts]), T, mask_BT, gen.forward_record


def _spy(monkeypatch) -> list:
    calls = []
    original = forward.replayed_responses

    def spy(*args, **kwargs):
        calls.append(args[5].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(forward, "replayed_responses", spy)
    return calls


def _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record, temperature=0.8, compiled=False):
    logp, ent = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=temperature, with_entropy=True,
                               mask_BT=mask_BT, record=record, compiled=compiled)
    return logp, ent, _loss_grads(model, logp, ent, mask_BT)


def _spy_record_slices(monkeypatch) -> list[bool]:
    """Per call of `forward.record_slices`: whether the record could be read in place (slices of its memory)."""
    in_place = []
    original = forward.record_slices

    def spy(layers, record_row_M):
        sliced, rows = original(layers, record_row_M)
        in_place.append(rows is None and all(
            got.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            for got_layer, layer in zip(sliced, layers) for got, buffer in zip(got_layer, layer)))
        return sliced, rows

    monkeypatch.setattr(forward, "record_slices", spy)
    return in_place


@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "by-length"])
@pytest.mark.parametrize("build", [lambda: build_tiny_qwen3(seed=6), lambda: _tiny_qwen2(seed=6)],
                         ids=["qwen3", "qwen2-biases"])
def test_replay_gives_the_plain_paths_values_and_grads(monkeypatch, build, one_pass):
    """Groups of three prompt lengths, responses of every length down to one token (no fed token), rows dropped
    from the rollout's batch as they finish; the whole batch in one pass (reading the record in place), or in
    by-length groups of rows (gathering their record rows)."""
    model = build()
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=2) * 2)
    lengths = mask_BT.sum(-1)
    assert int(lengths.min()) <= 2 and int(lengths.max()) == T
    plain = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, None)
    calls, in_place = _spy(monkeypatch), _spy_record_slices(monkeypatch)
    if not one_pass:
        monkeypatch.setattr(grouping, "REPLAY_ONE_PASS_TOKENS", 0)
        monkeypatch.setattr(grouping, "CPU_FORWARD_TOKENS", 24)
    replayed = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    if one_pass:
        assert in_place == [True], "the whole batch's tokens are consecutive record rows, read in place"
    else:
        assert len(calls) >= 2 and not all(in_place), "groups of rows gather their (scattered) record rows"
    torch.testing.assert_close(replayed[0][mask_BT], plain[0][mask_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(replayed[1][mask_BT], plain[1][mask_BT], rtol=0, atol=1e-5)
    assert (replayed[0][~mask_BT] == 0).all()
    for name, grad in replayed[2].items():
        torch.testing.assert_close(grad, plain[2][name], rtol=0, atol=1e-5, msg=name)


def test_a_micro_batch_of_rows_in_any_order_replays_its_own_rows(monkeypatch):
    """The batch's record is selected with its rows (as `TrainBatch.micro_batches` does): every subset lands on
    its own record rows."""
    model = build_tiny_qwen3(seed=7)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=3) * 2, seed=3)
    rows = torch.tensor([7, 0, 12, 3, 9])
    sub = (tokens_BL[rows], prompt_len_B[rows], T, mask_BT[rows])
    plain = _logprobs_and_grads(model, *sub, None)
    calls = _spy(monkeypatch)
    replayed = _logprobs_and_grads(model, *sub, record.select(rows))
    assert calls
    torch.testing.assert_close(replayed[0], plain[0], rtol=0, atol=1e-5)
    for name, grad in replayed[2].items():
        torch.testing.assert_close(grad, plain[2][name], rtol=0, atol=1e-5, msg=name)


def test_without_autograd_the_record_alone_gives_the_log_probs(monkeypatch):
    """An old-log-prob pass (no grad) before the first optimizer step: the hidden states are the embedding plus
    the recorded residual outputs, no layer recomputed; the plain path's values."""
    model = build_tiny_qwen3(seed=11)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=7) * 2, seed=7)
    with torch.no_grad():
        plain, _ = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=0.8, mask_BT=mask_BT)
        calls = _spy(monkeypatch)
        replayed, _ = token_logprobs(model, tokens_BL, prompt_len_B, T, temperature=0.8, mask_BT=mask_BT,
                                     record=record)
    assert calls
    torch.testing.assert_close(replayed, plain, rtol=0, atol=1e-5)


def test_the_plain_path_runs_once_the_weights_have_moved(monkeypatch):
    """After an optimizer step the record no longer describes the policy: the forward is computed."""
    model = build_tiny_qwen3(seed=8)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=4) * 2, seed=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    optimizer.step()
    calls = _spy(monkeypatch)
    after = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    plain = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, None)
    assert calls == [] and record.valid()
    torch.testing.assert_close(after[0], plain[0], rtol=0, atol=0)


def test_compiled_replay_matches_eager(monkeypatch):
    """trainer.compile runs the replayed layers through torch.compile: same values and gradients."""
    model = build_tiny_qwen3(seed=9)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=5) * 3, seed=5)
    eager = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    compiled = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record, compiled=True)
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=1e-5)
    for name, grad in compiled[2].items():
        torch.testing.assert_close(grad, eager[2][name], rtol=0, atol=1e-5, msg=name)


def test_replayed_projections_backward_is_the_linear_layers():
    """∂x = g·[W₁; W₂], ∂Wᵢ = gᵢᵀ·x, ∂bᵢ = Σ gᵢ: against autograd through F.linear (a bias on one of the two)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=g, requires_grad=True)
    first, second = torch.nn.Linear(4, 3, bias=True), torch.nn.Linear(4, 2, bias=False)
    expected = torch.cat([first(x), second(x)], -1)
    grad = torch.randn(5, 5, generator=g)
    want = torch.autograd.grad(expected, [x, first.weight, first.bias, second.weight], grad)
    got_y = ReplayedProjections.apply(x, expected.detach(), first.weight, first.bias, second.weight, None)
    torch.testing.assert_close(got_y, expected.detach(), rtol=0, atol=0)
    got = torch.autograd.grad(got_y, [x, first.weight, first.bias, second.weight], grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_bfloat16_policy_replays_in_its_own_dtype(monkeypatch):
    """model.dtype=bfloat16 with a bf16 engine (no copy): the record is kept in bf16 and the replayed update
    gives the computed one's values and gradients within bf16 rounding."""
    model = build_tiny_qwen3(seed=10).to(torch.bfloat16)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=6) * 2, seed=6)
    assert record.layers[0][0].dtype == torch.bfloat16
    plain = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, None)
    calls = _spy(monkeypatch)
    replayed = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    assert calls
    torch.testing.assert_close(replayed[0][mask_BT], plain[0][mask_BT], rtol=0, atol=0.1)
    for name, grad in replayed[2].items():
        scale = float(plain[2][name].float().abs().max()) + 1e-3
        assert float((grad.float() - plain[2][name].float()).abs().max()) <= 0.1 * scale, name


def test_a_float64_policy_replays_in_its_own_dtype(monkeypatch):
    """The CPU flash kernel keeps a float64 model's log-sum-exp in float64 (a half-precision one's in float32): the
    record keeps it so, and the replayed update matches the computed one."""
    model = build_tiny_qwen3(seed=11).to(torch.float64)
    tokens_BL, prompt_len_B, T, mask_BT, record = _rollout(model, _prompts(seed=7) * 2, seed=7)
    assert [buffer.dtype for buffer in record.layers[0]] == [torch.float64] * 6
    plain = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, None)
    calls = _spy(monkeypatch)
    replayed = _logprobs_and_grads(model, tokens_BL, prompt_len_B, T, mask_BT, record)
    assert calls
    torch.testing.assert_close(replayed[0][mask_BT], plain[0][mask_BT], rtol=0, atol=1e-9)
    for name, grad in replayed[2].items():
        torch.testing.assert_close(grad, plain[2][name], rtol=0, atol=1e-9, msg=name)
