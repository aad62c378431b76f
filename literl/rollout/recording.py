"""The rollout's forward, kept for the update: every matmul output of every decode step, per layer.

Why: in an on-policy update (one optimizer step per rollout batch, the engine sampling from the policy module
itself), the training forward recomputes exactly what the decode steps already computed, with the same
weights. Keeping the outputs of the decode's matmuls lets the update skip its forward matmuls: a layer's
backward needs each projection's input (cheap element-wise work, recomputed) and the gradient of its output,
never the forward matmul itself (`literl.training.replay`). The update then costs 4N FLOPs per trained token
instead of 6N.

What is kept, per layer and fed response token (one row per token a decode step consumed), in the model's dtype:

    [ q | k | v ]   the attention projections' outputs (before the per-head norms and rotary)
    [ o ]           the output projection's output (what the layer adds to the residual stream)
    [ gate | up ]   the MLP's input projections
    [ down ]        the MLP's output projection (the layer's second residual add)
    [ attention ]   on CPU: the attention's output (o_proj's input), one D-vector per query head,
    [ lse ]         and its log-sum-exp per query head, which the CPU flash kernel's backward takes: the update
                    then runs the attention's backward only (`replay.RecordedAttention`), not its forward again

The residual stream itself is not kept: it is the embedding plus these outputs, recomputed exactly. The buffers
are reused from one rollout to the next (allocating hundreds of MB per step costs page faults), so a record is
valid only until the engine's next recording call (`ForwardRecord.valid`), and only for the weights it was
recorded with (`ForwardRecord.matches`).

Applies to the Llama/Qwen-style layers the static decode step runs (`static_kv.has_supported_structure`) whose
MLP is `down(act(gate(x)) · up(x))`; `supports_recording` checks that and compares a few recorded steps with
the plain static step.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from literl.compiled import compile_for_varying_sizes
from literl.rollout.decoding import distinct_prompts, prefill
from literl.rollout.generator import SamplingParams
from literl.rollout.static_kv import StaticKVDecoder, attend_projected, has_supported_structure, sampled

# Keys under which a recording generation puts the record and its row index in its extras (literl.batch).
RECORD_KEY = "rollout_forward"
RECORD_ROW_KEY = "rollout_forward_row_BT"
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class RecordLayout:
    """Widths of what one layer records per fed token (see the module docstring)."""

    q: int          # q_proj out_features
    kv: int         # k_proj (= v_proj) out_features
    hidden: int     # o_proj / down_proj out_features
    ffn: int        # gate_proj (= up_proj) out_features
    heads: int      # query heads whose attention output and log-sum-exp are kept; 0: the attention is not kept

    @property
    def widths(self) -> tuple[int, ...]:
        """(qkv, o, gate_up, down), then (attention, lse) when the attention is kept."""
        kept = (self.q, self.heads) if self.heads else ()
        return self.q + 2 * self.kv, self.hidden, 2 * self.ffn, self.hidden, *kept

    def dtypes(self, dtype: torch.dtype) -> tuple[torch.dtype, ...]:
        """Each buffer's dtype: the model's, but at least fp32 for the log-sum-exp (the flash kernel keeps it in
        fp32 for half-precision inputs, in fp64 for fp64 ones, and its backward takes it so)."""
        kept = (dtype, torch.promote_types(dtype, torch.float32)) if self.heads else ()
        return dtype, dtype, dtype, dtype, *kept

    @staticmethod
    def of(model: torch.nn.Module) -> "RecordLayout":
        layer = model.get_decoder().layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        device = next(model.parameters()).device
        return RecordLayout(q=attn.q_proj.out_features, kv=attn.k_proj.out_features,
                            hidden=attn.o_proj.out_features, ffn=mlp.gate_proj.out_features,
                            heads=attn.q_proj.out_features // attn.head_dim if keeps_attention(device) else 0)


def keeps_attention(device: torch.device) -> bool:
    """Whether a record on this device keeps the attention's output and log-sum-exp: on CPU, whose flash-attention
    kernel returns the log-sum-exp and whose backward takes it. Elsewhere the update recomputes the attention."""
    return device.type == "cpu"


def record_bytes(model: torch.nn.Module, rows: int) -> int:
    """Memory a record of `rows` fed tokens takes (every layer)."""
    layout = RecordLayout.of(model)
    dtypes = layout.dtypes(next(model.parameters()).dtype)
    per_token = sum(width * dtype.itemsize for width, dtype in zip(layout.widths, dtypes))
    return rows * per_token * len(model.get_decoder().layers)


class RecordBuffers:
    """Per layer, one [capacity, width] buffer per recorded output (`RecordLayout.widths`), reused by
    successive records; the latest record owns them. One contiguous buffer per output lets a decode step's
    matmul write its rows in place (no copy)."""

    def __init__(self):
        self.layers: list[tuple[torch.Tensor, ...]] = []
        self.owner: "weakref.ref[ForwardRecord] | None" = None

    def lease(self, record: "ForwardRecord", model: torch.nn.Module, rows: int, device: torch.device
              ) -> list[tuple[torch.Tensor, ...]]:
        layout, n_layers = RecordLayout.of(model), len(model.get_decoder().layers)
        widths, dtypes = layout.widths, layout.dtypes(next(model.parameters()).dtype)
        current = self.layers[0] if self.layers else None
        if (current is None or len(self.layers) != n_layers or current[0].shape[0] < rows
                or tuple(b.shape[1] for b in current) != widths or current[0].device != device
                or tuple(b.dtype for b in current) != dtypes):
            self.layers = []    # free the old buffers before allocating the new ones
            # Outside inference mode: the update reads them with autograd on.
            with torch.inference_mode(False):
                self.layers = [tuple(torch.empty(rows, w, device=device, dtype=d) for w, d in zip(widths, dtypes))
                               for _ in range(n_layers)]
        self.owner = weakref.ref(record)
        return self.layers


class ForwardRecord:
    """What one generate call's decode steps computed, for `literl.training.replay`.

    layers[l]      layer l's (qkv, o, gate_up, down[, attention, lse]) buffers (`RecordLayout`); row i holds
                   what fed token i produced, i < rows
    row_BT         long [B, T]: the record row of the decode step that fed response token t of row b (its
                   output predicts token t + 1); −1 where no step fed it (the last token, padding)
    weights        the decode step's fused projection weights (`fused_weights`), made once per generation
    """

    def __init__(self, model: torch.nn.Module, buffers: RecordBuffers, batch: int, max_new_tokens: int,
                 device: torch.device):
        self.layout = RecordLayout.of(model)
        self._model = weakref.ref(model)
        _count_optimizer_steps()
        self._optimizer_steps = _OPTIMIZER_STEPS[0]
        self._versions = _weight_versions(model)
        self._buffers = buffers
        self.layers = buffers.lease(self, model, batch * max(max_new_tokens - 1, 1), device)
        self.weights = fused_weights(model)
        with torch.inference_mode(False):
            self.row_BT = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device)
        self.rows = 0

    def valid(self) -> bool:
        """False once the engine has started another record in the same buffers."""
        owner = self._buffers.owner
        return owner is not None and owner() is self

    def matches(self, model: torch.nn.Module) -> bool:
        """Whether it was recorded from this module with exactly its current weights: no optimizer has stepped
        since (fused optimizers update weights without bumping their version counters) and no parameter was
        modified in place (loading a state dict, a manual edit)."""
        return (self._model() is model and _OPTIMIZER_STEPS[0] == self._optimizer_steps
                and _weight_versions(model) == self._versions)

    def add_step(self, slot_rows_R: torch.Tensor, token_index: int) -> list[tuple[torch.Tensor, ...]]:
        """Reserve record rows for a decode step feeding response token `token_index` of these batch rows;
        returns each layer's rows (qkv, o, gate_up, down[, attention, lse]) for the step to write."""
        start, R = self.rows, slot_rows_R.shape[0]
        self.row_BT[slot_rows_R, token_index] = torch.arange(start, start + R, device=slot_rows_R.device)
        self.rows += R
        return [tuple(buffer[start:start + R] for buffer in layer) for layer in self.layers]


