"""LoRA on a mixture-of-experts policy with R3 routing replay (`--preset minirl_r3 model.lora.rank=4`), a
combination no test reached (issue 59). Routing replay forwards the adapted model with the engine's expert
choices; LoRA wraps the experts and the router in peft modules. Together they must still replay the routes (the
engine–trainer route agreement is logged), train only the adapters, and save a merged final/ that transformers
loads, from the command line as well as through the API."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("peft")

from literl.cli import main                                                        # noqa: E402
from literl.run.metrics_log import read_metrics                                   # noqa: E402

OVERRIDES = ["trainer.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
             "eval.every=0", "eval.before=false", "eval.limit=4", "eval.samples=1", "eval.greedy=false",
             "trainer.progress=false", "optim.lr=5e-2", "model.lora.rank=4", "trainer.minibatches=2",
             "rollout.dtype=float8_e4m3", "data.size=64"]


@pytest.mark.slow
def test_lora_with_r3_on_the_moe_testbed_trains_and_saves_a_merged_model(tmp_path):
    """The MoE testbed itself (its first use builds it, ~5 min on 2 cores, then it is cached)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    assert main(["train", "--preset", "minirl_r3", "model.testbed=moe", f"trainer.output_dir={out}",
                 *OVERRIDES]) == 0
    records = read_metrics(out)
    assert all(0 < r["moe/route_agree_ti"] <= 1 and math.isfinite(r["loss/total"]) for r in records)
    assert type(AutoModelForCausalLM.from_pretrained(out / "final")).__name__ == "Qwen3MoeForCausalLM"


def test_lora_with_r3_on_a_tiny_moe_replays_routes_and_moves_the_experts(tiny_moe_dir, tmp_path):
    """Two steps of two off-policy mini-batches under an FP8-like engine (so the engine's routes differ from the
    trainer's: agreement strictly between 0 and 1). Only adapters train, so the merged experts differ from the
    starting ones while the embedding (not adapted) is unchanged."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    assert main(["train", "--preset", "minirl_r3", f"model.path={tiny_moe_dir}", f"trainer.output_dir={out}",
                 *OVERRIDES, "reward.fns.0.fn=tests.training.test_trainer:length_reward"]) == 0
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert 0.0 < record["moe/route_agree_ti"] < 1.0, "R3 compares the replayed routes with the trainer's"
        assert math.isfinite(record["loss/total"]) and record["optim/grad_norm"] > 0
    merged = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_moe_dir).state_dict()
    assert not torch.equal(merged["model.layers.0.mlp.experts.down_proj"],
                           start["model.layers.0.mlp.experts.down_proj"]), "the experts' adapters trained"
    assert torch.equal(merged["model.embed_tokens.weight"], start["model.embed_tokens.weight"])
    assert (out / "final" / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_the_runtime_reads_the_router_under_peft_s_wrapper(norm_topk_prob):
    """The defect this combination found: peft wraps each router in a ParamWrapper that does not pass `top_k` or
    `norm_topk_prob` on, so the runtime saw no MoE layers (R3 refused: 'no MoE layers the runtime can route'), and
    a replay would have renormalised the weights of a router that does not (getattr's default, True). Tiny MoE of
    8 experts, top-2, 2 layers."""
    import copy

    from transformers import Qwen3MoeForCausalLM

    from literl.config.load import load_config
    from literl.model.lora import apply_lora
    from literl.model.capabilities import capabilities
    from literl.model.moe import MoeShape, renormalises
    from tests.conftest import tiny_qwen3_moe_config

    torch.manual_seed(0)
    plain = Qwen3MoeForCausalLM(tiny_qwen3_moe_config(num_experts=8, norm_topk_prob=norm_topk_prob)).eval()
    adapted = apply_lora(copy.deepcopy(plain), load_config(overrides=["model.lora.rank=4"]).model.lora)
    gate = adapted.get_decoder().layers[0].mlp.gate
    assert type(gate).__name__ == "ParamWrapper", "peft adapts the router"
    assert MoeShape.of(adapted) == MoeShape(layers=2, top_k=2, experts=8)
    assert renormalises(gate) is norm_topk_prob
    assert capabilities(adapted).moe == MoeShape(layers=2, top_k=2, experts=8)
