"""Decoder hidden states of response tokens when rows share their prompt: each distinct prompt runs once.

A rollout batch holds every prompt G times (its group), and a training forward over whole rows computes the
same prompt activations G times. Here the distinct prompts run once, left-padded, and each row's response then
runs on top of a copy of its prompt's key/value cache, as the rollout engine samples. The hidden state that
predicts response token 0 is the prompt's last one; response token t ≥ 1 is predicted from response token t−1.
In backward, the G rows' gradients reach their shared prompt activations and add up, which is exactly what G
separate copies of the prompt would receive.

On the benchmark workload (16 prompts × 8 samples, ~16-token prompts, ~48-token responses) this removes about
a fifth of the tokens an update runs through the decoder.

The decoder must take `past_key_values` (a `DynamicCache`), a 2-D `attention_mask` and `position_ids`, as
Hugging Face decoders do. `matches_plain_forward(model)` checks once per model that this path gives the plain
forward's hidden states; callers use the plain path for any model that fails it.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from transformers.cache_utils import DynamicCache

from literl.rollout.decoding import DistinctPrompts, distinct_prompts

_checked: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def shared_prompts(tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor) -> DistinctPrompts | None:
    """The distinct prompts of the rows (left-padded) and which one each row continues; None when no two rows
    share a prompt (then there is nothing to save)."""
    rows = [row[:n] for row, n in zip(tokens_BL.tolist(), prompt_len_B.tolist())]
    # Any in-vocabulary id pads: padded columns are masked out of attention.
    prompts = distinct_prompts(rows, pad_id=0, device=tokens_BL.device)
    return prompts if prompts.ids_UP.shape[0] < len(rows) else None


def response_hidden(decoder: torch.nn.Module, tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor,
                    valid_BT: torch.Tensor, prompts: DistinctPrompts,
                    buckets: Callable[[torch.Tensor], list[torch.Tensor]]) -> torch.Tensor:
    """Hidden states at valid_BT's True entries (row-major order), the prompts run once.

    Layout as in `literl.batch` (right-padded prompt + response rows); valid_BT must be a prefix of each row's
    response (the response mask). `buckets(length_B)` groups rows of similar response length, so that each
    group's forward is cut to its own longest response.
    """
    device = tokens_BL.device
    prompt_hidden_UPH, prompt_kv = _run_prompts(decoder, prompts)
    flat_index_BT = torch.full(valid_BT.shape, -1, dtype=torch.long, device=device)
    flat_index_BT[valid_BT] = torch.arange(int(valid_BT.sum()), device=device)
    starts_B = torch.nonzero(valid_BT[:, 0]).flatten()
    parts = [prompt_hidden_UPH[prompts.source_B[starts_B], -1]]
    order = [flat_index_BT[starts_B, 0]]
    # Response inputs a row needs: tokens 0 .. n−2 predict tokens 1 .. n−1.
    steps_B = torch.arange(1, valid_BT.shape[1] + 1, device=device).mul(valid_BT).amax(-1) - 1
    rows_with_steps = torch.nonzero(steps_B > 0).flatten()
    if len(rows_with_steps):
        for bucket in buckets(steps_B[rows_with_steps]):
            rows_R = rows_with_steps[bucket]
            hidden_RWH = _run_responses(decoder, tokens_BL, prompt_len_B, prompts, prompt_kv, rows_R,
                                        int(steps_B[rows_R].max()))
            valid_RW = valid_BT[rows_R, 1:hidden_RWH.shape[1] + 1]
            row_M, col_M = valid_RW.nonzero(as_tuple=True)
            parts.append(hidden_RWH[row_M, col_M])
            order.append(flat_index_BT[rows_R, 1:hidden_RWH.shape[1] + 1][valid_RW])
    hidden_MH, order_M = torch.cat(parts), torch.cat(order)
    return hidden_MH[torch.argsort(order_M)]


def _run_prompts(decoder, prompts: DistinctPrompts) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """(hidden_UPH, per-layer (keys, values)) of the distinct prompts."""
    positions_UP = (prompts.real_UP.long().cumsum(-1) - 1).clamp(min=0)
    out = decoder(input_ids=prompts.ids_UP, attention_mask=prompts.real_UP.long(), position_ids=positions_UP,
                  past_key_values=DynamicCache(config=decoder.config), use_cache=True)
    return out.last_hidden_state, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def _run_responses(decoder, tokens_BL, prompt_len_B, prompts: DistinctPrompts, prompt_kv, rows_R: torch.Tensor,
                   width: int) -> torch.Tensor:
    """hidden_RWH of response tokens 0 .. width−1 of rows_R, attending to their prompt's cache."""
    source_R = prompts.source_B[rows_R]
    cache = DynamicCache(ddp_cache_data=[(keys[source_R], values[source_R]) for keys, values in prompt_kv],
                         config=decoder.config)
    positions_RW = prompt_len_B[rows_R, None] + torch.arange(width, device=rows_R.device)[None, :]
    # Columns past a row's end hold whatever follows it (clamped): causal attention keeps them out of its
    # real positions, and their outputs are never read.
    ids_RW = tokens_BL[rows_R].gather(1, positions_RW.clamp(max=tokens_BL.shape[1] - 1))
    attention_RS = torch.cat([prompts.real_UP[source_R], torch.ones_like(ids_RW, dtype=torch.bool)], dim=1)
    out = decoder(input_ids=ids_RW, attention_mask=attention_RS.long(), position_ids=positions_RW,
                  past_key_values=cache, use_cache=True)
    return out.last_hidden_state


def matches_plain_forward(model: torch.nn.Module) -> bool:
    """Whether the shared-prompt path reproduces the decoder's plain forward on a probe (checked once per model).

    Models whose decoder does not take a cache this way (or computes something else with one) answer False.
    """
    if model not in _checked:
        _checked[model] = _probe(model)
    return _checked[model]


@torch.no_grad()
def _probe(model: torch.nn.Module) -> bool:
    decoder = model.get_decoder()
    vocab = model.get_output_embeddings().out_features
    device = next(model.parameters()).device
    rows = [[3, 4, 5, 6, 7, 8], [3, 4, 5, 9], [10, 11, 12, 13, 14], [3, 4, 5, 6, 15]]
    prompt_len_B = torch.tensor([3, 3, 2, 3], device=device)
    tokens_BL = torch.tensor([[t % vocab for t in r] + [0] * (6 - len(r)) for r in rows], device=device)
    valid_BT = torch.arange(4, device=device)[None, :] < (torch.tensor([len(r) for r in rows], device=device)
                                                          - prompt_len_B)[:, None]
    was_training = model.training
    model.eval()
    try:
        prompts = shared_prompts(tokens_BL, prompt_len_B)
        got_MH = response_hidden(decoder, tokens_BL, prompt_len_B, valid_BT, prompts,
                                 buckets=lambda steps: [torch.arange(len(steps), device=device)])
        hidden_BLH = decoder(input_ids=tokens_BL, use_cache=False).last_hidden_state
    except (AttributeError, TypeError, ValueError, RuntimeError, IndexError):
        return False
    finally:
        model.train(was_training)
    positions_BT = (prompt_len_B[:, None] - 1 + torch.arange(4, device=device)[None, :]).clamp(max=5)
    expected_MH = hidden_BLH[torch.arange(4, device=device)[:, None].expand(-1, 4), positions_BT][valid_BT]
    scale = float(expected_MH.abs().max()) + 1.0
    return got_MH.shape == expected_MH.shape and float((got_MH - expected_MH).abs().max()) <= 1e-3 * scale
