"""LoRA through peft: only the adapters train; the reference is the base with the adapters switched off.

    model.lora.rank=16 model.lora.alpha=32 model.lora.target_modules=[q_proj,v_proj] model.lora.dropout=0.05

`apply_lora` wraps the policy in a peft model whose base weights are frozen, so the optimizer (which takes the
parameters that require a gradient) holds the adapters only. The KL reference needs no second copy of the
model: `reference_context(policy)` is peft's `disable_adapter()`, entered around the reference's log-prob pass
on the policy module itself, which then computes exactly the base model.

What a rollout engine needs: the Hugging Face engine samples from the policy module, adapters included, so it
needs nothing. An engine holding its own copy of the weights (vLLM) takes `merged_state_dict(policy)`: the
base model's parameter names with W + (alpha / rank)·B·A in place of each adapted weight.

`save_final` writes `final/` as the merged model (config.json + safetensors, loadable by transformers and vLLM
like any checkpoint) with the adapter beside it in `final/adapter/` (loadable with peft). Checkpoints hold the
adapter only (`load_adapter_weights` restores it on resume).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

ADAPTER = "default"
ALL_LINEAR = "all-linear"


def lora_enabled(cfg) -> bool:
    return cfg.model.lora.rank > 0


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError("model.lora.rank > 0 needs peft: pip install 'literl[lora]' (or pip install peft)") from err
    return peft


def apply_lora(model: torch.nn.Module, spec) -> torch.nn.Module:
    """The policy with LoRA adapters of `spec` (rank, alpha, target_modules, dropout); base weights frozen."""
    peft = _peft()
    targets = list(spec.target_modules)
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, bias="none",
                             target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
                             task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:       # e.g. a target module name the model does not have
        raise ValueError(f"model.lora: {err}. Name modules of this model in model.lora.target_modules (e.g. "
                         f"[q_proj,v_proj]), or [{ALL_LINEAR}] for every linear layer but the output head") from None


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def reference_context(policy: torch.nn.Module) -> Callable[[], ContextManager]:
    """What to enter around the reference pass: the adapters off for a LoRA policy (the pass then runs the base
    model), nothing otherwise."""
    if is_lora(policy):
        return policy.disable_adapter
    return contextlib.nullcontext


def _lora_layers(base: torch.nn.Module):
    from peft.tuners.lora import LoraLayer

    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            yield name, module


@torch.no_grad()
def merged_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapted weight merged (W + scale·B·A), under the base model's own
    parameter names: what an engine with its own copy of the weights loads after each step."""
    base = policy.get_base_model()
    merged = {name.replace(".base_layer.", "."): tensor for name, tensor in base.state_dict().items()
              if "lora_" not in name}
    for name, module in _lora_layers(base):
        weight = module.get_base_layer().weight
        merged[f"{name}.weight"] = weight + module.get_delta_weight(ADAPTER).to(weight.dtype)
    return merged


def save_final(directory: Path, policy: torch.nn.Module, tokenizer: Any) -> Path:
    """`final/`: the model as save_pretrained writes it; for a LoRA policy the merged model, plus `adapter/`."""
    from literl.training.checkpoint import save_model

    directory = Path(directory)
    if not is_lora(policy):
        return save_model(directory, policy, tokenizer)
    save_model(directory, _MergedView(policy), tokenizer)
    policy.save_pretrained(directory / "adapter", safe_serialization=True)
    return directory


class _MergedView:
    """Saves like the base model, with the merged weights (`save_model` calls save_pretrained)."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def save_pretrained(self, path, **kwargs) -> None:
        self.policy.get_base_model().save_pretrained(path, state_dict=merged_state_dict(self.policy), **kwargs)


def load_adapter_weights(model: torch.nn.Module, directory: Path) -> None:
    """Restore a LoRA policy's adapters from a checkpoint's model folder (written by peft's save_pretrained)."""
    peft = _peft()
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no adapter_model.safetensors, so it is not a checkpoint of a LoRA "
                                "run; resume it with model.lora.rank=0")
    result = peft.set_peft_model_state_dict(model, load_file(str(path)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"the adapter in {directory} does not match model.lora (unexpected {unexpected[:5]}); "
                           "resume with the LoRA settings the run started with")
