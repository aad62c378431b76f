"""The decoder layer, written once: every pass literl runs through a model's layers applies this body.

    x      = norm₁(h)
    q,k,v  = W_q x, W_k x, W_v x              (projections: computed, computed into a record, or replayed)
    q, k   = rotary(norm_q(q)), rotary(norm_k(k))      per head (Qwen3's q_norm / k_norm where present)
    h      = h + W_o · attention(q, k, v)       (attention: decode against a static cache, dense over a prefix,
                                                 or replayed from a record)
    h      = h + mlp(norm₂(h))                  (a gated MLP or a mixture of experts)

The body works on any leading shape ([rows, 1] in a decode step, [rows, width] in a training forward, [tokens]
when replaying packed tokens); what differs between passes is passed in, never branched on by name:

- `attention(attn, query_NQD, key_NJD, value_NJD) -> attended_NF` (literl.model.attention): where keys and
  values go (a cache column, a prompt's prefix) and how the attention is computed or replayed;
- `linears` (`Computed` here, `literl.model.record.RecordingLinears` / `ReplayedLinears`): how the projections
  and the MLP run;
- `norm(module, x)`: `kernels.apply_norm` (hand-written backward) or the module's own forward.

It applies to pre-norm decoders of the Llama / Qwen family (`has_layer_structure`); whether a given model's
numbers agree with its own forward is checked once (`literl.model.capabilities`). Models it does not understand
run through their own Hugging Face forward.
"""

from __future__ import annotations

import torch

from literl.model.kernels import apply_norm, per_head, rotate
from literl.model.moe import LayerRoutes, is_sparse_moe, moe_block

LAYER_PARTS = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")
ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
BODY_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")
GATED_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")
# Config fields of attention variants this body does not implement.
UNSUPPORTED_CONFIG = ("attn_logit_softcapping", "final_logit_softcapping")


def decoder_layer(layer: torch.nn.Module, hidden_NH: torch.Tensor, cos_N1D: torch.Tensor, sin_N1D: torch.Tensor,
                  *, attention, linears=None, norm=apply_norm) -> torch.Tensor:
    """One pre-norm decoder layer on hidden_NH (any leading shape N; cos/sin broadcast over the head axis)."""
    linears = COMPUTED if linears is None else linears
    attn = layer.self_attn
    D = attn.head_dim
    query_NF, key_NF, value_NF = linears.qkv(attn, norm(layer.input_layernorm, hidden_NH))
    query_NQD = rotate(per_head(query_NF, D, getattr(attn, "q_norm", None), norm), cos_N1D, sin_N1D)
    key_NJD = rotate(per_head(key_NF, D, getattr(attn, "k_norm", None), norm), cos_N1D, sin_N1D)
    value_NJD = value_NF.unflatten(-1, (-1, D))
    hidden_NH = hidden_NH + linears.out(attn, attention(attn, query_NQD, key_NJD, value_NJD))
    return hidden_NH + linears.mlp(layer.mlp, norm(layer.post_attention_layernorm, hidden_NH))


class Computed:
    """Projections computed by the layer's own modules; the MLP through its own forward, or, given `routes` (a
    mixture-of-experts layer whose routes are recorded, replayed or compared), through `moe.moe_block`."""

    def __init__(self, routes: LayerRoutes | None = None):
        self.routes = routes

    def qkv(self, attn, x_NH):
        return attn.q_proj(x_NH), attn.k_proj(x_NH), attn.v_proj(x_NH)

    def out(self, attn, attended_NF):
        return attn.o_proj(attended_NF)

    def mlp(self, mlp, x_NH):
        if self.routes is not None:
            return moe_block(mlp, x_NH, self.routes)
        # Hugging Face's MoE blocks read (batch, length, hidden) off their input: a decode step's [R, H] goes in as
        # [R, 1, H]. Older MoE blocks also return their router logits.
        flat = x_NH.dim() == 2
        out = mlp(x_NH[:, None] if flat else x_NH)
        out = out[0] if isinstance(out, tuple) else out
        return out[:, 0] if flat else out


COMPUTED = Computed()


def routed_linears(layers, routes) -> list[Computed]:
    """Per layer, the projections of a forward whose MoE layers take `routes` (a `moe.TokenRoutes`; None: every
    layer computed as the model computes it). The n-th MoE layer reads the routes' layer n."""
    if routes is None:
        return [COMPUTED] * len(layers)
    out, n = [], 0
    for layer in layers:
        if is_sparse_moe(layer.mlp):
            out.append(Computed(routes.layer(n)))
            n += 1
        else:
            out.append(COMPUTED)
    return out


def embed_and_rotary(decoder, ids: torch.Tensor, positions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden, cos, sin) for token ids and their rotary positions (same leading shape), from the decoder's own
    embedding and rotary modules."""
    hidden = decoder.embed_tokens(ids)
    cos, sin = decoder.rotary_emb(hidden, positions)
    return hidden, cos, sin


def has_layer_structure(model: torch.nn.Module) -> bool:
    """Whether the model is a pre-norm Llama/Qwen-style decoder this body can run: the parts it reads exist,
    no attention variant it leaves out (logit soft-capping, a per-layer sliding window attribute)."""
    if not (hasattr(model, "get_decoder") and isinstance(model.get_output_embeddings(), torch.nn.Linear)):
        return False
    body = model.get_decoder()
    if not all(hasattr(body, part) for part in BODY_PARTS):
        return False
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) is not None for name in UNSUPPORTED_CONFIG):
        return False
    for layer in body.layers:
        if not all(hasattr(layer, part) for part in LAYER_PARTS):
            return False
        attn = layer.self_attn
        if not all(hasattr(attn, part) for part in ATTENTION_PARTS) or getattr(attn, "sliding_window", None):
            return False
    return True


def has_gated_mlps(model: torch.nn.Module) -> bool:
    """Every layer's MLP is `down(act(gate(x)) · up(x))` with plain linear projections (what a record keeps)."""
    for layer in model.get_decoder().layers:
        mlp, attn = layer.mlp, layer.self_attn
        if not all(hasattr(mlp, part) for part in GATED_MLP_PARTS):
            return False
        linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(type(linear) is torch.nn.Linear for linear in linears):
            return False
    return True
