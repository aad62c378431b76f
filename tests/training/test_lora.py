"""LoRA through peft on a tiny Qwen3: only adapters train, the reference is the base model, merged = base + adapter."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from literl.config_loader import load_config                                   # noqa: E402
from literl.rollout.generator import SamplingParams                            # noqa: E402
from literl.rollout.hf_engine import HFEngine                                  # noqa: E402
from literl.training.components import build_components                        # noqa: E402
from literl.training.logprobs import token_logprobs                            # noqa: E402
from literl.training.lora import apply_lora, merged_state_dict, reference_context, save_final  # noqa: E402
from literl.training.trainer import Trainer                                    # noqa: E402
from tests.conftest import build_tiny_qwen3                                    # noqa: E402
from tests.training.test_trainer import _overrides, length_reward             # noqa: E402

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj,v_proj,down_proj]"]
ROWS = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 0, 0]])
PROMPT_LEN_B = torch.tensor([3, 2])


def _spec(**kw):
    return load_config(overrides=[*LORA, *(f"model.lora.{k}={v}" for k, v in kw.items())]).model.lora


def _adapted(seed=0):
    """A tiny Qwen3 with LoRA adapters whose B is random (peft starts B at 0, where the adapter does nothing)."""
    base = build_tiny_qwen3(seed)
    policy = apply_lora(copy.deepcopy(base), _spec())
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)
    return base.eval(), policy.eval()


def _logp(model):
    with torch.no_grad():
        return token_logprobs(model, ROWS, PROMPT_LEN_B, 4)[0]


def test_lora_wraps_the_named_modules_and_trains_only_them():
    policy = apply_lora(build_tiny_qwen3(), _spec())
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {n.split(".")[-4] for n in trained} == {"q_proj", "v_proj", "down_proj"}
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        apply_lora(build_tiny_qwen3(), _spec(target_modules="[no_such_proj]"))


def test_merged_logprobs_equal_base_plus_adapter_logprobs(tmp_path, char_tokenizer):
    """The merged weights W + (alpha/r)·B·A in a plain model give the adapted model's log-probs; so do final/ (merged,
    through transformers) and final/adapter (through peft)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, policy = _adapted()
    adapted = _logp(policy)
    assert not torch.allclose(adapted, _logp(base), atol=1e-3), "the random adapters change the model"
    merged = build_tiny_qwen3(seed=5)
    merged.load_state_dict(merged_state_dict(policy))
    torch.testing.assert_close(_logp(merged.eval()), adapted, atol=1e-5, rtol=0)

    save_final(tmp_path / "final", policy, char_tokenizer)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    torch.testing.assert_close(_logp(reloaded), adapted, atol=1e-5, rtol=0)
    with_adapter = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "final" / "adapter").eval()
    torch.testing.assert_close(_logp(with_adapter), adapted, atol=1e-6, rtol=0)


def test_the_reference_pass_is_the_base_model_without_a_copy():
    base, policy = _adapted()
    with reference_context(policy)():
        torch.testing.assert_close(_logp(policy), _logp(base), atol=0, rtol=0)
    assert not torch.allclose(_logp(policy), _logp(base), atol=1e-3), "the adapters are back on afterwards"


def test_the_engine_samples_from_the_adapted_policy():
    """The rollout's own log-probs (HF engine, its default decode, no forward record as the LoRA config resolves)
    equal the adapted policy's, not the base's."""
    _, policy = _adapted()
    engine = HFEngine(policy, eos_token_ids=[1], pad_id=0, record_max_bytes=0)
    out = engine.generate([[3, 4, 5], [10, 11]], SamplingParams(max_new_tokens=5), rng=torch.Generator().manual_seed(0))
    tokens = torch.zeros(2, 3 + 5, dtype=torch.long)
    for b, prompt in enumerate([[3, 4, 5], [10, 11]]):
        tokens[b, :len(prompt)] = torch.tensor(prompt)
        tokens[b, len(prompt):len(prompt) + 5] = out.response_ids_BT[b]
    with torch.no_grad():
        logp, _ = token_logprobs(policy, tokens, torch.tensor([3, 2]), 5, mask_BT=out.mask_BT)
    torch.testing.assert_close(torch.where(out.mask_BT, out.rollout_logp_BT, 0), logp, atol=1e-5, rtol=0)


def test_a_lora_run_trains_only_the_adapters_and_saves_merged_and_adapter(tiny_qwen3_dir, tmp_path):
    """Two steps with a KL term (whose reference is the adapters switched off): every base weight is bit-identical
    afterwards, the adapters moved, and final/ is the merged model with final/adapter beside it."""
    cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "r", *LORA,
                                                              "algorithm.kl_coef=0.01", "optim.lr=5e-2"))
    parts = build_components(cfg, reward_fns=[length_reward])
    assert parts.reference is parts.policy and parts.cfg.trainer.replay_max_gib == 0
    before = {n: p.detach().clone() for n, p in parts.policy.named_parameters()}
    run_dir = Trainer(parts).fit()
    after = dict(parts.policy.named_parameters())
    frozen = [n for n in before if "lora_" not in n]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)
    assert {id(p) for p in parts.optimizer.param_groups[0]["params"]} == {id(p) for n, p in after.items() if "lora_" in n}
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    merged = merged_state_dict(parts.policy)
    assert all(torch.equal(final[k], merged[k]) for k in final)
    assert (run_dir / "final" / "adapter" / "adapter_model.safetensors").is_file()
    assert any(not torch.equal(final[k], v) for k, v in load_file(str(tiny_qwen3_dir / "model.safetensors")).items()
               if k in final)


def test_a_lora_run_resumes_to_the_same_adapters(tiny_qwen3_dir, tmp_path):
    from literl.training.api import train

    common = [*LORA, "algorithm.kl_coef=0.01", "optim.lr=5e-2"]
    straight = train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "a", *common)),
                     reward_fns=[length_reward])
    train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b", *common, "trainer.steps=1",
                                                              "trainer.save_every=1")), reward_fns=[length_reward])
    resumed = train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b", *common,
                                                                        "trainer.resume=true")),
                    reward_fns=[length_reward])
    a = load_file(str(straight / "final" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(resumed / "final" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
