"""benchmarks/gpu_step.py keeps working: its FLOP count by hand, and its tiny CPU mode end to end (the GPU run is
the same code at real sizes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_step  # noqa: E402
import update_profile  # noqa: E402
from literl.testbed.tokenizer import build_char_tokenizer  # noqa: E402

KEYS = ("rollout_tok_s", "hf_tok_s", "literl_over_hf", "update_s", "update_tflops", "update_mfu", "step_s",
        "peak_memory_gib", "compile_s", "generated_tokens", "trained_tokens")


def test_flop_params_count_active_matmul_weights_and_the_head_once():
    """Tiny dense body (hidden 64, 2 layers, 4 query / 2 KV heads of 16, FFN 128, vocabulary 100, tied): per layer
    q 64·64 + k 32·64 + v 32·64 + o 64·64 = 12,288 and MLP 3·64·128 = 24,576: 36,864 × 2 = 73,728, plus the head
    100·64 = 6,400: 80,128. The MoE body (4 experts of FFN 32, 2 per token): per layer 12,288 + router 4·64 +
    2 experts · 3·64·32 = 12,288 + 256 + 12,288 = 24,832, × 2 + 6,400 = 56,064."""
    tokenizer = build_char_tokenizer()
    dense = gpu_step.build_body(gpu_step.TINY["qwen3-0.6b"], tokenizer, torch.device("cpu"))
    assert dense.config.vocab_size == 100 and gpu_step.flop_params(dense) == 80_128
    moe = gpu_step.build_body(gpu_step.TINY["qwen3-moe"], tokenizer, torch.device("cpu"))
    assert gpu_step.flop_params(moe) == 56_064


def test_the_update_flops_count_6n_per_trained_token_plus_causal_attention():
    """N = 80,128, 5 trained tokens; rows of 3 + 2 and 2 + 3 tokens: attention 6 · (5² + 5²) · 4 heads · 16 · 2
    layers = 38,400; total 6 · 80,128 · 5 + 38,400 = 2,442,240."""
    from types import SimpleNamespace

    model = gpu_step.build_body(gpu_step.TINY["qwen3-0.6b"], build_char_tokenizer(), torch.device("cpu"))
    train = SimpleNamespace(loss_mask_BT=torch.tensor([[True, True, False], [True, True, True]]),
                            mask_BT=torch.tensor([[True, True, False], [True, True, True]]),
                            prompt_len_B=torch.tensor([3, 2]))
    assert gpu_step.update_flops(model, train) == 2_442_240


def test_the_tiny_mode_prints_one_line_per_body(capsys):
    """Three bodies in seconds on CPU: every figure present and positive (MFU: none off a GPU), the ratio is the
    two rates', literl's engine and HF generate each produced tokens."""
    rows = gpu_step.main(["--tiny", "--steps", "1", "--warmup", "0"])
    assert [row["model"] for row in rows] == list(gpu_step.TINY)
    for row in rows:
        assert all(key in row for key in KEYS)
        assert row["generated_tokens"] > 0 and row["hf_tokens"] > 0 and row["trained_tokens"] > 0
        assert row["rollout_tok_s"] > 0 and row["hf_tok_s"] > 0 and row["update_tflops"] > 0
        assert row["literl_over_hf"] == pytest.approx(row["rollout_tok_s"] / row["hf_tok_s"], rel=1e-3)
        assert row["update_mfu"] is None and row["compile_s"] is None and row["device"] == "cpu"
        assert row["micro_batch_tokens"] == 16384 and row["packed_attention"] is None
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


def test_small_figures_keep_their_significant_digits():
    """0.00004321 TFLOP/s would round to 0.0 at 4 decimals: it keeps 4 significant digits; larger figures keep 4
    decimals (2.46238 → 2.4624), ints and None pass through."""
    assert gpu_step._rounded({"a": 0.00004321, "b": 2.46238, "c": 7, "d": None, "e": 0.0}) == {
        "a": 4.321e-05, "b": 2.4624, "c": 7, "d": None, "e": 0.0}


def test_kernels_are_sorted_into_kinds_by_name():
    """The names of an H100 profile's kernels and of CPU operators land in the kind the MFU analysis needs."""
    kind = update_profile.kernel_kind
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kind("flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel") == "optimizer"
    assert kind("Memcpy HtoD (Pinned -> Device)") == "copy"
    assert kind("void at::native::vectorized_elementwise_kernel<4, SiLU>") == "norm_elementwise"
    assert kind("aten::addmm") == "matmul"
    assert kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kind("void at::native::unrolled_elementwise_kernel") == "norm_elementwise"
    assert kind("cudaLaunchKernel") == "other"
    assert kind("triton_poi_fused__to_copy_0") == "compiled_fused"         # not "optimizer", "copy"
    assert kind("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3") == "compiled_fused"


def test_device_time_counts_kernels_not_the_ranges_drawn_around_them():
    """On CUDA the profiler also lists annotation ranges (the update's parts, compiled regions) as device events:
    a 3 ms matmul inside a 5 ms `literl/forward` range is 3 ms of matmul, one kernel, not 8 ms."""
    from types import SimpleNamespace

    def event(name, us, annotation=False):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name="CUDA"), device_time_total=us,
                               is_user_annotation=annotation)

    events = [event("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 3000), event("literl/forward", 5000, True),
              event("Torch-Compiled Region: 0/1", 4000), event("## Call CompiledFxGraph fxabc ##", 4000)]
    summary = update_profile.profile_summary(events, 0.01, cuda=True)
    assert summary["seconds_by_kind"] == {"matmul": 0.003} and summary["kernels"] == 1
    assert summary["device_busy_frac"] == 0.3


def test_the_profile_option_writes_the_update_s_operators_and_kinds(tmp_path):
    """--profile on the tiny CPU mode: the operator table is written, and the update's CPU self time is split
    into kinds, matmuls among them, never more than the update's wall time."""
    rows = gpu_step.main(["--tiny", "--models", "qwen3-0.6b", "--steps", "1", "--warmup", "0",
                          "--profile", str(tmp_path)])
    summary = rows[0]["update_profile"]
    assert "aten::" in (tmp_path / "qwen3-0.6b_update_ops.txt").read_text()
    assert summary["seconds_by_kind"]["matmul"] > 0
    assert 0 < sum(summary["seconds_by_kind"].values()) <= summary["wall_s"]
    assert summary["kernels"] is None and summary["host_syncs"] is None
