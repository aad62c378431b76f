"""LoRA through peft: only the adapters train; the reference is the base with the adapters switched off.

    model.lora.rank=16 model.lora.alpha=32 model.lora.target_modules=[q_proj,v_proj] model.lora.dropout=0.05

`apply_lora` wraps the policy in a peft model whose base weights are frozen, so the optimizer (which takes the
parameters that require a gradient) holds the adapters only. The KL reference needs no second copy of the
model: `AdaptersOff` runs the reference's log-prob pass on the policy module itself inside peft's
`disable_adapter()`, which then computes exactly the base model.

The runtime (`literl.model`) runs a peft policy as it runs any model: its hand-applied layers call the
projection modules, and a LoRA projection's module adds its adapter. What it cannot do under LoRA is keep the
rollout's forward for the update to replay (a record holds plain linear projections only:
`literl.model.record.can_record` is false for LoRA layers), so `literl.config.load.resolve` sets
trainer.replay_max_gib=0 and says so.

What a rollout engine needs: the Hugging Face engine samples from the policy module, adapters included (or from
its own copy of the peft model, in another precision, synced parameter by parameter), so it needs nothing. An
engine that loads a Hugging Face model folder (vLLM) takes the merged model: `save_merged` writes it and
`merged_state_dict(policy)` gives its weights after each step, under the base model's parameter names with
W + (alpha / rank)·B·A in place of each adapted weight. literl's FP8-like engine (rollout.dtype=float8_e4m3)
rounds every linear layer of its copy, the adapter matrices A and B included (`literl.model.quantize`), where an
FP8 engine serving LoRA keeps the adapters in bf16.

`final/` of a LoRA run (`final_view`) is the merged model (config.json + safetensors, loadable by transformers
and vLLM like any checkpoint) with the adapter beside it in `final/adapter/` (loadable with peft). Checkpoints
hold the adapter only (peft's save_pretrained; `training.checkpoint` restores it on resume).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

ADAPTER = "default"
ALL_LINEAR = "all-linear"
SUPPORTED_PEFT = ">=0.20,<0.22"   # pyproject.toml's lora extra: the releases the LoRA tests pass with


def lora_enabled(cfg) -> bool:
    return cfg.model.lora.rank > 0


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError("model.lora.rank > 0 needs peft: pip install 'literl[lora]' (or pip install peft)") from err
    return peft


class LoraRankWarning(UserWarning):
    """model.lora.rank exceeds min(in, out) of some adapted layers: their adapters are larger than they need be."""


def check_rank(model: torch.nn.Module, rank: int, targets: list[str]) -> None:
    """Refuse a rank above min(in, out) of every linear layer the adapters target, and warn when it exceeds some.

    An adapter B·A of rank r ≥ min(in, out) can already express any update of its layer, so a larger rank adds
    parameters and memory (model.lora.rank=10000 on the testbed, whose layers are at most 128 wide: adapters 122×
    the model's parameters) and nothing else. Checked before peft builds anything."""
    out_layer = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dims = {name: min(module.in_features, module.out_features) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not out_layer
            and (targets == [ALL_LINEAR] or name.rpartition(".")[2] in targets or name in targets)}
    if not dims:
        return              # peft names the targets it cannot find
    largest = max(dims.values())
    if rank > largest:
        from literl.config.errors import ConfigError

        adapters = sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules() if n in dims)
        ratio = adapters / max(1, sum(p.numel() for p in model.parameters()))
        raise ConfigError(f"model.lora.rank={rank} exceeds min(in, out) of every layer it adapts (at most {largest}): "
                          f"an adapter of rank >= min(in, out) can already express any update of its layer, so "
                          f"this rank only makes the adapters bigger ({ratio:,.0f}x the model's parameters). Use "
                          f"model.lora.rank <= {largest} (LoRA ranks are usually 8-64)")
    smaller = sorted({name.rpartition(".")[2]: dim for name, dim in dims.items() if dim < rank}.items())
    if smaller:
        warnings.warn(f"model.lora.rank={rank} exceeds min(in, out) of "
                      + ", ".join(f"{name} ({dim})" for name, dim in smaller)
                      + ": their adapters can already express any update at that rank, so the rest only adds "
                        "parameters", LoraRankWarning, stacklevel=3)


