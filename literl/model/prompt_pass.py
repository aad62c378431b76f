"""Distinct prompts and the prompt pass: each prompt a batch repeats (its G samples) runs through the layers once.

A rollout batch holds every prompt G times. `distinct_prompts` finds the distinct ones (anywhere in the batch,
not only consecutive repeats) and left-pads them, so that every row's next token sits in the same column. The
prompt pass runs them once and returns their hidden states and each layer's keys and values: the rollout's
prefill (then the decode steps), and a training forward's prefix (then the responses, `literl.model.forward`).

The pass applies `literl.model.layer.decoder_layer` by hand (no cache object, no mask building; compiled as one
graph of all layers with `compiled=True`), or, for a model the body does not run, goes through the model's own
forward with a Hugging Face cache.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import DynamicCache

from literl.model import attention
from literl.model.compiled import compile_for_varying_sizes, compiles_layer_by_layer
from literl.model.kernels import apply_norm
from literl.model.layer import decoder_layer, embed_and_rotary, routed_linears
from literl.model.moe import TokenRoutes


@dataclass
class DistinctPrompts:
    """Distinct prompts, left-padded to a common width X, and which one each of the B rows continues.

    ids_UX     long, left-padded with pad_id
    real_UX    bool, True on prompt tokens (False on the left padding)
    length_U   long, prompt lengths
    source_B   long, index into U of each row's prompt
    """

    ids_UX: torch.Tensor
    real_UX: torch.Tensor
    length_U: torch.Tensor
    source_B: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.ids_UX.shape[1])

    @property
    def positions_UX(self) -> torch.Tensor:
        """Rotary positions: 0 at each prompt's first real token (padding columns clamp to 0; never read)."""
        return (self.real_UX.long().cumsum(-1) - 1).clamp(min=0)

    def first_rows_U(self) -> torch.Tensor:
        """The first row that continues each distinct prompt."""
        B = self.source_B.shape[0]
        first_U = torch.full((self.ids_UX.shape[0],), B, dtype=torch.long, device=self.source_B.device)
        return first_U.scatter_reduce(0, self.source_B, torch.arange(B, device=self.source_B.device), "amin")

    def routes_at(self, routing) -> TokenRoutes:
        """The prompt tokens' routes in `routing` (a `moe.Routing` over the rows' batch layout): each distinct
        prompt's tokens stand for its first row's (rows sharing a prompt route it identically)."""
        rows_UX = self.first_rows_U()[:, None].expand_as(self.ids_UX)
        return routing.at(rows_UX, self.positions_UX, self.real_UX)

    def share_prompt_routes(self, routes_BLNK: torch.Tensor) -> None:
        """Copy each first row's prompt routes to the other rows of its prompt (after a recording prompt pass,
        before any response position is written)."""
        width = min(self.width, routes_BLNK.shape[1])
        first_B = self.first_rows_U()[self.source_B]
        routes_BLNK[:, :width] = routes_BLNK[first_B, :width]


