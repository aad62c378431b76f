"""LoRA through peft on a tiny Qwen3: only adapters train, the reference is the base model, merged = base + adapter."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from literl.assembly.builder import build_components                                 # noqa: E402
from literl.config.load import load_config                                   # noqa: E402
from literl.model.lora import AdaptersOff, apply_lora, final_view, merged_state_dict  # noqa: E402
from literl.model import PolicyForward                                         # noqa: E402
from literl.model.capabilities import capabilities                            # noqa: E402
from literl.rollout.native_engine import NativeEngine                                  # noqa: E402
from literl.run.checkpoint import save_model                              # noqa: E402
from literl.training.trainer import Trainer                                    # noqa: E402
from tests.conftest import build_tiny_qwen3                                    # noqa: E402
from tests.model.test_routing_replay import _batch                             # noqa: E402
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


def _logp(model, mask_BT=None):
    """Log-probs through literl's runtime: dense (the decoder's own forward), or with a mask (the hand-applied
    layers on shared prompts, when the model runs through them)."""
    with torch.no_grad():
        return PolicyForward(model).token_logprobs(ROWS, PROMPT_LEN_B, 4, mask_BT=mask_BT)[0]


def _hf_logp(model):
    """The same log-probs from the model's own logits: log_softmax(logits)[next token]."""
    with torch.no_grad():
        logits_BLV = model(input_ids=ROWS).logits.float().log_softmax(-1)
    positions_BT = PROMPT_LEN_B[:, None] - 1 + torch.arange(4)[None, :]
    next_BT = ROWS.gather(1, positions_BT + 1)
    return logits_BLV.gather(1, positions_BT[:, :, None].expand(-1, -1, logits_BLV.shape[-1])).gather(
        2, next_BT[:, :, None])[..., 0]


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

    save_model(tmp_path / "final", final_view(policy), char_tokenizer)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    torch.testing.assert_close(_logp(reloaded), adapted, atol=1e-5, rtol=0)
    with_adapter = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "final" / "adapter").eval()
    torch.testing.assert_close(_logp(with_adapter), adapted, atol=1e-6, rtol=0)


def test_the_runtime_runs_the_adapters_on_every_path():
    """literl's hand-applied layers (masked rows on a shared prompt) and the decoder's own forward (dense) give the
    adapted model's own log-probs, not the base's: the layer body calls the projection modules, adapters included.
    A record of the rollout's forward keeps plain linear projections only, so the runtime never records (or
    replays) a LoRA policy."""
    base, policy = _adapted()
    assert capabilities(policy).layers and capabilities(policy).shared_prompts
    expected = _hf_logp(policy)
    mask_BT = torch.tensor([[True] * 4, [True, True, True, False]])
    torch.testing.assert_close(_logp(policy), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(_logp(policy, mask_BT), torch.where(mask_BT, expected, 0), atol=1e-5, rtol=0)
    assert not torch.allclose(expected, _hf_logp(base), atol=1e-3)
    assert capabilities(base).record and not capabilities(policy).record


def test_the_reference_pass_is_the_base_model_without_a_copy():
    """AdaptersOff: the policy's own forward inside disable_adapter() gives the base model's log-probs, bit for
    bit, and the adapters are on again afterwards."""
    base, policy = _adapted()
    batch = _batch(policy, prompts=[[3, 4, 5]] * 2 + [[10, 11]] * 2, max_new_tokens=6)
    reference = AdaptersOff(PolicyForward(policy))
    torch.testing.assert_close(reference.batch_logprobs(batch), PolicyForward(base).batch_logprobs(batch),
                               atol=0, rtol=0)
    adapted = PolicyForward(policy).batch_logprobs(batch)
    torch.testing.assert_close(adapted, torch.where(batch.mask_BT, batch.rollout_logp_BT, 0), atol=1e-5, rtol=0)
    assert not torch.allclose(adapted, reference.batch_logprobs(batch), atol=1e-3)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["policy-module", "bf16-copy"])