def apply_lora(model: torch.nn.Module, lora) -> torch.nn.Module:
    """The policy with LoRA adapters as `lora` (the config's model.lora: rank, alpha, target_modules, dropout)
    says; base weights frozen."""
    peft = _peft()
    targets = list(lora.target_modules)
    check_rank(model, lora.rank, targets)
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                             target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
                             task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():
            # peft (0.21) reads transformers' deprecated `is_gradient_checkpointing`: its call, not literl's.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return peft.get_peft_model(model, config)
    except ValueError as err:       # e.g. a target module name the model does not have
        raise ValueError(f"model.lora: {err}. Name modules of this model in model.lora.target_modules (e.g. "
                         f"[q_proj,v_proj]), or [{ALL_LINEAR}] for every linear layer but the output head") from None


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class AdaptersOff:
    """The KL reference of a LoRA policy: the policy's own forward (a `literl.model.PolicyForward` over the peft
    model, without a record or routing replay) with its adapters switched off, which is the base model."""

    def __init__(self, forward):
        self.forward = forward

    def batch_logprobs(self, batch) -> torch.Tensor:
        with self.forward.model.disable_adapter():
            return self.forward.batch_logprobs(batch)


def _lora_layers(base: torch.nn.Module):
    from peft.tuners.lora import LoraLayer

    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            yield name, module


def _base_name(name: str) -> str:
    """A module or parameter name of the peft model as the base model spells it (peft nests each adapted module as
    `<name>.base_layer`, twice where one module carries two adapted parameters)."""
    return re.sub(r"\.base_layer(?=\.|$)", "", name)


@torch.no_grad()
def merged_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapted tensor merged (W + scale·B·A), under the base model's own
    parameter names: what an engine with its own copy of the weights loads after each step.

    Every adapter kind peft creates: a LoRA module adapts its base layer's `weight`, and a `ParamWrapper` (peft's
    `target_parameters`: the fused 3-D expert tensors `gate_up_proj` / `down_proj` of a mixture of experts, and its
    router) adapts the parameter it names; peft's `get_delta_weight` gives ΔW in that parameter's own layout."""
    base = policy.get_base_model()
    merged = {_base_name(name): tensor for name, tensor in base.state_dict().items() if "lora_" not in name}
    for name, module in _lora_layers(base):
        key = f"{_base_name(name)}.{getattr(module, 'parameter_name', 'weight')}"
        delta = module.get_delta_weight(ADAPTER)
        if key not in merged or merged[key].shape != delta.shape:
            raise RuntimeError(
                f"cannot merge the LoRA adapter of {name} ({type(module).__name__} of peft {_peft().__version__}): "
                f"its update has shape {tuple(delta.shape)}, the base model's {key} "
                f"{tuple(merged[key].shape) if key in merged else 'does not exist'}. literl merges the adapters "
                f"peft {SUPPORTED_PEFT} creates; name other modules in model.lora.target_modules")
        merged[key] = merged[key] + delta.to(merged[key].dtype)
    return merged


def final_view(policy: torch.nn.Module):
    """What `final/` saves (`checkpoint.save_model` calls its save_pretrained): the policy itself, or for a LoRA
    policy the merged model with the adapter beside it in `adapter/`, written in the same atomic save."""
    return _MergedWithAdapter(policy) if is_lora(policy) else policy


def save_merged(policy: torch.nn.Module, directory: str | Path, **kwargs) -> None:
    """The merged model of a LoRA policy as a Hugging Face model folder (save_pretrained of the base model)."""
    policy.get_base_model().save_pretrained(directory, state_dict=merged_state_dict(policy), **kwargs)


class _MergedWithAdapter:
    """Saves like the base model, with the merged weights, and the adapter (peft's format) in `adapter/`."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def save_pretrained(self, path, **kwargs) -> None:
        save_merged(self.policy, path, **kwargs)
        self.policy.save_pretrained(Path(path) / "adapter", **kwargs)


def load_adapter_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], directory: Path) -> None:
    """Put a checkpoint's adapter weights (read from `directory`) into a LoRA policy; a RuntimeError naming the fix
    when they belong to other LoRA settings."""
    result = _peft().set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"the adapter in {directory} does not match model.lora (unexpected {unexpected[:5]}); "
                           "resume with the LoRA settings the run started with")