def distinct_prompts(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> DistinctPrompts:
    first_row: dict[tuple[int, ...], int] = {}
    source = [first_row.setdefault(tuple(int(t) for t in p), len(first_row)) for p in prompts]
    unique = list(first_row)
    X = max(len(p) for p in unique)
    ids_UX = torch.full((len(unique), X), pad_id, dtype=torch.long)
    real_UX = torch.zeros((len(unique), X), dtype=torch.bool)
    for u, p in enumerate(unique):
        ids_UX[u, X - len(p):] = torch.tensor(p, dtype=torch.long)
        real_UX[u, X - len(p):] = True
    return DistinctPrompts(ids_UX.to(device), real_UX.to(device),
                           torch.tensor([len(p) for p in unique], device=device),
                           torch.tensor(source, dtype=torch.long, device=device))


def batch_prompts(tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, *, only_if_shared: bool = True
                  ) -> DistinctPrompts | None:
    """The distinct prompts of a batch's rows (`literl.algorithm.batch` layout) and which one each row continues;
    None when no two rows share a prompt (then there is nothing to save), unless `only_if_shared=False`."""
    rows = [row[:n] for row, n in zip(tokens_BL.tolist(), prompt_len_B.tolist())]
    # Any in-vocabulary id pads: padded columns are masked out of attention.
    prompts = distinct_prompts(rows, pad_id=0, device=tokens_BL.device)
    return prompts if prompts.ids_UX.shape[0] < len(rows) or not only_if_shared else None


# ------------------------------------------------------------------------------------------ the pass by hand
def prompt_layers(decoder, hidden_UXH: torch.Tensor, cos_UXD: torch.Tensor, sin_UXD: torch.Tensor,
                  bias_U1XX: torch.Tensor, routes: TokenRoutes | None = None
                  ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every layer and the final norm on the distinct prompts' embeddings: (hidden_UXH, per-layer (keys_UJXD,
    values_UJXD)), the keys and values being what responses attend to. `routes`: the prompt tokens' MoE routing
    (`literl.model.moe`)."""
    prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    attend = attention.dense(bias_U1XX, kept=prompt_kv)
    # The head axis is added here, not by the caller: a compiled graph then sees it as a constant 1.
    cos_UX1D, sin_UX1D = cos_UXD[:, :, None], sin_UXD[:, :, None]
    for layer, linears in zip(decoder.layers, routed_linears(decoder.layers, routes)):
        hidden_UXH = decoder_layer(layer, hidden_UXH, cos_UX1D, sin_UX1D, attention=attend, linears=linears)
    return apply_norm(decoder.norm, hidden_UXH), prompt_kv


@functools.cache
def compiled_prompt_layers():
    """`prompt_layers` through `torch.compile` (once per process: one graph for every prompt batch, all layers in
    it, element-wise work fused across layer boundaries); one prompt or a width of one runs eagerly, and so do
    passes that route MoE layers (recorded or replayed routes)."""
    return compile_for_varying_sizes(
        prompt_layers, name="the prompts' layers",
        eager_when=lambda decoder, hidden_UXH, cos, sin, bias, routes: routes is not None or min(
            hidden_UXH.shape[0], hidden_UXH.shape[1]) < 2)


def prompt_layer(layer, hidden_UXH: torch.Tensor, cos_UX1D: torch.Tensor, sin_UX1D: torch.Tensor,
                 bias_U1XX: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer of `prompt_layers` (computed projections): (hidden_UXH, keys_UJXD, values_UJXD)."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    hidden_UXH = decoder_layer(layer, hidden_UXH, cos_UX1D, sin_UX1D, attention=attention.dense(bias_U1XX, kept=kept))
    return hidden_UXH, kept[0][0], kept[0][1]


@functools.cache
def compiled_prompt_layer():
    """`prompt_layer` through `torch.compile`: one graph for every layer of a model and every prompt batch, where
    `compiled.compiles_layer_by_layer` (CUDA: the compile time does not grow with depth); one prompt or a width of
    one runs eagerly."""
    return compile_for_varying_sizes(prompt_layer, name="a prompt layer", eager_when=lambda layer, hidden_UXH, *rest:
                                     min(hidden_UXH.shape[0], hidden_UXH.shape[1]) < 2)


def prompts_by_layers(decoder, prompts: DistinctPrompts, *, compiled: bool = False, routes: TokenRoutes | None = None
                      ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(hidden_UXH, per-layer (keys, values)) of the distinct prompts through the hand-applied layers; compiled,
    as one graph of all layers, or one layer at a time where `compiled.compiles_layer_by_layer`."""
    hidden_UXH, cos_UXD, sin_UXD = embed_and_rotary(decoder, prompts.ids_UX, prompts.positions_UX)
    bias_U1XX = attention.left_padded_bias(prompts.real_UX, hidden_UXH.dtype)
    if compiled and routes is None and compiles_layer_by_layer(hidden_UXH.device.type):
        layer_step, prompt_kv = compiled_prompt_layer(), []
        cos_UX1D, sin_UX1D = cos_UXD[:, :, None], sin_UXD[:, :, None]
        for layer in decoder.layers:
            hidden_UXH, keys_UJXD, values_UJXD = layer_step(layer, hidden_UXH, cos_UX1D, sin_UX1D, bias_U1XX)
            prompt_kv.append((keys_UJXD, values_UJXD))
        return apply_norm(decoder.norm, hidden_UXH), prompt_kv
    run = compiled_prompt_layers() if compiled else prompt_layers
    return run(decoder, hidden_UXH, cos_UXD, sin_UXD, bias_U1XX, routes)


# ------------------------------------------------------------------------------------------ the model's own pass
def prompts_by_model(decoder, prompts: DistinctPrompts) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """(hidden_UXH, per-layer (keys, values)) of the distinct prompts through the decoder's own forward."""
    out = decoder(input_ids=prompts.ids_UX, attention_mask=prompts.real_UX.long(), position_ids=prompts.positions_UX,
                  use_cache=True, **{cache_keyword(decoder): DynamicCache(config=decoder.config)})
    return out.last_hidden_state, [(layer.keys, layer.values) for layer in returned_cache(out).layers]


def prefill(model: torch.nn.Module, prompts: DistinctPrompts) -> tuple[torch.Tensor, DynamicCache]:
    """Run the distinct prompts through the model's own forward once: (logits_UV of each prompt's next token, the
    KV cache)."""
    out = model(input_ids=prompts.ids_UX, attention_mask=prompts.real_UX.long(), position_ids=prompts.positions_UX,
                use_cache=True, logits_to_keep=1, **{cache_keyword(model): DynamicCache(config=model.config)})
    return out.logits[:, -1], returned_cache(out)


@torch.inference_mode()
def prefill_by_layers(model: torch.nn.Module, prompts: DistinctPrompts, *, compiled: bool = False,
                      routes: TokenRoutes | None = None) -> tuple[torch.Tensor, DynamicCache]:
    """`prefill` through the hand-applied prompt layers (for models whose head is the output embedding applied to
    the final hidden state). On the step-speed benchmark: rollout −5 ms, step −1.7% compiled, −0.5% eager."""
    hidden_UXH, prompt_kv = prompts_by_layers(model.get_decoder(), prompts, compiled=compiled, routes=routes)
    return model.get_output_embeddings()(hidden_UXH[:, -1]), DynamicCache(ddp_cache_data=prompt_kv,
                                                                          config=model.config)


def cache_keyword(module: torch.nn.Module) -> str:
    """The name a Hugging Face forward takes its cache by: `cache` since transformers 5.2x (`past_key_values` is
    deprecated there, removed in 5.40), `past_key_values` before. A subclass whose forward only passes **kwargs on
    takes it by its parent's name; a wrapper that hands its call to a base model (peft's LoRA model) by the base
    model's name."""
    if callable(getattr(module, "get_base_model", None)):
        module = module.get_base_model()
    for forward in [module.forward] + [klass.forward for klass in type(module).__mro__ if "forward" in vars(klass)]:
        parameters = inspect.signature(forward).parameters
        for name in ("cache", "past_key_values"):
            if name in parameters:
                return name
    return "past_key_values"


def returned_cache(out) -> DynamicCache:
    """The cache a Hugging Face forward returned (`cache` since transformers 5.2x, `past_key_values` before)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values
