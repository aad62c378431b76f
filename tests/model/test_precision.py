"""Mixed precision (`literl.model.precision`): `model.dtype=bfloat16` computes in bfloat16 over float32 master
weights, gradients and AdamW state, so a small update is kept where pure bfloat16 rounds it away."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from literl.model.head import Tiling, head_logprobs
from literl.model.policy import PolicyForward
from tests.conftest import build_tiny_qwen3, uneven_rows
from tests.training.test_trainer import _overrides, length_reward


def _one_adamw_step(model: torch.nn.Module, forward: PolicyForward, lr: float) -> dict[str, torch.Tensor]:
    """Each parameter's change after one AdamW step (lr, no weight decay) on a log-prob loss of `uneven_rows()`."""
    tokens_BL, prompt_len_B, T, mask_BT = uneven_rows()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    logp, entropy = forward.token_logprobs(tokens_BL, prompt_len_B, T, mask_BT=mask_BT, with_entropy=True)
    w = torch.linspace(-1.0, 2.0, mask_BT.numel()).view(mask_BT.shape) * mask_BT
    ((w * logp).sum() + 0.1 * (w * entropy).sum()).backward()
    optimizer.step()
    return {n: (p.detach() - before[n]).float() for n, p in model.named_parameters()}


def test_a_1e_6_step_moves_the_float32_master_weights_as_float32_does_and_pure_bfloat16_loses_it():
    """AdamW's first step moves each weight by lr · m̂/(√v̂ + ε) = lr · g/(|g| + ε) ≈ ±1e-6 wherever |g| ≫ ε. A
    bfloat16 weight of size ~0.02 has an ulp of 2⁻¹³ ≈ 1.2e-4, so 1e-6 rounds away; a float32 master keeps it.

    Mixed (bf16 compute, fp32 master): every weight the fp32 run moves by ~1e-6 moves by ~1e-6 too, in the same
    direction wherever the gradient is not tiny, and the gradients and AdamW moments are float32. Pure bf16: only
    the weights within ~2.5e-4 of zero (where a bf16 ulp is below 2e-6) change at all, about 2% of them here."""
    lr = 1e-6
    reference = build_tiny_qwen3(seed=5)
    expected = _one_adamw_step(reference, PolicyForward(reference), lr)

    mixed_model = build_tiny_qwen3(seed=5)
    mixed_forward = PolicyForward(mixed_model, compute_dtype=torch.bfloat16)
    assert mixed_forward.compute_dtype == torch.bfloat16
    got = _one_adamw_step(mixed_model, mixed_forward, lr)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in mixed_model.parameters())

    for name, delta in got.items():
        moved = expected[name].abs() > 0.5 * lr
        assert moved.float().mean() > 0.9, name        # the fp32 run moves nearly every weight by ~lr
        assert (delta[moved].abs() > 0.5 * lr).float().mean() > 0.99, name
        agree = torch.sign(delta[moved]) == torch.sign(expected[name][moved])
        assert agree.float().mean() > 0.9, name        # bf16 rounding flips the sign of a few tiny gradients

    pure = build_tiny_qwen3(seed=5).to(torch.bfloat16)
    lost = _one_adamw_step(pure, PolicyForward(pure), lr)
    changed = sum(int((d != 0).sum()) for d in lost.values())
    total = sum(d.numel() for d in lost.values())
    assert changed / total < 0.05


