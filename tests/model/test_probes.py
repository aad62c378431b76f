"""Capability probes never downgrade silently: the tolerance follows the compute dtype, a failed probe says why
(once), an out-of-memory or accelerator error is raised, and Routing Replay runs on bfloat16 models."""

from __future__ import annotations

import logging

import pytest
import torch

from literl.model import capabilities as caps_module
from literl.model.capabilities import (ProbeMismatch, _probing, capabilities, is_backend_error, micro_batch_tokens,
                                       probe_tolerance, tokens_for_memory)
from literl.model.moe import ROLLOUT_ROUTES
from literl.model.policy import PolicyForward
from tests.conftest import build_tiny_qwen3
from tests.model.test_routing_replay import _batch, _qwen3_moe


def test_probe_tolerance_follows_the_compute_dtype():
    """float32/64 keep the given tolerance; bfloat16 gets 8 × 2⁻⁷ = 0.0625, float16 8 × 2⁻¹⁰ = 0.0078125, and never
    less than the float32 tolerance."""
    assert probe_tolerance(torch.float32, 1e-3) == 1e-3
    assert probe_tolerance(torch.float64, 1e-4) == 1e-4
    assert probe_tolerance(torch.bfloat16, 1e-3) == 0.0625
    assert probe_tolerance(torch.float16, 1e-4) == 0.0078125
    assert probe_tolerance(torch.float16, 0.01) == 0.01


def test_a_failed_probe_says_why_and_answers_no(caplog):
    """A mismatch and an error that says the mode does not fit are a "no" with the reason in the log."""
    model = build_tiny_qwen3()

    def mismatch(model):
        raise ProbeMismatch("max |difference| 0.5 from the model's own forward")

    def missing_part(model):
        return model.no_such_part

    with caplog.at_level(logging.WARNING, logger="literl.model.capabilities"):
        assert _probing(model, "the test mode", mismatch) is False
        assert _probing(model, "the other mode", missing_part) is False
        assert _probing(model, "a good mode", lambda model: True) is True
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "the test mode is not used for Qwen3ForCausalLM: max |difference| 0.5" in messages[0]
    assert "the other mode" in messages[1] and "AttributeError" in messages[1]


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("CUDA error: an illegal memory access was encountered"),
                                   RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")])
def test_an_out_of_memory_or_backend_error_in_a_probe_is_raised(error):
    model = build_tiny_qwen3()

    def failing(model):
        raise error

    assert is_backend_error(error)
    with pytest.raises(type(error)):
        _probing(model, "a mode", failing)
    assert not is_backend_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x32 and 16x32)"))


def test_a_probe_runs_once_per_model_and_logs_once(caplog, monkeypatch):
    """A cached answer is not probed (nor logged) again."""
    calls = []

    def never(model, *args):
        calls.append(1)
        raise ProbeMismatch("differs")

    monkeypatch.setattr(caps_module, "_shared_prompts_match", never)
    model = build_tiny_qwen3()
    with caplog.at_level(logging.WARNING, logger="literl.model.capabilities"):
        assert capabilities(model).shared_prompts is False
        assert capabilities(model).shared_prompts is False
    assert len(calls) == 1 and len(caplog.records) == 1


def test_bfloat16_rounding_passes_the_shared_prompt_probe_where_float32_would_not(monkeypatch):
    """A GPU's kernels round a bfloat16 forward differently for different shapes (shared prompts against whole
    rows): here a 1% perturbation of the shared path's hidden states stands in for that. A bfloat16 model's probe
    accepts it (tolerance 0.0625), a float32 model's refuses it (1e-3). On the CPU itself both paths round alike."""
    real = caps_module.response_hidden

    def rounded(*args, **kwargs):
        hidden = real(*args, **kwargs)
        return hidden * (1 + 0.01 * torch.sign(torch.sin(torch.arange(hidden.numel(), device=hidden.device)))
                         .view_as(hidden).to(hidden.dtype))

    monkeypatch.setattr(caps_module, "response_hidden", rounded)
    assert capabilities(build_tiny_qwen3(seed=7).to(torch.bfloat16)).shared_prompts is True
    assert capabilities(build_tiny_qwen3(seed=7)).shared_prompts is False


