"""LoRA on a mixture-of-experts model (issue 31.4): every adapter kind peft creates is merged, fused experts included.

peft (0.17+) adapts transformers' fused `Qwen3MoeExperts` (3-D `gate_up_proj` / `down_proj` parameters, no
`.weight`) and the router through `target_parameters` (`ParamWrapper`, nested when one module carries two adapted
parameters). `merged_state_dict` used to read `.weight` of every adapted module: a LoRA run on a MoE model trained,
then ended in an AttributeError with no final/ model.
"""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft")

from literl.config.load import load_config                                      # noqa: E402
from literl.model.lora import apply_lora, merged_state_dict                            # noqa: E402
from tests.conftest import tiny_qwen3_moe_config                                 # noqa: E402
from tests.training.test_trainer import _overrides, length_reward                # noqa: E402

ROWS = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16]])


def _moe(seed=0):
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(tiny_qwen3_moe_config(num_experts=4, norm_topk_prob=True)).eval()


def _adapted_moe(rank=4):
    """A tiny Qwen3-MoE with LoRA on every linear layer and every fused expert tensor, all B random (peft starts B
    at 0, where an adapter does nothing)."""
    policy = apply_lora(copy.deepcopy(_moe()), load_config(overrides=[f"model.lora.rank={rank}"]).model.lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)
    return policy.eval()


def _logits(model):
    with torch.no_grad():
        return model(input_ids=ROWS).logits


def test_peft_adapts_the_fused_experts_and_the_router_of_a_moe_model():
    """What the installed peft creates (the test of the supported peft range: a peft that adapts other tensors,
    or none of these, fails here)."""
    from peft.tuners.lora import LoraLayer

    policy = _adapted_moe()
    adapted = {name.rpartition("model.layers.0.")[2]: getattr(module, "parameter_name", "weight")
               for name, module in policy.named_modules()
               if isinstance(module, LoraLayer) and "model.layers.0." in name}
    assert adapted == {"self_attn.q_proj": "weight", "self_attn.k_proj": "weight", "self_attn.v_proj": "weight",
                       "self_attn.o_proj": "weight", "mlp.gate": "weight", "mlp.experts": "down_proj",
                       "mlp.experts.base_layer": "gate_up_proj"}


def test_the_merged_moe_model_computes_what_the_adapted_one_does():
    """W + ΔW for every adapted tensor, under the base model's names: a plain Qwen3-MoE loading the merged state
    gives the peft model's logits; every expert tensor, the router and the attention moved."""
    policy = _adapted_moe()
    merged_state = merged_state_dict(policy)
    base_state = _moe().state_dict()
    assert merged_state.keys() == base_state.keys()
    for key in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
                "model.layers.1.mlp.gate.weight", "model.layers.1.self_attn.o_proj.weight"):
        assert not torch.allclose(merged_state[key], base_state[key]), key
    plain = _moe(seed=5)
    plain.load_state_dict(merged_state)
    expected = _logits(policy)
    assert not torch.allclose(expected, _logits(_moe()), atol=1e-3), "the random adapters change the model"
    torch.testing.assert_close(_logits(plain), expected, atol=1e-5, rtol=0)


def test_a_lora_run_on_a_moe_model_saves_its_final_model(tiny_moe_dir, tmp_path):
    """The probe's run: `--model <tiny Qwen3-MoE> model.lora.rank=4` trained, then lost final/ to a traceback.
    Now final/ is the merged model (transformers loads it; its experts moved) and equals the starting model with
    final/adapter applied by peft."""
    from transformers import AutoModelForCausalLM

    from literl.assembly.api import train

    overrides = _overrides(tiny_moe_dir, tmp_path / "r", "model.lora.rank=4", "optim.lr=5e-2")
    run_dir = train(load_config(preset="lite_ppo", overrides=overrides), reward_fns=[length_reward])
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "final").eval()
    start = AutoModelForCausalLM.from_pretrained(tiny_moe_dir).eval()
    assert type(merged).__name__ == "Qwen3MoeForCausalLM"
    key = "model.layers.0.mlp.experts.down_proj"
    assert not torch.equal(merged.state_dict()[key], start.state_dict()[key]), "the experts' adapters trained"
    with_adapter = peft.PeftModel.from_pretrained(start, run_dir / "final" / "adapter").eval()
    torch.testing.assert_close(_logits(merged), _logits(with_adapter), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_lora_on_the_moe_testbed_saves_its_final_model(tmp_path):
    """The MoE testbed (`model.testbed=moe`; its first use builds it, ~5 min on 2 cores, then it is cached), with
    LoRA on every linear layer and fused expert tensor. Run with `pytest -m slow tests/training/test_lora_moe.py`."""
    from transformers import AutoModelForCausalLM

    from literl.cli import main

    out = tmp_path / "run"
    assert main(["train", "model.testbed=moe", "model.lora.rank=4", f"trainer.output_dir={out}", "trainer.steps=2",
                 "rollout.prompts_per_step=4", "rollout.group_size=4", "eval.before=false", "eval.limit=8",
                 "trainer.progress=false"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    assert type(merged).__name__ == "Qwen3MoeForCausalLM"
    assert (out / "final" / "adapter" / "adapter_model.safetensors").is_file()
