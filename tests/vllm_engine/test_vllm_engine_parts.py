"""The vLLM engine's trainer-side parts that need no engine: how samples become a Generation, how rows become
requests and seeds, the routes' layout, the errors given before anything starts, and the config keys."""

from __future__ import annotations

import pytest
import torch

from literl.config.load import explain, load_config
from literl.config.errors import ConfigError
from literl.rollout.vllm_engine import (ROUTES_KEY, VllmEngine, _request_rows, _routes, _seeds,
                                        assemble_generation)
from literl.rollout.vllm_process import VllmEngineError, engine_python
from tests.conftest import build_tiny_qwen3


def test_samples_become_rows_right_padded_with_truncation_where_no_eos_ends_them():
    """Row 0 ends with EOS 9 after 2 tokens; row 1 fills T = 3 without EOS (truncated); row 2 ends with EOS 8 at
    the last column (not truncated)."""
    samples = [([4, 9], [-0.5, -0.25], "stop", None),
               ([3, 3, 3], [-1.0, -2.0, -3.0], "length", None),
               ([6, 5, 8], [-0.125, -0.25, -0.375], "stop", None)]
    g = assemble_generation(samples, 3, eos_token_ids=[8, 9], pad_id=0)
    assert g.response_ids_BT.tolist() == [[4, 9, 0], [3, 3, 3], [6, 5, 8]]
    assert g.mask_BT.tolist() == [[True, True, False], [True, True, True], [True, True, True]]
    assert g.rollout_logp_BT.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0], [-0.125, -0.25, -0.375]]
    assert g.truncated_B.tolist() == [False, True, False]


def test_more_tokens_than_asked_is_an_error():
    with pytest.raises(VllmEngineError, match="max_new_tokens=1"):
        assemble_generation([([1, 2], [0.0, 0.0], "length", None)], 1, eos_token_ids=[9], pad_id=0)


def test_rows_of_one_prompt_share_a_request_in_order_of_first_appearance():
    """A B A C B: requests A (rows 0, 2), B (1, 4), C (3); greedy asks one request per row (vLLM: n = 1)."""
    prompts = [[1, 2], [3], [1, 2], [4], [3]]
    assert _request_rows(prompts, greedy=False) == [[0, 2], [1, 4], [3]]
    assert _request_rows(prompts, greedy=True) == [[0], [1], [2], [3], [4]]


def test_seeds_come_from_the_generator():
    a = _seeds(4, torch.Generator().manual_seed(7))
    b = _seeds(4, torch.Generator().manual_seed(7))
    c = _seeds(4, torch.Generator().manual_seed(8))
    assert a == b and a != c and len(set(a)) == 4 and all(0 <= s < 2**62 for s in a)
    torch.manual_seed(3)
    first = _seeds(2, None)
    torch.manual_seed(3)
    assert _seeds(2, None) == first      # without a generator: the global one, as the HF engine


def test_routes_follow_the_batch_layout_with_minus_one_where_nothing_was_routed():
    """Prompt [p0 p1] + response [r0 r1 r2]: 5 tokens, 4 inputs (the last token is never an input). vLLM gives
    routes for the positions it ran; entry p is the experts chosen at input p; the rest is −1, the last token's
    included. Row 1: prompt [p0] + response [r0], one input. Layers N = 2, top-k K = 1."""
    def routes(n):  # position p, layer l → expert 10·p + l
        return torch.tensor([[[10 * p + l] for l in range(2)] for p in range(n)], dtype=torch.int16)

    samples = [([5, 6, 7], [0.0] * 3, "length", routes(5)), ([5], [0.0], "stop", routes(1))]
    out = _routes([[1, 2], [3]], samples)
    assert out.shape == (2, 5, 2, 1) and out.dtype == torch.int16
    assert out[0, :, :, 0].tolist() == [[0, 1], [10, 11], [20, 21], [30, 31], [-1, -1]]
    assert out[1, :, :, 0].tolist() == [[0, 1], [-1, -1], [-1, -1], [-1, -1], [-1, -1]]
    assert ROUTES_KEY == "rollout_routes_BLNK"


@pytest.mark.skipif(torch.cuda.is_available(), reason="routes are available on GPU")
def test_routes_on_cpu_are_refused_at_construction_naming_the_limitation():
    with pytest.raises(ValueError, match="Model Runner V2.*Triton.*rollout.engine=native"):
        VllmEngine(build_tiny_qwen3(head_dim=32), eos_token_ids=[1], pad_id=0, return_routes=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="routes are available on GPU")
