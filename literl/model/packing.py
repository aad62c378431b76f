"""Packed rows: a batch's rows (prompt then response, `literl.algorithm.batch` layout) as one stream of tokens
without padding, each row attending to its own earlier tokens only, and the training forward over such a stream.

    stream  row 0's tokens | row 1's tokens | …      (each row cut after its last token that predicts a response
                                                      token: the last response token is never an input)
    cu_R1   [0, len₀, len₀ + len₁, …]                 where each row starts (what varlen kernels take)

Everything that describes the stream — ids, positions, row starts, which stream position predicts which response
token, where each log-prob goes in [B, T] — is computed on the CPU from the CPU-side batch (`pack_rows`) and moved
to the device in one pinned, non-blocking copy (`PackedRows.to`). So the forward over it never waits for the device
to tell it a shape: no `.item()`, `nonzero` or boolean indexing on device tensors, which on a GPU each stall the
host until the device catches up (a micro-batch loop with tens of those per micro-batch leaves the GPU idle
between kernels).

With `share_prompts=True` (`pack_rows`) rows that continue the same prompt (a GRPO group) share it: each distinct
prompt is one segment of the stream, run through the layers once, and each row's response is a segment of its own
whose attention reads its prompt's keys and values (gathered, `key_Y`) before its own:

    stream  prompt a | prompt b | row 0's response | row 1's response | …     (rows 0, 1 continue prompt a)
    keys    prompt a | prompt b | prompt a, row 0's response | prompt a, row 1's response | …

a response token at offset i of its segment sees its prompt and its segment's tokens up to i (causal attention
aligned at the segments' ends, as flash attention's varlen kernel aligns it when a segment has more keys than
queries). The values are the whole rows' — same tokens, same positions — and in backward the rows' gradients reach
the shared prompt and add up, as the CPU's shared-prompt forward does (`literl.model.forward`). The response token
predicted by the prompt's last token reads that token's shared hidden state.

The layers are `literl.model.layer.decoder_layer` with the `attention.packed` maker: the same body as every other
pass, only the attention sees the rows' boundaries.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from literl.model import attention
from literl.model.compiled import compile_for_varying_sizes
from literl.model.kernels import apply_norm, gather_distinct_rows, repeat_rows
from literl.model.layer import decoder_layer, routed_linears
from literl.model.moe import TokenRoutes

_INDEX_FIELDS = ("ids_M", "position_M", "row_M", "slot_M", "predictor_P", "target_P", "flat_P", "cu_R1")
_KEY_FIELDS = ("key_Y", "cu_key_R1", "own_slot_M", "copy_slot_A", "copy_source_A")


@dataclass
class PackedRows:
    """Rows as one token stream (M tokens) in R segments, and the P response tokens whose log-probs it gives.

    ids_M, position_M   token ids and rotary positions (a token's column in its row: 0 at the row's first)
    row_M               the batch row of each token (b, not the segment index: MoE routes are read by it; a shared
                        prompt's tokens carry the first row of their prompt)
    slot_M              segment · width + offset: the token's place in a right-padded [rows, width] layout
    cu_R1               segment starts in the stream, rows + 1 entries (int32 on the device, as varlen kernels
                        take); a segment is a whole row, or with shared prompts a distinct prompt or a response
    predictor_P         the stream position whose output predicts each response token, row-major over valid_BT
    target_P            that response token's id
    flat_P              b · T + t of each: where its log-prob goes in a [B, T] map
    rows, width         segments and the longest one's length (Python ints: shapes the host knows)
    batch_rows, T       the [B, T] shape of the log-probs
    key_Y, cu_key_R1        shared prompts only (else None): the stream position of every key each segment attends
                        over, segment after segment (a response's: its prompt's, then its own), and where each
                        segment's keys start
    key_width           the longest segment's keys (0 without shared prompts)
    own_slot_M          shared prompts only: where each stream token's own key goes among the K keys (once each)
    copy_slot_A, copy_source_A   shared prompts only: the C copies of prompt keys in response segments, where they
                        go and which stream token they copy (key_Y = own keys and copies, `attention.gathered_keys`)
    """

    ids_M: torch.Tensor
    position_M: torch.Tensor
    row_M: torch.Tensor
    slot_M: torch.Tensor
    predictor_P: torch.Tensor
    target_P: torch.Tensor
    flat_P: torch.Tensor
    cu_R1: torch.Tensor
    rows: int
    width: int
    batch_rows: int
    T: int
    key_Y: torch.Tensor | None = None
    cu_key_R1: torch.Tensor | None = None
    key_width: int = 0
    own_slot_M: torch.Tensor | None = None
    copy_slot_A: torch.Tensor | None = None
    copy_source_A: torch.Tensor | None = None

    @property
    def shares_prompts(self) -> bool:
        return self.key_Y is not None

    @property
    def tokens(self) -> int:
        return int(self.ids_M.shape[0])

    def to(self, device: torch.device) -> "PackedRows":
        """The same rows on `device`: every index tensor in one pinned buffer, copied without blocking the host."""
        if device.type == "cpu":
            return self
        names = _INDEX_FIELDS + (_KEY_FIELDS if self.shares_prompts else ())
        parts = [getattr(self, name) for name in names]
        flat = torch.cat([part.long() for part in parts])
        if device.type == "cuda":
            flat = flat.pin_memory()
        flat = flat.to(device, non_blocking=True)
        moved = dict(zip(names, flat.split([part.numel() for part in parts])))
        for starts in ("cu_R1", "cu_key_R1"):
            if starts in moved:
                moved[starts] = moved[starts].to(torch.int32)
        return dataclasses.replace(self, **moved)


def pack_rows(tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, valid_BT: torch.Tensor, *,
              share_prompts: bool = False) -> PackedRows:
    """The stream of the rows' tokens up to each row's last predictor of a valid response token (valid_BT must be
    a prefix of each row's response mask), on the CPU. Rows without a valid token are left out. `share_prompts`:
    rows continuing the same prompt share it (the module docstring), where at least two rows do."""
    tokens_BL, prompt_len_B, valid_BT = tokens_BL.cpu(), prompt_len_B.cpu().long(), valid_BT.cpu().bool()
    B, T = valid_BT.shape
    if B and int(prompt_len_B.min()) < 1:
        raise ValueError("every row needs a prompt of at least one token")
    count_B = valid_BT.sum(-1)
    if share_prompts:
        shared = _shared_prompt_rows(tokens_BL, prompt_len_B, valid_BT, count_B)
        if shared is not None:
            return shared
    # Response token t is predicted at position prompt_len − 1 + t: a row needs its first prompt_len + count − 1.
    length_B = torch.where(count_B > 0, prompt_len_B + count_B - 1, torch.zeros_like(count_B)).clamp(
        max=tokens_BL.shape[1])
    kept_R = torch.nonzero(length_B > 0).flatten()
    length_R = length_B[kept_R]
    cu_R1 = torch.cat([torch.zeros(1, dtype=torch.long), length_R.cumsum(0)])
    packed_row_M = torch.repeat_interleave(torch.arange(len(kept_R)), length_R)
    position_M = torch.arange(int(cu_R1[-1])) - cu_R1[packed_row_M]
    row_M = kept_R[packed_row_M]
    width = int(length_R.max()) if len(kept_R) else 0
    packed_row_B = torch.full((B,), -1, dtype=torch.long)
    packed_row_B[kept_R] = torch.arange(len(kept_R))
    b_P, t_P = valid_BT.nonzero(as_tuple=True)
    position_P = prompt_len_B[b_P] - 1 + t_P
    return PackedRows(
        ids_M=tokens_BL[row_M, position_M], position_M=position_M, row_M=row_M,
        slot_M=packed_row_M * width + position_M, predictor_P=cu_R1[packed_row_B[b_P]] + position_P,
        target_P=tokens_BL[b_P, (position_P + 1).clamp(max=tokens_BL.shape[1] - 1)], flat_P=b_P * T + t_P,
        cu_R1=cu_R1, rows=len(kept_R), width=width, batch_rows=B, T=T)


def _shared_prompt_rows(tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, valid_BT: torch.Tensor,
                        count_B: torch.Tensor) -> PackedRows | None:
    """`pack_rows` with each distinct prompt once; None when no two kept rows continue the same prompt."""
    B, T = valid_BT.shape
    kept = torch.nonzero(count_B > 0).flatten()
    if len(kept) < 2:
        return None
    source_K, first_U = _distinct_prompt_rows(tokens_BL[kept], prompt_len_B[kept])
    if len(first_U) == len(kept):
        return None
    prompt_B = torch.full((B,), -1, dtype=torch.long)
    prompt_B[kept] = source_K
    first_U = kept[first_U]
    prompt_len_U = prompt_len_B[first_U]
    # Segments: the U distinct prompts, then one per row with a response token to feed (a row whose only valid token is
    # predicted by its prompt's last token has none).
    responding = torch.nonzero(count_B > 1).flatten()
    responding_length = count_B[responding] - 1
    length_R = torch.cat([prompt_len_U, responding_length])
    cu_R1 = torch.cat([torch.zeros(1, dtype=torch.long), length_R.cumsum(0)])
    segment_M = torch.repeat_interleave(torch.arange(len(length_R)), length_R)
    offset_M = torch.arange(int(cu_R1[-1])) - cu_R1[segment_M]
    U = len(prompt_len_U)
    is_prompt_M = segment_M < U
    row_R = torch.cat([first_U, responding])
    row_M = row_R[segment_M]
    # A response segment starts at its row's prompt length: token prompt_len + offset of its row.
    position_M = offset_M + torch.where(is_prompt_M, 0, prompt_len_B[row_M])
    # Keys: a prompt segment its own tokens; a response segment its prompt's, then its own.
    prompt_start_U = cu_R1[:U]
    responding_prompt = prompt_B[responding]
    key_length_R = torch.cat([prompt_len_U, prompt_len_U[responding_prompt] + responding_length])
    cu_key_R1 = torch.cat([torch.zeros(1, dtype=torch.long), key_length_R.cumsum(0)])
    key_segment_Y = torch.repeat_interleave(torch.arange(len(length_R)), key_length_R)
    key_offset_Y = torch.arange(int(cu_key_R1[-1])) - cu_key_R1[key_segment_Y]
    # The key's prompt (for a response segment: its row's) and whether the key is one of that prompt's tokens.
    key_prompt_Y = torch.where(key_segment_Y < U, key_segment_Y, prompt_B[row_R[key_segment_Y]])
    in_prompt_Y = (key_segment_Y < U) | (key_offset_Y < prompt_len_U[key_prompt_Y])
    key_Y = torch.where(in_prompt_Y, prompt_start_U[key_prompt_Y] + key_offset_Y,
                        cu_R1[key_segment_Y] + key_offset_Y - prompt_len_U[key_prompt_Y])
    # Each stream token's own key appears once; prompt keys in response segments are copies.
    copy_Y = in_prompt_Y & (key_segment_Y >= U)
    copy_slot_A = copy_Y.nonzero().flatten()
    own_slots = (~copy_Y).nonzero().flatten()
    own_slot_M = torch.empty(len(position_M), dtype=torch.long)
    own_slot_M[key_Y[own_slots]] = own_slots
    segment_of_row_B = torch.full((B,), -1, dtype=torch.long)
    segment_of_row_B[responding] = torch.arange(U, U + len(responding))
    b_P, t_P = valid_BT.nonzero(as_tuple=True)
    first_token_P = t_P == 0
    predictor_P = torch.where(first_token_P, prompt_start_U[prompt_B[b_P]] + prompt_len_B[b_P] - 1,
                              cu_R1[segment_of_row_B[b_P].clamp(min=0)] + t_P - 1)
    position_P = prompt_len_B[b_P] - 1 + t_P
    width = int(length_R.max())
    return PackedRows(
        ids_M=tokens_BL[row_M, position_M], position_M=position_M, row_M=row_M, slot_M=segment_M * width + offset_M,
        predictor_P=predictor_P, target_P=tokens_BL[b_P, (position_P + 1).clamp(max=tokens_BL.shape[1] - 1)],
        flat_P=b_P * T + t_P, cu_R1=cu_R1, rows=len(length_R), width=width, batch_rows=B, T=T, key_Y=key_Y,
        cu_key_R1=cu_key_R1, key_width=int(key_length_R.max()), own_slot_M=own_slot_M, copy_slot_A=copy_slot_A,
        copy_source_A=key_Y[copy_slot_A])


def _distinct_prompt_rows(tokens_KL: torch.Tensor, prompt_len_K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which distinct prompt each row continues (source_K) and the first row of each (first_U), the distinct
    prompts numbered in the order they first appear. A GRPO batch holds each prompt's rows one after another, so
    rows are first compared with the row before them (tensor work: a row's prompt tokens, -1 after them, which no
    token id is), and only the first row of each run of equal prompts is looked up by its tokens: for 256 rows in
    groups of 8, 32 Python tuples and 0.34 ms on this project's CPU, where a tuple per row took 4.4 ms."""
    K, X = len(prompt_len_K), int(prompt_len_K.max())
    ids_KX = torch.where(torch.arange(X) < prompt_len_K[:, None], tokens_KL[:, :X], -1)
    starts_run_K = torch.ones(K, dtype=torch.bool)
    starts_run_K[1:] = (ids_KX[1:] != ids_KX[:-1]).any(-1)
    run_K = starts_run_K.cumsum(0) - 1
    run_first_R = torch.nonzero(starts_run_K).flatten()
    number: dict[tuple[int, ...], int] = {}
    prompt_of_run = [number.setdefault(tuple(row), len(number)) for row in ids_KX[run_first_R].tolist()]
    prompt_R = torch.tensor(prompt_of_run, dtype=torch.long)
    first_run_U = torch.full((len(number),), len(run_first_R), dtype=torch.long).scatter_reduce(
        0, prompt_R, torch.arange(len(run_first_R)), "amin")
    return prompt_R[run_K], run_first_R[first_run_U]


def packed_layers(decoder, packed: PackedRows, kernel: str, routes: TokenRoutes | None = None, *,
                  compiled: bool = False) -> torch.Tensor:
    """hidden_PH (final norm applied) of the stream positions that predict response tokens: every layer on the
    whole stream, each row attending to itself (`attention.packed` with `kernel`). `routes`: the tokens' MoE
    routing (`literl.model.moe`), by their batch rows and positions. `compiled=True`: each layer through
    `compiled_varlen_layer` (the varlen kernel) or `compiled_packed_layer` (the others); layers whose MoE routes
    are given run eagerly."""
    # The embedding of the flat ids, not a view of a [1, M, H] one: a compiled layer would guard on its input's
    # base, which the first layer's input has and the next ones' do not (a recompile for the second layer).
    hidden_MH = decoder.embed_tokens(packed.ids_M)
    cos_1MD, sin_1MD = decoder.rotary_emb(hidden_MH[None], packed.position_M[None])
    cos_M1D, sin_M1D = cos_1MD[0, :, None], sin_1MD[0, :, None]
    if compiled and routes is None and kernel == "varlen":
        layer_step, options = compiled_varlen_layer(), attention.varlen_options_of(decoder.layers[0].self_attn)
        for layer in decoder.layers:
            hidden_MH = layer_step(layer, hidden_MH, cos_M1D, sin_M1D, packed.cu_R1, packed.width, packed.cu_key_R1,
                                   packed.key_width, packed.own_slot_M, packed.copy_slot_A, packed.copy_source_A,
                                   options)
    elif compiled and routes is None:
        layer_step = compiled_packed_layer()
        for layer in decoder.layers:
            hidden_MH = layer_step(layer, hidden_MH, cos_M1D, sin_M1D, packed, kernel)
    else:
        attend = attention.packed(packed, kernel)
        for layer, linears in zip(decoder.layers, routed_linears(decoder.layers, routes)):
            hidden_MH = decoder_layer(layer, hidden_MH, cos_M1D, sin_M1D, attention=attend, linears=linears)
    # With shared prompts the prompts' last tokens predict the first response token of every row continuing them:
    # a gather with repeats, whose backward adds.
    gather = repeat_rows if packed.shares_prompts else gather_distinct_rows
    return apply_norm(decoder.norm, gather(hidden_MH, packed.predictor_P))


def packed_layer(layer, hidden_MH: torch.Tensor, cos_M1D: torch.Tensor, sin_M1D: torch.Tensor, packed: PackedRows,
                 kernel: str) -> torch.Tensor:
    """One layer of `packed_layers` (computed projections)."""
    return decoder_layer(layer, hidden_MH, cos_M1D, sin_M1D, attention=attention.packed(packed, kernel))


@functools.cache
def compiled_packed_layer():
    """`packed_layer` through `torch.compile`: inductor fuses the layer's element-wise work (the norms, their
    float32 casts, rotary, SiLU·up, the residual adds) forward and backward, which eager runs as ~50 separate
    memory-bound kernels per layer and micro-batch: eager they took several times the matmuls' device time
    (results/benchmarks/2026-11-27_h100_gpu-step.md). One graph serves every layer (the layer's weights are graph
    inputs) and
    every stream length; the attention kernel itself runs eagerly between the layer's two graphs
    (`attention.packed`), so the rows' starts and width never become guards. A stream of one token runs eagerly."""
    return compile_for_varying_sizes(packed_layer, name="a packed layer",
                                     eager_when=lambda layer, hidden_MH, *rest: hidden_MH.shape[0] < 2)


def varlen_layer(layer, hidden_MH: torch.Tensor, cos_M1D: torch.Tensor, sin_M1D: torch.Tensor, cu_R1: torch.Tensor,
                 width: int, cu_key_R1: torch.Tensor | None, key_width: int, own_slot_M: torch.Tensor | None,
                 copy_slot_A: torch.Tensor | None, copy_source_A: torch.Tensor | None, options: dict) -> torch.Tensor:
    """One layer of `packed_layers` with the varlen kernel, traced whole (`attention.varlen_in_graph`); the
    stream's layout comes as separate arguments, so that its lengths are symbolic ints of the graph."""
    layout = attention.VarlenLayout(cu_R1, width, cu_key_R1, key_width, own_slot_M, copy_slot_A, copy_source_A)
    return decoder_layer(layer, hidden_MH, cos_M1D, sin_M1D, attention=attention.varlen_in_graph(layout, options))


@functools.cache
def compiled_varlen_layer():
    """`varlen_layer` through `torch.compile`: the layer and its attention in one graph forward and one backward
    (`compiled_packed_layer` calls two graphs and an eager kernel per layer, whose host cost the GPU waited for
    in the 0.6B body's update: results/benchmarks/2026-11-27_h200_compiled-update.md). One graph serves every layer,
    stream length and width (the width
    is a symbolic int: no recompile per micro-batch); a stream of one token or rows of one token run eagerly. A
    stream with shared prompts is a graph of its own (the keys' gather in it)."""
    return compile_for_varying_sizes(varlen_layer, name="a packed layer (varlen in the graph)",
                                     eager_when=lambda layer, hidden_MH, cos, sin, cu_R1, width, *keys_and_options:
                                     hidden_MH.shape[0] < 2 or width < 2)


def unpacked(values_P: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """values_P back to [B, T] (0 where no response token was counted); the backward gathers."""
    out = values_P.new_zeros(packed.batch_rows * packed.T)
    return out.index_copy(0, packed.flat_P, values_P).view(packed.batch_rows, packed.T)
