"""Shared fixtures: tiny models built from a config with a local tokenizer (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tests never reach the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA: skipped, with the reason, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu); runs on a machine with an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def tiny_qwen3_config(vocab_size: int = 100, **overrides):
    from transformers import Qwen3Config

    kwargs = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=256,
                  tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def build_tiny_qwen3(seed: int = 0, **overrides):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_qwen3_config(**overrides))


def uneven_rows(seed: int = 0, vocab: int = 100):
    """(tokens_BL, prompt_len_B, T, mask_BT): four rows of uneven prompt and response lengths, two sharing a prompt,
    one response of a single token (the packed route's test batch)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [[5, 6, 7], [5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16]]
    lengths = [6, 1, 9, 4]
    T = max(lengths)
    tokens_BL = torch.zeros(4, max(len(p) + n for p, n in zip(prompts, lengths)), dtype=torch.long)
    mask_BT = torch.zeros(4, T, dtype=torch.bool)
    for b, (p, n) in enumerate(zip(prompts, lengths)):
        tokens_BL[b, :len(p)] = torch.tensor(p)
        tokens_BL[b, len(p):len(p) + n] = torch.randint(3, vocab, (n,), generator=g)
        mask_BT[b, :n] = True
    return tokens_BL, torch.tensor([len(p) for p in prompts]), T, mask_BT


def tiny_qwen3_moe_config(vocab_size: int = 100, **overrides):
    from transformers import Qwen3MoeConfig

    kwargs = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64, moe_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2, max_position_embeddings=256, tie_word_embeddings=True,
                  pad_token_id=0, eos_token_id=1, bos_token_id=2)
    kwargs.update(overrides)
    return Qwen3MoeConfig(**kwargs)


@pytest.fixture
def char_tokenizer():
    from literl.testbed.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def tiny_qwen3(char_tokenizer):
    return build_tiny_qwen3()


@pytest.fixture
def tiny_qwen3_dir(tmp_path, char_tokenizer):
    """A tiny random Qwen3 and the character tokenizer saved with `save_pretrained` in one directory."""
    model = build_tiny_qwen3()
    path = tmp_path / "tiny-qwen3"
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tiny_moe_dir(tmp_path, char_tokenizer):
    """A tiny random Qwen3-MoE (8 experts, top-2, renormalised) and the character tokenizer, in one directory."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(tiny_qwen3_moe_config(vocab_size=len(char_tokenizer), num_experts=8,
                                                      norm_topk_prob=True, eos_token_id=char_tokenizer.eos_token_id,
                                                      pad_token_id=char_tokenizer.pad_token_id))
    path = tmp_path / "tiny-moe"
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def token_logprobs(model, tokens_BL, prompt_len_B, T, *, temperature=1.0, with_entropy=False, chunk_tokens=None,
                   vocab_block=None, mask_BT=None, compiled=False, record=None):
    """`PolicyForward(model, ...).token_logprobs(...)` in one call: the runtime tests' keyword form (the head's
    tile given as chunk_tokens × vocab_block)."""
    from literl.model import PolicyForward
    from literl.model.head import Tiling

    tiling = None
    if chunk_tokens is not None or vocab_block is not None:
        tiling = Tiling.default(model.get_output_embeddings().out_features, next(model.parameters()).device,
                                chunk_tokens=chunk_tokens, vocab_block=vocab_block)
    forward = PolicyForward(model, temperature=temperature, compile=compiled, tiling=tiling)
    return forward.token_logprobs(tokens_BL, prompt_len_B, T, mask_BT=mask_BT, with_entropy=with_entropy,
                                  record=record)
