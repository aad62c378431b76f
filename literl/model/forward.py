"""A training forward: the decoder's final hidden state at every response position of a batch's rows.

Layout as in `literl.algorithm.batch`: row b holds its prompt then its response, right-padded; the hidden state that
predicts response token 0 is the prompt's last one, and response token t ≥ 1 is predicted from token t−1.

Three ways, chosen by `literl.model.policy.PolicyForward`:

- **shared prompts** (`response_hidden`): the distinct prompts run once (`literl.model.prompt_pass`) and each row's
  response runs on top of a copy of its prompt's keys and values, as the rollout sampled it. In backward the G
  rows' gradients reach their shared prompt activations and add up, exactly what G copies would receive. On the
  benchmark workload this removes about a fifth of the tokens an update runs through the decoder.
- **replayed** (the same, with a `ForwardRecord`): the response tokens' projections are replayed from the
  rollout's record (`literl.model.record`): no forward matmuls, and on CPU no attention forward. The residual
  stream is the embedding plus the recorded outputs, so the hidden states are the rollout's own; gradients equal
  the computed path's within float rounding. Without autograd (an old-log-prob pass before the first optimizer
  step) only the residual additions are left.
- **whole rows by length** (`hidden_by_length`): the model's own forward on whole rows, grouped by length; for
  rows that share no prompt, and for models whose layers the runtime does not run.

The layers of the first two are `literl.model.layer.decoder_layer` applied by hand, or for a model the body does
not run (but whose forward takes a Hugging Face cache) that forward with the prompt's cache.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from transformers.cache_utils import DynamicCache

from literl.model import attention
from literl.model.compiled import compile_for_varying_sizes
from literl.model.grouping import forward_groups
from literl.model.kernels import apply_norm, gather_distinct_rows, repeat_rows
from literl.model.layer import COMPUTED, decoder_layer, embed_and_rotary, routed_linears
from literl.model.moe import Routing, TokenRoutes
from literl.model.prompt_pass import DistinctPrompts, cache_keyword, prompts_by_layers, prompts_by_model
from literl.model.record import ForwardRecord, ReplayedLinears, layer_rows, record_slices


def response_hidden(model: torch.nn.Module, tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor,
                    valid_BT: torch.Tensor, prompts: DistinctPrompts,
                    buckets: Callable[[torch.Tensor], list[torch.Tensor]], *, by_layers: bool, compiled: bool = False,
                    record: ForwardRecord | None = None, routing: Routing | None = None) -> torch.Tensor:
    """Hidden states at valid_BT's True entries (row-major order), the prompts run once.

    valid_BT must be a prefix of each row's response (the response mask). `buckets(length_B)` groups rows of
    similar response length, so that each group's forward is cut to its own longest response. `by_layers`: the
    hand-applied layers (else the decoder's own forward with a cache); `compiled=True` runs them through
    `torch.compile`. With a `record` (whose `row_BT` covers these rows) the response tokens' projections are
    replayed from it. `routing` (hand-applied layers only) routes the MoE layers of every token of these rows,
    prompt and response, by their batch positions (`literl.model.moe`).
    """
    device, decoder = tokens_BL.device, model.get_decoder()
    if by_layers:
        prompt_routes = None if routing is None else prompts.routes_at(routing)
        prompt_hidden_UXH, prompt_kv = prompts_by_layers(decoder, prompts, compiled=compiled, routes=prompt_routes)
        if routing is not None and routing.record_BLNK is not None:
            prompts.share_prompt_routes(routing.record_BLNK)
    else:
        prompt_hidden_UXH, prompt_kv = prompts_by_model(decoder, prompts)
    flat_index_BT = torch.full(valid_BT.shape, -1, dtype=torch.long, device=device)
    flat_index_BT[valid_BT] = torch.arange(int(valid_BT.sum()), device=device)
    starts_B = torch.nonzero(valid_BT[:, 0]).flatten()
    # The G rows of a group read their prompt's last hidden state: repeat_rows, whose backward adds their
    # gradients in a fixed order (indexing's backward, an accumulating index_put, adds them in whichever order
    # its threads reach them, so 2-thread updates did not reproduce themselves).
    parts = [repeat_rows(prompt_hidden_UXH[:, -1], prompts.source_B[starts_B])]
    order = [flat_index_BT[starts_B, 0]]
    # Response inputs a row needs: tokens 0 .. n−2 predict tokens 1 .. n−1.
    steps_B = torch.arange(1, valid_BT.shape[1] + 1, device=device).mul(valid_BT).amax(-1) - 1
    rows_with_steps = torch.nonzero(steps_B > 0).flatten()
    if len(rows_with_steps):
        for bucket in buckets(steps_B[rows_with_steps]):
            rows_R = rows_with_steps[bucket]
            width = int(steps_B[rows_R].max())
            positions_RW = prompt_len_B[rows_R, None] + torch.arange(width, device=device)[None, :]
            # Columns past a row's end hold whatever follows it (clamped): causal attention keeps them out of
            # its real positions, and their outputs are never read.
            ids_RW = tokens_BL[rows_R].gather(1, positions_RW.clamp(max=tokens_BL.shape[1] - 1))
            source_R = prompts.source_B[rows_R]
            prefix_kv = [(repeat_rows(keys, source_R), repeat_rows(values, source_R)) for keys, values in prompt_kv]
            # The hidden states of fed tokens w < steps predict tokens w + 1: exactly valid_BT[:, 1:].
            valid_RW = valid_BT[rows_R, 1:width + 1]
            prompt_real_RX = prompts.real_UX[source_R]
            if record is not None:
                hidden_MH, row_M, col_M = replayed_responses(
                    decoder, ids_RW, positions_RW, prompt_real_RX, prefix_kv, valid_RW,
                    record.row_BT[rows_R.to(record.row_BT.device), :width].to(device), record, compiled=compiled)
            elif by_layers:
                routes = None if routing is None else routing.at(rows_R[:, None].expand_as(ids_RW), positions_RW,
                                                                 valid_RW)
                hidden_RWH = responses_by_layers(decoder, ids_RW, positions_RW, prompt_real_RX, prefix_kv,
                                                 compiled=compiled, routes=routes)
            else:
                hidden_RWH = _responses_by_model(decoder, ids_RW, positions_RW, prompt_real_RX, prefix_kv)
            if record is None:
                row_M, col_M = valid_RW.nonzero(as_tuple=True)
                hidden_MH = hidden_RWH[row_M, col_M]
            parts.append(hidden_MH)
            order.append(flat_index_BT[rows_R[row_M], col_M + 1])
    hidden_MH, order_M = torch.cat(parts), torch.cat(order)
    return gather_distinct_rows(hidden_MH, torch.argsort(order_M))


# ------------------------------------------------------------------------------------------ responses by hand
def response_layer(layer: torch.nn.Module, hidden_RWH: torch.Tensor, prefix_keys: torch.Tensor,
                   prefix_values: torch.Tensor, cos_RWD: torch.Tensor, sin_RWD: torch.Tensor,
                   bias_R1WS: torch.Tensor, linears=COMPUTED) -> torch.Tensor:
    """One layer on response tokens that also attend to their prompt's keys and values (`bias_R1WS`:
    `attention.causal_bias`)."""
    # The head axis is added here, not by the caller: a compiled graph then sees it as a constant 1.
    return decoder_layer(layer, hidden_RWH, cos_RWD[:, :, None], sin_RWD[:, :, None], linears=linears,
                         attention=attention.dense(bias_R1WS, prefix=(prefix_keys, prefix_values)))


@functools.cache
def compiled_response_layer():
    """`response_layer` through `torch.compile` (compiled on first use, once per process): inductor fuses each
    layer's element-wise work (norms, rotary, SiLU·up, residuals) forward and backward. One graph serves every
    layer of a model (the layer's weights are graph inputs) and every bucket shape; forwards with one row, a
    width of one or a one-token prompt run eagerly (`literl.model.compiled`), and so do MoE layers whose routes are
    recorded or replayed. On the step-speed benchmark (CPU, 2 threads): 8-13% less update time for a few seconds of
    compile."""
    return compile_for_varying_sizes(
        response_layer, eager_when=lambda layer, hidden_RWH, prefix_keys, prefix_values, cos, sin, bias, linears:
        linears is not COMPUTED or min(hidden_RWH.shape[0], hidden_RWH.shape[1], prefix_keys.shape[2]) < 2)


def responses_by_layers(decoder, ids_RW: torch.Tensor, positions_RW: torch.Tensor, prompt_real_RX: torch.Tensor,
                        prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], *, compiled: bool = False,
                        routes: TokenRoutes | None = None) -> torch.Tensor:
    """hidden_RWH of response tokens, each layer (`response_layer`) attending to its prompt's keys and values
    prepended to the response's own. The same maths as the decoder's own forward with a cache, without what a
    generic forward pays for: no cache object (whose update copies the keys), no mask construction, grouped-query
    attention without repeated keys and values, RMS norms with a hand-written backward; ~9% less update time."""
    W = ids_RW.shape[1]
    hidden_RWH, cos_RWD, sin_RWD = embed_and_rotary(decoder, ids_RW, positions_RW)
    bias_R1WS = attention.causal_bias(prompt_real_RX, W, hidden_RWH.dtype)
    apply_layer = compiled_response_layer() if compiled else response_layer
    for layer, (prefix_keys, prefix_values), linears in zip(decoder.layers, prefix_kv,
                                                            routed_linears(decoder.layers, routes)):
        hidden_RWH = apply_layer(layer, hidden_RWH, prefix_keys, prefix_values, cos_RWD, sin_RWD, bias_R1WS, linears)
    return apply_norm(decoder.norm, hidden_RWH)


def _responses_by_model(decoder, ids_RW, positions_RW, prompt_real_RX, prefix_kv) -> torch.Tensor:
    """hidden_RWH of the response tokens through the decoder's own forward, on a cache holding their prompt."""
    cache = DynamicCache(ddp_cache_data=prefix_kv, config=decoder.config)
    attention_RS = torch.cat([prompt_real_RX, torch.ones_like(ids_RW, dtype=torch.bool)], dim=1)
    out = decoder(input_ids=ids_RW, attention_mask=attention_RS.long(), position_ids=positions_RW, use_cache=True,
                  **{cache_keyword(decoder): cache})
    return out.last_hidden_state


# ------------------------------------------------------------------------------------------ replayed responses
def replayed_layers(decoder, hidden_MH: torch.Tensor, record_layers: list[tuple[torch.Tensor, ...]],
                    record_row_M: torch.Tensor | None, cos_MD: torch.Tensor, sin_MD: torch.Tensor,
                    prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], slot_M: torch.Tensor, rows: int, width: int,
                    bias_R1WS: torch.Tensor) -> torch.Tensor:
    """Every layer and the final norm on m packed tokens, their projections (and on CPU their attention)
    replayed: their recorded outputs are record_layers[l]'s rows record_row_M, or, with record_row_M None, those
    buffers as they are (slices of the record). A layer gathers its rows when it runs, so that only what its
    backward needs outlives it. Attention runs on the padded [rows, heads, width, D] layout (`slot_M` =
    row·width + column of each token); everything else on the packed tokens, so no projection's backward computes
    on padding."""
    cos_M1D, sin_M1D = cos_MD[:, None], sin_MD[:, None]
    for layer, prefix, buffers in zip(decoder.layers, prefix_kv, record_layers):
        recorded = layer_rows(buffers, record_row_M)
        hidden_MH = decoder_layer(layer, hidden_MH, cos_M1D, sin_M1D, linears=ReplayedLinears(recorded[:4]),
                                  attention=attention.replayed(prefix, slot_M, rows, width, bias_R1WS, recorded[4:]))
    return apply_norm(decoder.norm, hidden_MH)


