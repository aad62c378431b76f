"""Sizes checked when a run starts, against the model's context and the machine's memory.

A prompt plus `rollout.max_new_tokens` must fit the model's positions (`max_position_embeddings`): past them a
model with rotary positions still runs but on positions it never saw, and one 10 MB problem took memory to
gigabytes before an allocator traceback deep in transformers. Such problems are skipped with a counted warning
(`data.overlong_prompts=skip`, the default) or refused (`=error`).

Counting tokens exactly would mean tokenizing every problem at start. A prompt has at most as many tokens as
bytes (each token of a byte-level or character tokenizer covers at least one byte) plus the template's own
tokens, so only problems whose UTF-8 size could exceed the budget are tokenized.

Settings that cannot fit at all are refused with the numbers: `max_new_tokens` beyond the context, or a rollout
batch whose KV cache alone exceeds the memory available (`prompts_per_step=100000`).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from literl.config.errors import ConfigError

SAFETY_TOKENS = 8          # margin on the bytes-bound for tokenizer merges across the template's edges


def max_positions(model: torch.nn.Module) -> int | None:
    """The model's maximum sequence length (prompt + response), when its config declares one."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_max_new_tokens(cfg, model: torch.nn.Module) -> None:
    limit = max_positions(model)
    if limit is None:
        return
    for key, value in (("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
                       ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        if value is not None and value >= limit:
            raise ConfigError(f"{key}={value} leaves no room for a prompt in the model's {limit} positions "
                              f"(max_position_embeddings): lower it well below {limit}")


def fit_prompts_to_context(problems: list[dict], prompt_ids: Callable[[int], list[int]], model: torch.nn.Module,
                           *, max_new_tokens: int, overhead: int, on_overlong: str) -> tuple[list[dict], list[int]]:
    """(problems whose prompt + max_new_tokens fits the model, indices of those that do not).

    `prompt_ids(i)` renders problem i; `overhead` is the template's own token count (an upper bound);
    `on_overlong` "error" raises instead of skipping.
    """
    limit = max_positions(model)
    if limit is None:
        return problems, []
    budget = limit - max_new_tokens
    overlong = []
    for i, row in enumerate(problems):
        size = len(str(row.get("problem", "")).encode("utf-8", errors="replace"))
        if size + overhead + SAFETY_TOKENS <= budget:
            continue                                  # cannot be longer than the budget: no need to tokenize
        if len(prompt_ids(i)) > budget:
            overlong.append(i)
    if overlong and on_overlong == "error":
        first = problems[overlong[0]]
        raise ConfigError(
            f"{len(overlong)} of {len(problems)} training problems are too long for the model: prompt + "
            f"rollout.max_new_tokens={max_new_tokens} must fit its {limit} positions (first: problem "
            f"{first.get('id', overlong[0])!r}, {len(prompt_ids(overlong[0]))} prompt tokens). Set "
            "data.overlong_prompts=skip to train without them, or lower rollout.max_new_tokens")
    if len(overlong) == len(problems):
        raise ConfigError(f"every training problem is too long for the model: prompt + rollout.max_new_tokens="
                          f"{max_new_tokens} must fit its {limit} positions")
    skip = set(overlong)
    return [row for i, row in enumerate(problems) if i not in skip], overlong


def check_rollout_memory(cfg, model: torch.nn.Module, device: torch.device) -> None:
    """Refuse a rollout batch whose KV cache cannot fit, counting only the response tokens (a lower bound)."""
    per_token = _kv_bytes_per_token(model, cfg.rollout.dtype)
    available = available_memory(device)
    if per_token is None or available is None:
        return
    r = cfg.rollout
    rows = r.prompts_per_step * r.group_size
    need = rows * r.max_new_tokens * per_token
    if need > available:
        raise ConfigError(
            f"the rollout batch cannot fit in memory: rollout.prompts_per_step × group_size = {rows:,} sequences of "
            f"rollout.max_new_tokens={r.max_new_tokens:,} tokens need at least {_gib(need)} for the KV cache "
            f"alone, and {_gib(available)} is available on {device.type}. Lower rollout.prompts_per_step, "
            "rollout.group_size or rollout.max_new_tokens")


def _kv_bytes_per_token(model: torch.nn.Module, dtype: str) -> int | None:
    c = getattr(model, "config", None)
    layers = getattr(c, "num_hidden_layers", None)
    heads = getattr(c, "num_key_value_heads", None) or getattr(c, "num_attention_heads", None)
    head_dim = getattr(c, "head_dim", None)
    if head_dim is None and getattr(c, "hidden_size", None) and getattr(c, "num_attention_heads", None):
        head_dim = c.hidden_size // c.num_attention_heads
    if not (layers and heads and head_dim):
        return None
    return int(layers) * 2 * int(heads) * int(head_dim) * (4 if dtype == "float32" else 2)   # bf16 (FP8 engine too)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new allocations on `device` (MemAvailable on Linux), None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"
