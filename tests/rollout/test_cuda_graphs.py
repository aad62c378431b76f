"""The CUDA-graph decode (`rollout.decode=auto` on CUDA: the fixed-shape step captured once per batch bucket).

A graph replays the eager fixed step's kernels on the same shapes, so for the same seed it must give the eager
step's tokens, log-probs, MoE routes (what R3 replays) and generator state bit for bit; against the static route
(attention over the written columns only) the tokens agree and the log-probs within float rounding. Needs CUDA:
marked `gpu`, skipped without it (tests/conftest.py). Run: `python -m pytest -m gpu tests/rollout/test_cuda_graphs.py`.
"""

from __future__ import annotations

import pytest
import torch

from literl.model.moe import ROLLOUT_ROUTES
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3, tiny_qwen3_moe_config
from tests.rollout.test_engine import MANY_EOS, PAD, _prompts

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
PARAMS = SamplingParams(max_new_tokens=40, temperature=0.8, top_k=30, top_p=0.95)


def _engine(model, **kwargs):
    return NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, **kwargs)


def _generate(engine, prompts, seed, params=PARAMS):
    rng = torch.Generator(device=CUDA).manual_seed(seed)
    gen = engine.generate(prompts, params, rng=rng)
    return gen, rng.get_state()


def _moe():
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(6)
    # batched_mm: transformers' experts implementation without a host sync (its fp32 grouped fallback has one).
    config = tiny_qwen3_moe_config(num_experts=8, norm_topk_prob=True, experts_implementation="batched_mm")
    return Qwen3MoeForCausalLM(config).to(CUDA).eval()


def test_graphs_replay_the_eager_fixed_step_bit_for_bit_and_sample_the_static_routes_tokens():
    model = build_tiny_qwen3(seed=3).to(CUDA)
    prompts = _prompts(seed=3) * 6                     # 48 rows: buckets 48, 32, 24, ... as rows finish
    graphed_engine = _engine(model)
    assert graphed_engine.decode_route == "cuda_graphs"
    graphed, graphed_rng = _generate(graphed_engine, prompts, seed=3)
    report = graphed_engine.decode_report()
    assert report["capture_failure"] is None and len(report["graphs"]) >= 3, report
    eager, eager_rng = _generate(_engine(model, decode="fixed", cuda_graphs=False), prompts, seed=3)
    assert (~eager.truncated_B).sum() >= 16, "rows must end early for the batch to shrink"
    assert torch.equal(graphed.response_ids_BT, eager.response_ids_BT)
    assert torch.equal(graphed.rollout_logp_BT, eager.rollout_logp_BT)
    assert torch.equal(graphed_rng, eager_rng)          # the graphs advanced the run's generator as eager draws do
    static, _ = _generate(_engine(model, decode="static"), prompts, seed=3)
    assert torch.equal(graphed.response_ids_BT, static.response_ids_BT)
    torch.testing.assert_close(graphed.rollout_logp_BT, static.rollout_logp_BT, rtol=0, atol=1e-4)


def test_graphs_captured_once_serve_later_generations_and_a_seed_repeats():
    model = build_tiny_qwen3(seed=4).to(CUDA)
    engine = _engine(model)
    prompts = _prompts(seed=4) * 4
    first, _ = _generate(engine, prompts, seed=7)
    captured, graphs = engine._captured, dict(engine._captured.graphs.graphs)
    _generate(engine, _prompts(seed=5) * 4, seed=8)                 # other prompts, a width within the capacity
    again, _ = _generate(engine, prompts, seed=7)
    assert engine._captured is captured
    assert all(engine._captured.graphs.graphs[bucket] is graph for bucket, graph in graphs.items())
    assert torch.equal(again.response_ids_BT, first.response_ids_BT)
    assert torch.equal(again.rollout_logp_BT, first.rollout_logp_BT)
    with torch.no_grad():
        for p in model.parameters():                                # an optimizer step: in place, same addresses
            p.add_(0.05 * torch.randn_like(p))
    moved, _ = _generate(engine, prompts, seed=7)
    assert engine._captured is captured
    assert not torch.equal(moved.response_ids_BT, first.response_ids_BT), "the graphs must read the new weights"
    eager, _ = _generate(_engine(model, decode="fixed", cuda_graphs=False), prompts, seed=7)
    assert torch.equal(moved.response_ids_BT, eager.response_ids_BT)


def test_r3_routes_recorded_inside_the_graphs_equal_the_eager_ones():
    """A Qwen3-MoE: the experts recorded for every fed position inside the graphs are the eager fixed step's, bit
    for bit, and the static route's wherever that one fed the position."""
    model = _moe()
    prompts = _prompts(seed=6) * 4
    params = SamplingParams(max_new_tokens=24, temperature=1.3)
    graphed_engine = _engine(model)
    graphed, _ = _generate(graphed_engine, prompts, seed=2, params=params)
    assert graphed_engine.decode_report()["capture_failure"] is None
    eager, _ = _generate(_engine(model, decode="fixed", cuda_graphs=False), prompts, seed=2, params=params)
    assert torch.equal(graphed.response_ids_BT, eager.response_ids_BT)
    assert torch.equal(graphed.extras[ROLLOUT_ROUTES], eager.extras[ROLLOUT_ROUTES])
    static, _ = _generate(_engine(model, decode="static"), prompts, seed=2, params=params)
    assert torch.equal(graphed.response_ids_BT, static.response_ids_BT)
    fed_BL = static.extras[ROLLOUT_ROUTES][..., 0, 0] >= 0
    assert torch.equal(graphed.extras[ROLLOUT_ROUTES][fed_BL], static.extras[ROLLOUT_ROUTES][fed_BL])


def test_compiled_step_inside_the_graphs_samples_the_eager_tokens():
    """rollout.compile=true on CUDA: the compiled fixed step (inductor's own CUDA graphs off) captured per bucket;
    its compile time is reported."""
    model = build_tiny_qwen3(seed=9).to(CUDA)
    prompts = _prompts(seed=9) * 4
    engine = _engine(model, compile=True)
    compiled, _ = _generate(engine, prompts, seed=1)
    report = engine.decode_report()
    assert report["capture_failure"] is None, report
    # CUDA compiles one layer's graph for every layer (compiled.compiles_layer_by_layer): "a fixed-shape decode layer"
    assert any("fixed-shape decode" in label for label in report["compile_seconds"]), report
    eager, _ = _generate(_engine(model, decode="fixed", cuda_graphs=False), prompts, seed=1)
    assert torch.equal(compiled.response_ids_BT, eager.response_ids_BT)
    torch.testing.assert_close(compiled.rollout_logp_BT, eager.rollout_logp_BT, rtol=0, atol=1e-5)


def test_bf16_graphs_replay_the_eager_fixed_step():
    """The precision a GPU run decodes in (rollout.dtype=bfloat16: the engine's own copy)."""
    model = build_tiny_qwen3(seed=5).to(CUDA)
    prompts = _prompts(seed=5) * 4
    graphed, _ = _generate(_engine(model, dtype=torch.bfloat16), prompts, seed=4)
    eager, _ = _generate(_engine(model, dtype=torch.bfloat16, decode="fixed", cuda_graphs=False), prompts, seed=4)
    assert torch.equal(graphed.response_ids_BT, eager.response_ids_BT)
    assert torch.equal(graphed.rollout_logp_BT, eager.rollout_logp_BT)
