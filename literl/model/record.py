"""The rollout's forward, kept for the update: every matmul output of every decode step, per layer, and the
projections that write it (while sampling) and replay it (while training).

Why: in an on-policy update (one optimizer step per rollout batch, the engine sampling from the policy module
itself) the training forward recomputes exactly what the decode steps already computed, with the same weights.
Keeping the outputs of the decode's matmuls lets the update skip its forward matmuls: a projection's backward
needs its input x (cheap element-wise work, recomputed) and the gradient of its output, never the forward
product itself,

    y = x·Wᵀ + b      ∂L/∂x = g·W      ∂L/∂W = gᵀ·x      ∂L/∂b = Σ_tokens g

so a trained token costs 4N matmul FLOPs instead of 6N. What is kept, per layer and fed response token (one row
per token a decode step consumed), in the model's dtype:

    [ q | k | v ]   the attention projections' outputs (before the per-head norms and rotary)
    [ o ]           the output projection's output (what the layer adds to the residual stream)
    [ gate | up ]   the MLP's input projections
    [ down ]        the MLP's output projection (the layer's second residual add)
    [ attention ]   on CPU: the attention's output (o_proj's input), one D-vector per query head,
    [ lse ]         and its log-sum-exp per query head, which the CPU flash kernel's backward takes: the update
                    then runs the attention's backward only (`attention.RecordedAttention`)

The residual stream itself is not kept: it is the embedding plus these outputs, recomputed exactly.

Ownership: a `Recorder` (made by the policy's forward, `literl.model.policy.PolicyForward`, and lent to the
rollout engine) owns the buffers, reused from one rollout to the next (allocating hundreds of MB per step costs
page faults), and counts the optimizer steps of the run's optimizer. A `ForwardRecord` is valid only until the
recorder's next record (`valid`) and only for the weights it was recorded with (`matches`: the same module, no
optimizer step since, no in-place edit of a parameter). It rides on the batch as a typed field, its rows
selected with the batch's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from literl.model.layer import has_gated_mlps


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


def can_record(model: torch.nn.Module) -> bool:
    """Structure a record needs: gated MLPs with plain linear projections, no attention dropout (the decode step
    leaves it out). Whether the recorded steps agree with the plain ones is `capabilities`' probe."""
    return has_gated_mlps(model) and not getattr(model.config, "attention_dropout", 0.0)


class Recorder:
    """The record buffers of one policy module and the count of its optimizer's steps.

    `start` hands out a `ForwardRecord` over the buffers (per layer, one [capacity, width] buffer per recorded
    output, `RecordLayout.widths`: a decode step's matmul writes its rows in place); the latest record owns them.
    `watch(optimizer)` counts that optimizer's steps, so that no record made before a step stands in for the
    weights after it (fused optimizers update weights without bumping their version counters)."""

    def __init__(self, model: torch.nn.Module, max_bytes: int):
        self._model = weakref.ref(model)
        self.max_bytes = int(max_bytes)
        self.steps = 0
        self.layers: list[tuple[torch.Tensor, ...]] = []
        self._lease: object | None = None

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        def count(optimizer, args, kwargs) -> None:
            self.steps += 1

        optimizer.register_step_post_hook(count)

    def fits(self, model: torch.nn.Module, rows: int) -> bool:
        """Whether a record of `rows` fed tokens of this module would be kept."""
        return model is self._model() and record_bytes(model, rows) <= self.max_bytes

    def start(self, model: torch.nn.Module, batch: int, max_new_tokens: int, device: torch.device
              ) -> "ForwardRecord":
        lease = object()
        self.layers = self._buffers(model, batch * max(max_new_tokens - 1, 1), device)
        self._lease = lease
        return ForwardRecord(self, model, lease, batch, max_new_tokens, device)

    def holds(self, lease: object) -> bool:
        return self._lease is lease

    def _buffers(self, model, rows: int, device) -> list[tuple[torch.Tensor, ...]]:
        layout, n_layers = RecordLayout.of(model), len(model.get_decoder().layers)
        widths, dtypes = layout.widths, layout.dtypes(next(model.parameters()).dtype)
        current = self.layers[0] if self.layers else None
        if (current is not None and len(self.layers) == n_layers and current[0].shape[0] >= rows
                and tuple(b.shape[1] for b in current) == widths and current[0].device == device
                and tuple(b.dtype for b in current) == dtypes):
            return self.layers
        self.layers = []    # free the old buffers before allocating the new ones
        # Outside inference mode: the update reads them with autograd on.
        with torch.inference_mode(False):
            return [tuple(torch.empty(rows, w, device=device, dtype=d) for w, d in zip(widths, dtypes))
                    for _ in range(n_layers)]