@pytest.mark.parametrize("mode", ["r2", "r3"])
def test_routing_replay_runs_on_a_bfloat16_moe_model(mode):
    """A pure-bfloat16 tiny Qwen3-MoE passes the runtime's probes at bfloat16 tolerance (at float32's 1e-3 its
    shared-prompt probe failed, which made R2/R3 refuse the model), and R2/R3's old-log-prob pass and update
    forward run: finite log-probs, every fed position routed and replayed."""
    model = _qwen3_moe(seed=3).to(torch.bfloat16)
    caps = capabilities(model)
    assert caps.shared_prompts and caps.moe is not None and caps.static_decode
    batch = _batch(model, seed=3)
    assert ROLLOUT_ROUTES in batch.extras
    forward = PolicyForward(model, routing_replay=mode)
    old_logp = forward.batch_logprobs(batch)
    part = batch.select(torch.arange(len(batch))).trimmed()
    part.minibatch_B = torch.zeros(len(part), dtype=torch.long)
    logp = forward.logprobs(part).logp_BT
    mask = part.mask_BT
    assert torch.isfinite(logp[mask]).all() and torch.isfinite(old_logp[batch.mask_BT]).all()
    torch.testing.assert_close(logp[mask].float(), old_logp[:, :mask.shape[1]][mask], rtol=0, atol=0.1)


def test_micro_batch_tokens_auto_is_the_cpu_figure_off_accelerators_and_sized_from_memory_on_them():
    """`auto` on CPU: 16384 (the former default, measured there). On CUDA: tokens_for_memory's arithmetic, e.g.
    10 GiB available at 64 KiB per token, 0.8 of it: 10·2³⁰·0.8 / 2¹⁶ = 131,072 tokens; rounded down to a multiple
    of 1024 and kept within [1024, 262144]."""
    forward = PolicyForward(build_tiny_qwen3(), max_tokens="auto")
    assert micro_batch_tokens(forward, "auto") == 16384 and forward.max_tokens == 16384
    assert micro_batch_tokens(forward, 4096) == 4096
    assert tokens_for_memory(10 * 2**30, 2**16) == 131072
    assert tokens_for_memory(10 * 2**30 + 5000, 2**16) == 131072
    assert tokens_for_memory(2**20, 2**16) == 1024                    # at least 1024
    assert tokens_for_memory(1e15, 2**10) == 262144                    # at most 262144
    assert tokens_for_memory(-5.0, 2**16) == 1024                      # nothing free: the smallest


def test_auto_on_cuda_sizes_micro_batches_from_the_memory_left(monkeypatch):
    """The CUDA arithmetic with the device's answers stubbed: 12 GiB free plus 0.5 GiB the allocator holds unused,
    minus 12 bytes per trainable weight not yet holding a gradient and AdamW's two moments (the tiny Qwen3's
    N = 21,856 weights: 262,272 bytes), minus the 1 GiB a forward and backward of any size takes, at 64 KiB of
    activations per token: 0.8 · (13,421,772,800 − 262,272 − 1,073,741,824) / 65,536 = 150,729.6 tokens, rounded
    down to a multiple of 1024: 150,528."""
    from types import SimpleNamespace

    model = build_tiny_qwen3()
    n = sum(p.numel() for p in model.parameters())
    forward = SimpleNamespace(device=torch.device("cuda"), model=model)
    monkeypatch.setattr(caps_module, "_update_memory", lambda policy_forward: (2.0**16, 2.0**30))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (12 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2.5 * 2**30)
    expected = int((12.5 * 2**30 - 12 * n - 2**30) * 0.8 / 2**16) // 1024 * 1024
    assert n == 21856 and micro_batch_tokens(forward, "auto") == expected == 150528