@functools.cache
def compiled_replayed_layers():
    """`replayed_layers` through `torch.compile` (once per process; one graph for every bucket, with element-wise
    work fused across layer boundaries); a bucket with one row, one token, a width of one or a one-token prompt
    runs eagerly."""
    return compile_for_varying_sizes(
        replayed_layers, eager_when=lambda decoder, hidden_MH, record_layers, record_row_M, cos, sin, prefix_kv,
        slot_M, rows, width, bias: min(hidden_MH.shape[0], prefix_kv[0][0].shape[2], rows, width) < 2)


def replayed_responses(decoder, ids_RW: torch.Tensor, positions_RW: torch.Tensor, prompt_real_RX: torch.Tensor,
                       prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], fed_RW: torch.Tensor,
                       record_row_RW: torch.Tensor, record: ForwardRecord, *, compiled: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden_MH, row_M, column_M): the hidden states (final norm applied) of the fed response tokens of a bucket
    of rows (fed_RW's True entries: the tokens a decode step consumed, a prefix of each row), token i at
    (row_M[i], column_M[i]), from the record.

    Tokens run in the order of their record rows. When they are exactly a run of consecutive record rows (the
    update of a whole rollout batch in one bucket) each layer reads slices of the record itself, not gathered
    copies (with the one pass, `grouping.replay_groups`: update −8% compiled, −2% eager on the benchmark workload
    against by-length groups, alternating A/B).
    """
    R, W = ids_RW.shape
    row_M, column_M = fed_RW.nonzero(as_tuple=True)
    record_row_M, by_record_M = torch.sort(record_row_RW[row_M, column_M])
    if bool((record_row_M < 0).any()):
        raise ValueError("a fed response token has no record row: the record does not cover this batch")
    row_M, column_M = row_M[by_record_M], column_M[by_record_M]
    hidden_MH = decoder.embed_tokens(ids_RW[row_M, column_M])
    if not torch.is_grad_enabled():
        # Values only (an old-log-prob pass): each layer adds its recorded o and down outputs to the residual
        # stream, so nothing but those additions and the final norm is left to compute.
        residual_adds, rows = record_slices([(layer[1], layer[3]) for layer in record.layers], record_row_M)
        for pair in residual_adds:      # each layer's (o, down) of its (qkv, o, gate_up, down, ...)
            o_MH, down_MH = layer_rows(pair, rows)
            hidden_MH = hidden_MH + o_MH + down_MH
        return apply_norm(decoder.norm, hidden_MH), row_M, column_M
    record_layers, rows = record_slices(record.layers, record_row_M)
    cos_MD, sin_MD = (x[0] for x in decoder.rotary_emb(hidden_MH[None], positions_RW[row_M, column_M][None]))
    run = compiled_replayed_layers() if compiled else replayed_layers
    hidden_MH = run(decoder, hidden_MH, record_layers, rows, cos_MD, sin_MD, prefix_kv, row_M * W + column_M, R, W,
                    attention.causal_bias(prompt_real_RX, W, hidden_MH.dtype))
    return hidden_MH, row_M, column_M


# ------------------------------------------------------------------------------------------ whole rows
def hidden_by_length(decoder, tokens_BL: torch.Tensor, pos_BT: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
    """Hidden states at the real response positions (valid_BT's True entries, row-major), the decoder's own forward
    run on groups of rows of similar length, each cut to its own longest row: no compute on most of the padding."""
    needed_B = torch.where(valid_BT, pos_BT + 1, torch.zeros_like(pos_BT)).amax(-1).clamp(min=1)
    parts, order = [], []
    flat_index_BT = torch.full_like(pos_BT, -1)
    flat_index_BT[valid_BT] = torch.arange(int(valid_BT.sum()), device=pos_BT.device)
    for rows_R in forward_groups(needed_B):
        width = int(needed_B[rows_R].max())
        hidden_RLH = decoder(input_ids=tokens_BL[rows_R, :width], use_cache=False).last_hidden_state
        valid_RT = valid_BT[rows_R]
        row_M, col_M = valid_RT.nonzero(as_tuple=True)
        parts.append(hidden_RLH[row_M, pos_BT[rows_R][row_M, col_M]])
        order.append(flat_index_BT[rows_R][valid_RT])
    hidden_MH, order_M = torch.cat(parts), torch.cat(order)
    return hidden_MH[torch.argsort(order_M)]