def test_the_engine_samples_from_the_adapted_policy_and_follows_its_updates(dtype):
    """The rollout's own log-probs equal the adapted policy's (the HF engine samples from the policy module, or
    from its own bfloat16 copy of it), and after the adapters move and the weights sync, the new adapters'."""
    _, policy = _adapted()
    engine = NativeEngine(policy, eos_token_ids=[1], pad_id=0, dtype=dtype)
    prompts = [[3, 4, 5], [10, 11]]
    tolerance = 1e-5 if dtype is None else 0.1

    def check():
        batch = _batch(policy, engine=engine, prompts=prompts, max_new_tokens=5)
        expected = PolicyForward(policy).batch_logprobs(batch)
        torch.testing.assert_close(torch.where(batch.mask_BT, batch.rollout_logp_BT, 0), expected, atol=tolerance,
                                   rtol=0)
        return batch

    check()
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.mul_(-3.0)
    engine.sync_weights(policy)
    check()


def test_a_lora_run_trains_only_the_adapters_and_saves_merged_and_adapter(tiny_qwen3_dir, tmp_path):
    """Two steps with a KL term (whose reference is the adapters switched off): every base weight is bit-identical
    afterwards, the adapters moved, and final/ is the merged model with final/adapter beside it."""
    cfg = load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "r", *LORA,
                                                              "algorithm.kl_coef=0.01", "optim.lr=5e-2"))
    parts = build_components(cfg, reward_fns=[length_reward])
    reference = parts.learner.reference
    assert isinstance(reference, AdaptersOff) and reference.forward.model is parts.learner.policy()
    assert parts.cfg.trainer.replay_max_gib == 0
    before = {n: p.detach().clone() for n, p in parts.learner.policy().named_parameters()}
    run_dir = Trainer(parts).fit()
    after = dict(parts.learner.policy().named_parameters())
    frozen = [n for n in before if "lora_" not in n]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)
    adapters = {id(p) for n, p in after.items() if "lora_" in n}
    assert {id(p) for p in parts.learner.optimizer.param_groups[0]["params"]} == adapters
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    merged = merged_state_dict(parts.learner.policy())
    assert all(torch.equal(final[k], merged[k].cpu()) for k in final)     # the files are read to the CPU
    assert (run_dir / "final" / "adapter" / "adapter_model.safetensors").is_file()
    assert any(not torch.equal(final[k], v) for k, v in load_file(str(tiny_qwen3_dir / "model.safetensors")).items()
               if k in final)


def test_a_lora_run_resumes_to_the_same_adapters(tiny_qwen3_dir, tmp_path):
    from literl.assembly.api import train

    common = [*LORA, "algorithm.kl_coef=0.01", "optim.lr=5e-2"]
    straight = train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "a", *common)),
                     reward_fns=[length_reward])
    train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b", *common,
                                                              "trainer.steps=1", "trainer.save_every=1")),
          reward_fns=[length_reward])
    resumed = train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "b", *common,
                                                                        "trainer.resume=true")),
                    reward_fns=[length_reward])
    a = load_file(str(straight / "final" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(resumed / "final" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_without_an_adapter_is_refused_with_the_fix(tmp_path, char_tokenizer):
    """Resuming a LoRA run from a full-model checkpoint (a run without LoRA) names model.lora.rank=0; a checkpoint
    whose adapter file is missing or damaged is a CheckpointError (resume falls back to the previous one)."""
    from literl.run.checkpoint import CheckpointError, load_adapter

    _, policy = _adapted()
    build_tiny_qwen3().save_pretrained(tmp_path / "full" / "model")
    with pytest.raises(RuntimeError, match="model.lora.rank=0"):
        load_adapter(policy, tmp_path / "full" / "model")
    (tmp_path / "empty" / "model").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no adapter weights"):
        load_adapter(policy, tmp_path / "empty" / "model")
    policy.save_pretrained(tmp_path / "damaged" / "model")
    (tmp_path / "damaged" / "model" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_adapter(policy, tmp_path / "damaged" / "model")


def test_lora_on_a_ray_cluster_is_refused_at_load_with_the_fix():
    from literl.config.errors import ConfigError

    with pytest.raises(ConfigError, match="LoRA runs in one process"):
        load_config(overrides=[*LORA, "cluster.address=local"])
    assert load_config(overrides=["cluster.address=local"]).cluster.address == "local"
