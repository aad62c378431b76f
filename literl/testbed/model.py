"""The testbed's tiny language model: a real `transformers` Qwen3 built from a config (nothing downloaded).

Being a stock `Qwen3ForCausalLM` saved with `save_pretrained` next to the character tokenizer, the
testbed loads with `AutoModelForCausalLM` / `AutoTokenizer` (and vLLM) like any hub checkpoint, so the
trainer needs no testbed-specific code path.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.utils import logging as hf_logging


@dataclass(frozen=True)
class ModelShape:
    """Architecture of the tiny Qwen3 (the defaults are the testbed-notes model, ~0.8 M parameters)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_size: int = 384
    max_positions: int = 512
    """Longest prompt + response the model is meant for; problems use under 30 tokens and answers under 64."""


def qwen3_config(shape: ModelShape, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """A Qwen3 config of `shape` whose vocabulary and special ids are the tokenizer's."""
    if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"hidden_size must divide into num_heads and num_heads into num_kv_heads: {shape}")
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        intermediate_size=shape.ffn_size,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


@dataclass(frozen=True)
class ExpertsShape:
    """The mixture-of-experts layers of the MoE testbed: every layer's MLP becomes `experts` experts of FFN size
    `ffn_size`, `per_token` of them chosen per token, their top-k weights renormalised (Qwen3-MoE's
    norm_topk_prob, as Qwen3-30B-A3B)."""

    experts: int = 8
    per_token: int = 2
    ffn_size: int = 96


def qwen3_moe_config(shape: ModelShape, experts: ExpertsShape, tokenizer: PreTrainedTokenizerBase) -> Qwen3MoeConfig:
    """A Qwen3-MoE config: `shape`'s attention and sizes, `experts`' MoE layers."""
    dense = qwen3_config(shape, tokenizer).to_dict()
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "tie_word_embeddings", "pad_token_id", "eos_token_id", "bos_token_id")
    return Qwen3MoeConfig(**{key: dense[key] for key in keep}, intermediate_size=shape.ffn_size,
                          num_experts=experts.experts, num_experts_per_tok=experts.per_token,
                          moe_intermediate_size=experts.ffn_size, norm_topk_prob=True, decoder_sparse_step=1)


def build_model(shape: ModelShape, tokenizer: PreTrainedTokenizerBase, *, seed: int,
                experts: ExpertsShape | None = None) -> PreTrainedModel:
    """A freshly initialised float32 Qwen3 (Qwen3-MoE with `experts`); the same seed gives the same weights."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = (Qwen3ForCausalLM(qwen3_config(shape, tokenizer)) if experts is None
                 else Qwen3MoeForCausalLM(qwen3_moe_config(shape, experts, tokenizer)))
    finally:
        # The caller's global RNG stream is not ours to move.
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct trainable parameters (tied input/output embeddings count once)."""
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def quiet_transformers_bars():
    """Silence transformers' own tqdm bars ("Loading weights", "Writing model shards"), which would
    interleave with the build's progress bar; restores the previous setting."""
    were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            hf_logging.enable_progress_bar()


def load_model_dir(path: Path) -> PreTrainedModel:
    """A built testbed's float32 model."""
    with quiet_transformers_bars():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def save_model_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Write weights, config, generation config and tokenizer into `path` (Hugging Face layout)."""
    with quiet_transformers_bars():
        model.save_pretrained(path, safe_serialization=True)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(path)
    # transformers 5 writes its own class name, which transformers 4 (and vLLM pinned to it) cannot
    # resolve; the generic fast-tokenizer name loads under both.
    config_path = Path(path) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