class ForwardRecord:
    """What one generation's decode steps computed, for the update to replay; `select` gives the record of a
    subset of the generation's rows (the same buffers).

    layers[l]      layer l's (qkv, o, gate_up, down[, attention, lse]) buffers (`RecordLayout`); row i holds
                   what fed token i produced
    row_BT         long [B, T]: the record row of the decode step that fed response token t of row b (its
                   output predicts token t + 1); −1 where no step fed it (the last token, padding)
    weights        the decode step's fused projection weights (`fused_weights`), made once per generation
    """

    def __init__(self, recorder: Recorder, model: torch.nn.Module, lease: object, batch: int, max_new_tokens: int,
                 device: torch.device):
        self.layout = RecordLayout.of(model)
        self._recorder, self._lease, self._model = recorder, lease, weakref.ref(model)
        self._steps, self._versions = recorder.steps, _weight_versions(model)
        self.layers = recorder.layers
        self.weights = fused_weights(model)
        with torch.inference_mode(False):
            self.row_BT = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device)
        self.rows = 0

    def select(self, index: torch.Tensor) -> "ForwardRecord":
        view = object.__new__(ForwardRecord)
        view.__dict__.update(self.__dict__)
        view.row_BT = self.row_BT[index.to(self.row_BT.device)]
        return view

    def valid(self) -> bool:
        """False once the recorder has started another record in the same buffers."""
        return self._recorder.holds(self._lease)

    def matches(self, model: torch.nn.Module) -> bool:
        """Whether it was recorded from this module with exactly its current weights: no optimizer step since and
        no parameter modified in place (loading a state dict, a manual edit)."""
        return (self._model() is model and self._recorder.steps == self._steps
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


# ------------------------------------------------------------------------------------- writing the record
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


def linear_into(x_RI: torch.Tensor, weight_OI: torch.Tensor, bias_O: torch.Tensor | None, out_RO: torch.Tensor
                ) -> torch.Tensor:
    """out = x·Wᵀ + b, written by the matmul itself into `out` (a record's rows)."""
    if bias_O is None:
        return torch.mm(x_RI, weight_OI.t(), out=out_RO)
    return torch.addmm(bias_O, x_RI, weight_OI.t(), out=out_RO)


class RecordingLinears:
    """A decode step's projections, each group sharing an input run as one matmul whose output is written into
    the layer's record rows (`rows`: qkv, o, gate_up, down; `weights`: this layer's `fused_weights`)."""

    def __init__(self, rows: tuple[torch.Tensor, ...], weights: tuple[torch.Tensor, ...]):
        self.rows, self.weights = rows, weights

    def qkv(self, attn, x_RH):
        qkv_RF = linear_into(x_RH, self.weights[0], self.weights[1], self.rows[0])
        return qkv_RF.split([attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features], -1)

    def out(self, attn, attended_RF):
        return linear_into(attended_RF, attn.o_proj.weight, attn.o_proj.bias, self.rows[1])

    def mlp(self, mlp, x_RH):
        gate_RF, up_RF = linear_into(x_RH, self.weights[2], self.weights[3], self.rows[2]).chunk(2, dim=-1)
        return linear_into(mlp.act_fn(gate_RF) * up_RF, mlp.down_proj.weight, mlp.down_proj.bias, self.rows[3])


# ------------------------------------------------------------------------------------- replaying it
class ReplayedLinears:
    """A training forward's projections with their outputs read from a record (`rows`: the tokens' qkv, o,
    gate_up and down rows): forward returns the recording, backward is the linear layers' (`ReplayedProjections`)."""

    def __init__(self, rows: list[torch.Tensor]):
        self.rows = rows

    def qkv(self, attn, x_MH):
        qkv_MF = _replayed(x_MH, self.rows[0], attn.q_proj, attn.k_proj, attn.v_proj)
        return qkv_MF.split([attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features], dim=-1)

    def out(self, attn, attended_MF):
        return _replayed(attended_MF, self.rows[1], attn.o_proj)

    def mlp(self, mlp, x_MH):
        gate_MF, up_MF = _replayed(x_MH, self.rows[2], mlp.gate_proj, mlp.up_proj).chunk(2, dim=-1)
        return _replayed(mlp.act_fn(gate_MF) * up_MF, self.rows[3], mlp.down_proj)


def _replayed(x_MI: torch.Tensor, y_MO: torch.Tensor, *linears: torch.nn.Linear) -> torch.Tensor:
    params = [p for linear in linears for p in (linear.weight, linear.bias)]
    return ReplayedProjections.apply(x_MI, y_MO, *params)


class ReplayedProjections(torch.autograd.Function):
    """Projections that share their input x, with recorded outputs: forward returns y_MO (the concatenated
    outputs), backward gives ∂x = g·[W₁; W₂; …], ∂Wᵢ = gᵢᵀ·x, ∂bᵢ = Σ gᵢ. `params` is (W₁, b₁, W₂, b₂, …),
    a b None where the projection has no bias."""

    @staticmethod
    def forward(ctx, x_MI, y_MO, *params):
        ctx.save_for_backward(x_MI, *params)
        return y_MO.view_as(y_MO)

    @staticmethod
    def backward(ctx, grad_MO):
        x_MI, *params = ctx.saved_tensors
        weights, biases = params[0::2], params[1::2]
        weight_OI = weights[0] if len(weights) == 1 else torch.cat(weights)
        grad_x = grad_MO.mm(weight_OI) if ctx.needs_input_grad[0] else None
        grad_weight_OI = grad_MO.t().mm(x_MI)
        grads, start = [], 0
        for weight, bias in zip(weights, biases):
            rows = slice(start, start + weight.shape[0])
            grads.append(grad_weight_OI[rows])
            grads.append(grad_MO[:, rows].sum(0) if bias is not None else None)
            start += weight.shape[0]
        return (grad_x, None, *grads)


def record_slices(layers: list[tuple[torch.Tensor, ...]], record_row_M: torch.Tensor
                  ) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor | None]:
    """(layers, rows) for `layer_rows`: when these record rows (ascending) are consecutive, each layer's buffers
    sliced to them (slices of the record itself) and rows None; else the buffers as they are and the rows to
    gather."""
    M, first = record_row_M.shape[0], int(record_row_M[0])
    if int(record_row_M[-1]) - first + 1 != M:
        return layers, record_row_M
    return [tuple(buffer.narrow(0, first, M) for buffer in layer) for layer in layers], None


def layer_rows(buffers: tuple[torch.Tensor, ...], record_row_M: torch.Tensor | None) -> list[torch.Tensor]:
    """One layer's recorded outputs for the tokens: its buffers' rows record_row_M, or the buffers themselves when
    record_row_M is None (already sliced to the tokens, `record_slices`)."""
    return list(buffers) if record_row_M is None else [buffer.index_select(0, record_row_M) for buffer in buffers]