def _weight_versions(model: torch.nn.Module) -> tuple[int, ...]:
    return tuple(p._version for p in model.parameters())


# Optimizer steps taken in this process (any optimizer), counted by a global step hook registered with the
# first record: a record made before a step never stands in for the weights after it.
_OPTIMIZER_STEPS = [0]


@functools.cache
def _count_optimizer_steps() -> None:
    def count(optimizer, args, kwargs) -> None:
        _OPTIMIZER_STEPS[0] += 1

    register_optimizer_step_post_hook(count)


def supports_recording(model: torch.nn.Module) -> bool:
    """Llama/Qwen-style layers with a gated MLP and plain linear projections, no dropout, and recorded steps that
    give the plain static step's logits (checked on a probe)."""
    if not has_supported_structure(model) or getattr(model.config, "attention_dropout", 0.0):
        return False
    for layer in model.get_decoder().layers:
        mlp, attn = layer.mlp, layer.self_attn
        if not all(hasattr(mlp, part) for part in _MLP_PARTS):
            return False
        linears = [getattr(attn, name) for name in _PROJECTIONS] + [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(type(linear) is torch.nn.Linear for linear in linears):
            return False
    try:
        return _matches_static_step(model)
    except (AttributeError, TypeError, ValueError, RuntimeError, IndexError):
        return False


def fused_weights(model: torch.nn.Module) -> list[tuple[torch.Tensor, ...]]:
    """Per layer (w_qkv, b_qkv, w_gate_up, b_gate_up): the decode step runs each group of projections that share
    an input as one matmul (its output is one contiguous record range). Biases are None where absent."""
    out = []
    for layer in model.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        out.append((torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                    _cat_biases(attn.q_proj, attn.k_proj, attn.v_proj),
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    _cat_biases(mlp.gate_proj, mlp.up_proj)))
    return out


def _cat_biases(*linears: torch.nn.Linear) -> torch.Tensor | None:
    if all(linear.bias is None for linear in linears):
        return None
    return torch.cat([linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
                      for linear in linears])


def recording_decode_step(model: torch.nn.Module, token_R: torch.Tensor, position_R: torch.Tensor,
                          keys: list[torch.Tensor], values: list[torch.Tensor], bias_RS: torch.Tensor, column: int,
                          weights: list[tuple[torch.Tensor, ...]], records: list[tuple[torch.Tensor, ...]],
                          sample: tuple[SamplingParams, torch.Tensor | None] | None = None):
    """`static_kv.static_decode_step` whose matmuls write their outputs into the record rows of its slots
    (records[l] = layer l's (qkv, o, gate_up, down[, attention, lse]) rows, `ForwardRecord.add_step`), the
    attention's output and log-sum-exp among them where the layout keeps them; returns logits_RV (or, with
    `sample`, the sampled token and its log-prob, as `static_decode_step`)."""
    body = model.get_decoder()
    R = token_R.shape[0]
    hidden_RH = body.embed_tokens(token_R)
    cos_R1D, sin_R1D = body.rotary_emb(hidden_RH[:, None], position_R[:, None])
    bias_R11S = bias_RS[:, None, None, :column + 1]
    for layer, keys_RKSD, values_RKSD, (w_qkv, b_qkv, w_gate_up, b_gate_up), rows in zip(
            body.layers, keys, values, weights, records):
        qkv_RF, o_RH, gate_up_RF, down_RH, *kept = rows      # kept: (attention, lse) where the layout keeps them
        attn, mlp = layer.self_attn, layer.mlp
        _linear_into(layer.input_layernorm(hidden_RH), w_qkv, b_qkv, qkv_RF)
        q_size, kv_size = attn.q_proj.out_features, attn.k_proj.out_features
        query_RQD, key_RKD, value_RKD = (x.reshape(R, -1, attn.head_dim)
                                         for x in qkv_RF.split([q_size, kv_size, kv_size], -1))
        out_RKGD = attend_projected(attn, query_RQD, key_RKD, value_RKD, cos_R1D, sin_R1D, keys_RKSD, values_RKSD,
                                    bias_R11S, column, keep=kept or None)
        # The kept output is o_proj's input, already in rows (the kernel's own output is head-major).
        attended_RF = kept[0] if kept else out_RKGD.reshape(R, -1)
        hidden_RH = hidden_RH + _linear_into(attended_RF, attn.o_proj.weight, attn.o_proj.bias, o_RH)
        _linear_into(layer.post_attention_layernorm(hidden_RH), w_gate_up, b_gate_up, gate_up_RF)
        gate_RF, up_RF = gate_up_RF.chunk(2, dim=-1)
        hidden_RH = hidden_RH + _linear_into(mlp.act_fn(gate_RF) * up_RF, mlp.down_proj.weight, mlp.down_proj.bias,
                                             down_RH)
    return sampled(model.get_output_embeddings()(body.norm(hidden_RH)), sample)


def _linear_into(x_RI: torch.Tensor, weight_OI: torch.Tensor, bias_O: torch.Tensor | None, out_RO: torch.Tensor
                 ) -> torch.Tensor:
    """out = x·Wᵀ + b, written by the matmul itself into `out` (a record's rows)."""
    if bias_O is None:
        return torch.mm(x_RI, weight_OI.t(), out=out_RO)
    return torch.addmm(bias_O, x_RI, weight_OI.t(), out=out_RO)


@functools.cache
def compiled_recording_step(device_type: str = "cpu"):
    """`recording_decode_step` through `torch.compile` (once per process and device type, shared by every
    engine; one graph for every batch size and cache column; a step with one row left runs eagerly)."""
    return compile_for_varying_sizes(recording_decode_step, cpp_wrapper=device_type == "cpu",
                                     eager_when=lambda model, token_R, *rest: token_R.shape[0] < 2)


@torch.inference_mode()
def _matches_static_step(model: torch.nn.Module) -> bool:
    """Three recorded decode steps give the plain static step's logits (the record is what they computed)."""
    vocab = model.get_output_embeddings().out_features
    device = model.get_output_embeddings().weight.device
    prepared = distinct_prompts([[3 % vocab, 4 % vocab, 5 % vocab], [6 % vocab]], pad_id=0, device=device)
    tokens = [torch.tensor([t % vocab, (t + 1) % vocab], device=device) for t in (7, 9, 11)]
    logits = []
    for record in (None, ForwardRecord(model, RecordBuffers(), 2, len(tokens) + 1, device)):
        _, cache = prefill(model, prepared)
        decoder = StaticKVDecoder(model, cache, prepared, len(tokens) + 1, record=record,
                                  recording_step_fn=recording_decode_step)
        logits.append(torch.stack([decoder.step(token_R).float() for token_R in tokens]))
    scale = float(logits[0].abs().max()) + 1.0
    tolerance = 1e-4 if next(model.parameters()).dtype in (torch.float32, torch.float64) else 5e-2
    return float((logits[0] - logits[1]).abs().max()) <= tolerance * scale