def test_the_head_in_a_narrower_compute_dtype_keeps_float32_outputs_and_gradients():
    """The chunked head with bf16 matmuls over a float32 weight: log-probs within bf16 tolerance of the float32
    head, float32 gradients for the weight and the hidden states, close to the float32 ones."""
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(32, 50, bias=False)
    hidden = torch.randn(7, 32, generator=g, requires_grad=True)
    target = torch.randint(50, (7,), generator=g)
    tiling = Tiling(tokens=3, vocab=16)
    out = {}
    for dtype in (None, torch.bfloat16):
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        logp, entropy = head_logprobs(head, hidden, target, 1.0, True, tiling, dtype)
        (logp.sum() + 0.5 * entropy.sum()).backward()
        out[dtype] = logp.detach(), head.weight.grad.clone(), hidden.grad.clone()
    assert out[torch.bfloat16][0].dtype == torch.float32
    assert out[torch.bfloat16][1].dtype == out[torch.bfloat16][2].dtype == torch.float32
    torch.testing.assert_close(out[torch.bfloat16][0], out[None][0], rtol=0, atol=3e-2)
    for got, expected in zip(out[torch.bfloat16][1:], out[None][1:]):
        torch.testing.assert_close(got, expected, rtol=5e-2, atol=5e-2)


def test_a_bfloat16_run_keeps_float32_masters_and_saves_final_in_bfloat16(tiny_qwen3_dir, tmp_path):
    """model.dtype=bfloat16 with a KL reference and a bf16 engine: the policy's weights and AdamW's moments are
    float32, the reference is a bfloat16 copy, the engine keeps its own bfloat16 copy, no forward is recorded for
    replay (it would be the fp32 rollout's, not the bf16 update's); after two steps the checkpoint holds float32
    weights and final/ bfloat16 ones, as its config.json says."""
    from literl import load_config
    from literl.assembly.builder import build_components
    from literl.training.trainer import Trainer

    cfg = load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "run", "model.dtype=bfloat16",
                                                          "rollout.dtype=bfloat16", "algorithm.kl_coef=0.01",
                                                          "eval.before=false", "eval.every=0", "trainer.threads=1"))
    parts = build_components(cfg, reward_fns=[length_reward])
    assert all(p.dtype == torch.float32 for p in parts.learner.policy().parameters())
    forward = parts.learner.policy_forward
    assert forward.compute_dtype == torch.bfloat16 and forward.recorder is None
    assert all(p.dtype == torch.bfloat16 for p in parts.learner.reference.model.parameters())
    assert parts.engine.model is not parts.learner.policy()
    assert all(p.dtype == torch.bfloat16 for p in parts.engine.model.parameters())
    run_dir = Trainer(parts).fit()
    moments = [s["exp_avg"] for s in parts.learner.optimizer.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    checkpoint = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    saved = load_file(str(checkpoint / "model" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    assert final and all(t.dtype == torch.bfloat16 for t in final.values())
    assert json.loads((run_dir / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    masters = dict(parts.learner.policy().named_parameters())
    assert all(torch.equal(t, masters[k].detach().cpu().to(torch.bfloat16)) for k, t in final.items() if k in masters)


@pytest.mark.gpu
def test_a_mixed_precision_step_on_cuda_moves_the_weights_as_float32_does():
    """The first test's comparison on CUDA (the packed route, bf16 kernels): a 1e-6 AdamW step of the
    mixed-precision policy moves its float32 weights as the float32 run does."""
    lr = 1e-6
    kwargs = dict(seed=5, num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_size=256)
    reference = build_tiny_qwen3(**kwargs).cuda()
    expected = _one_adamw_step_cuda(reference, PolicyForward(reference), lr)
    mixed = build_tiny_qwen3(**kwargs).cuda()
    got = _one_adamw_step_cuda(mixed, PolicyForward(mixed, compute_dtype=torch.bfloat16), lr)
    for name, delta in got.items():
        moved = expected[name].abs() > 0.5 * lr
        assert (delta[moved].abs() > 0.5 * lr).float().mean() > 0.99, name


def _one_adamw_step_cuda(model, forward, lr):
    tokens_BL, prompt_len_B, T, mask_BT = uneven_rows()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    logp, _ = forward.token_logprobs(tokens_BL, prompt_len_B, T, mask_BT=mask_BT)
    w = (torch.linspace(-1.0, 2.0, mask_BT.numel()).view(mask_BT.shape) * mask_BT).cuda()
    (w * logp).sum().backward()
    optimizer.step()
    return {n: (p.detach() - before[n]).float() for n, p in model.named_parameters()}