def test_r3_with_the_vllm_engine_on_cpu_is_a_config_error():
    from literl.rollout.vllm_engine import engine_from_config

    cfg = load_config(overrides=["rollout.engine=vllm", "algorithm.routing_replay=r3"])
    with pytest.raises(ConfigError, match="rollout.engine=vllm: routed experts.*not available on CPU"):
        engine_from_config(cfg, build_tiny_qwen3(head_dim=32), eos_token_ids=[1], pad_id=0)


def test_an_fp8_rollout_with_the_vllm_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.engine=vllm runs rollout.dtype=float32 or bfloat16"):
        load_config(overrides=["rollout.engine=vllm", "rollout.dtype=float8_e4m3"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the head-size limit is vLLM's CPU attention's")
def test_a_head_size_without_a_cpu_kernel_is_refused_before_starting():
    with pytest.raises(ValueError, match="head sizes 32, 64.*this model's is 16.*rollout.engine=native"):
        VllmEngine(build_tiny_qwen3(), eos_token_ids=[1], pad_id=0)


def test_a_missing_engine_python_names_the_fix(tmp_path):
    with pytest.raises(VllmEngineError, match=r"does not exist.*\./run\.sh vllm-setup"):
        engine_python(str(tmp_path / "nowhere" / "python"))


def test_engine_keys_load_check_and_explain():
    cfg = load_config(overrides=["rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.5",
                                 "rollout.vllm.extra={max_num_seqs: 64}"])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.kv_cache_gib == 0.5
    assert cfg.rollout.vllm.extra == {"max_num_seqs": 64}
    with pytest.raises(ConfigError, match="rollout.engine='sglang' is not one of: native, vllm"):
        load_config(overrides=["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="weight_sync='nccl' is not one of: auto, file, ipc"):
        load_config(overrides=["rollout.vllm.weight_sync=nccl"])
    with pytest.raises(ConfigError, match="gpu_memory_utilization=1.5"):
        load_config(overrides=["rollout.vllm.gpu_memory_utilization=1.5"])
    text = explain()
    for key in ("rollout.engine", "rollout.vllm.kv_cache_gib", "rollout.vllm.gpu_memory_utilization",
                "rollout.vllm.tensor_parallel_size", "rollout.vllm.enforce_eager", "rollout.vllm.extra"):
        assert key in text


def test_the_shipped_is_correction_ablation_varies_only_minirls_train_infer_weight():
    """vllm_is_correction: MiniRL with and without π_old/μ_old, on the vLLM bf16 engine and on literl's bf16
    engine; every config loads (the runner checks them before anything runs)."""
    from literl.arena.spec import check_configs, load_spec, resolve_spec_path

    spec = load_spec("vllm_is_correction")
    assert spec.preset == "minirl" and spec.paper_finding and spec.description
    assert "arXiv 2512.01374" in resolve_spec_path("vllm_is_correction").read_text()
    assert "rollout.dtype=bfloat16" in spec.base
    assert {arm.name: arm.overrides for arm in spec.variants} == {
        "with_is": ("algorithm.policy_loss.params.train_infer_is=true",),
        "without_is": ("algorithm.policy_loss.params.train_infer_is=false",)}
    assert {arm.name: arm.overrides for arm in spec.scenarios} == {
        "vllm_bf16": ("rollout.engine=vllm",), "literl_bf16": ("rollout.engine=native",)}
    assert len(check_configs(spec)) == 4


def test_a_setup_error_of_the_vllm_engine_is_one_line_with_exit_2(tmp_path, capsys):
    """Issue 31.17: an engine environment that cannot be used printed a traceback and exited 1, where a config
    error is one line and exit 2."""
    from literl.cli import main

    missing = tmp_path / "nowhere" / "python"
    code = main(["train", f"trainer.output_dir={tmp_path / 'run'}", "rollout.engine=vllm",
                 f"rollout.vllm.python={missing}", "trainer.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("literl train:")]
    assert len(lines) == 1 and f"{missing} does not exist" in lines[0] and "./run.sh vllm-setup" in lines[0]
    assert not (tmp_path / "run").exists()
