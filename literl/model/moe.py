"""Mixture-of-experts blocks in the layer body, and Routing Replay (algorithms.md §6).

A sparse MoE block (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE in transformers 5) is a top-k router `gate`
(x → logits over E experts, the chosen k, their weights) and `experts` (x, chosen, weights → Σ weighted expert
outputs), plus, in Qwen2-MoE, a gated shared expert. `moe_block` runs it from those modules, with the choice of
experts taken from a `LayerRoutes` when one is given:

    natural   the router's own top-k and weights (what the model computes; recorded when asked)
    replayed  the recorded expert ids (R2: the trainer's at θ_old; R3: the inference engine's) with the weights
              recomputed from the current router logits at those ids,
                  renormalising routers  w = softmax(z[ids])                (a softmax restricted to the set)
                  others                 w = softmax(z)[ids]
              so the router keeps its gradient through z; the selection itself carries none (§6 "Gradients")

Routes are indexed by input position: the routing computed while token p was fed produced the logits of token
p + 1 (§6 item 6). A batch carries them as `*_routes_BLNK` (int16: rows × prompt + response positions × MoE
layers × k, −1 where nothing was routed), aligned with `tokens_BL`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTE_DTYPE = torch.int16
NO_ROUTE = -1
# Per-token extras (literl.algorithm.batch) that carry routes: the inference engine's, and the trainer's at θ_old.
ROLLOUT_ROUTES = "rollout_routes_BLNK"
OLD_ROUTES = "old_routes_BLNK"


@dataclass(frozen=True)
class MoeShape:
    """A model's mixture-of-experts layers: how many (N), experts chosen per token (K) and experts (E)."""

    layers: int
    top_k: int
    experts: int

    @staticmethod
    def of(model: torch.nn.Module) -> "MoeShape | None":
        gates = [router_module(layer.mlp.gate) for layer in model.get_decoder().layers
                 if is_sparse_moe(getattr(layer, "mlp", None))]
        if not gates:
            return None
        return MoeShape(layers=len(gates), top_k=gates[0].top_k, experts=gates[0].weight.shape[0])


def router_module(gate: torch.nn.Module) -> torch.nn.Module:
    """The router itself, for reading its settings (top_k, norm_topk_prob, the weight's shape): under LoRA peft wraps
    it (`ParamWrapper`, which does not pass those attributes on), while calling the wrapper still runs the adapted
    router."""
    unwrap = getattr(gate, "get_base_layer", None)
    return unwrap() if callable(unwrap) else gate


def is_sparse_moe(mlp: torch.nn.Module) -> bool:
    """A block of a top-k router (`gate`: weight [E, H], top_k) and `experts`."""
    gate = getattr(mlp, "gate", None)
    router = router_module(gate) if gate is not None else None
    return (hasattr(mlp, "experts") and router is not None
            and isinstance(getattr(router, "weight", None), torch.Tensor)
            and isinstance(getattr(router, "top_k", None), int))


def renormalises(gate: torch.nn.Module) -> bool:
    """Whether the router renormalises its top-k weights to sum to one (Mixtral always; Qwen/OLMoE by flag)."""
    return bool(getattr(router_module(gate), "norm_topk_prob", True))


def gate_weights(logits_ME: torch.Tensor, experts_MK: torch.Tensor, renormalise: bool) -> torch.Tensor:
    """fp32 weights of the chosen experts from the router logits: softmax(z[ids]) for a renormalising router,
    softmax(z)[ids] otherwise. Only the logits of the chosen experts enter the first form, so the logits of
    experts outside the set can change (a perturbed router row) without moving a replayed weight."""
    if renormalise:
        return torch.softmax(logits_ME.float().gather(-1, experts_MK), dim=-1)
    return torch.softmax(logits_ME.float(), dim=-1).gather(-1, experts_MK)


def moe_block(mlp: torch.nn.Module, x_NH: torch.Tensor, routes: "LayerRoutes | None" = None) -> torch.Tensor:
    """The block's output on x_NH (any leading shape), the experts chosen by the router or by `routes`."""
    x_MH = x_NH.reshape(-1, x_NH.shape[-1])
    logits_ME, weights_MK, experts_MK = mlp.gate(x_MH)
    if routes is not None:
        experts_MK, weights_MK = routes.choose(mlp.gate, logits_ME, experts_MK, weights_MK)
    out_MH = mlp.experts(x_MH, experts_MK, weights_MK)
    shared = getattr(mlp, "shared_expert", None)
    if shared is not None:      # Qwen2-MoE: a shared expert, gated per token
        out_MH = out_MH + torch.sigmoid(mlp.shared_expert_gate(x_MH)) * shared(x_MH)
    return out_MH.view_as(x_NH)


class Routing:
    """How one batch's forwards route their tokens through the MoE layers.

    replay_BLNK    expert ids to use instead of the router's choice (None: natural routing)
    record_BLNK    where to write the router's own choice for each token (what it would have used: under R2 the
                   ids replayed later; under a replay, θ's natural choice, for agreement) (None: nothing recorded)
    compare        {metric name: routes_BLNK}: count, at `counted_BL` positions, the (token, layer) pairs whose
                   natural top-k set equals those routes' (route agreement, algorithms.md §7)
    reweight       natural choices get `gate_weights` too, the form a replay recomputes (R2's recording pass:
                   its replay at θ_old then gives the same numbers bit for bit)
    balance        also collect what the load-balancing loss needs (`balance_loss`)

    A forward over some layout of the batch's tokens calls `at(rows, positions, real)`: per token it feeds to the
    layers, its row b and position p in the batch, and whether it is a real token (padding is routed naturally,
    never recorded, replayed or compared).
    """

    def __init__(self, *, replay_BLNK: torch.Tensor | None = None, record_BLNK: torch.Tensor | None = None,
                 compare: dict[str, torch.Tensor] | None = None, counted_BL: torch.Tensor | None = None,
                 reweight: bool = False, balance: bool = False):
        self.replay_BLNK, self.record_BLNK, self.reweight = replay_BLNK, record_BLNK, reweight
        self.compare = compare or {}
        self.counted_BL = counted_BL
        # (agreeing, counted) (token, layer) pairs per compared routes, over every layer and forward
        self.agreement = {name: torch.zeros(2, dtype=torch.float64) for name in self.compare}
        # per MoE layer: [Σ_tokens softmax(z) (with grad), Σ_tokens chosen-expert counts, tokens]
        self.balance: dict[int, list] | None = {} if balance else None

    def balance_loss(self) -> torch.Tensor | None:
        """The Switch Transformer load-balancing loss (arXiv 2101.03961 Eq. 4) of every token these forwards routed,
        averaged over MoE layers: E · Σ_e f_e · P_e, with f_e the share of the k choices that went to expert e and
        P_e the mean router probability of e. None when nothing was collected."""
        if not self.balance:
            return None
        terms = []
        for prob_sum_E, count_E, tokens in self.balance.values():
            experts, chosen = prob_sum_E.shape[0], count_E.sum().clamp(min=1)
            terms.append(experts * ((count_E / chosen) * (prob_sum_E / max(tokens, 1))).sum())
        return torch.stack(terms).mean()

    def at(self, rows: torch.Tensor, positions: torch.Tensor, real: torch.Tensor | None = None) -> "TokenRoutes":
        """`real=None`: every token is real (a decode step), which records routes without a boolean selection, so
        the step stays free of host synchronisation (and capturable as a CUDA graph)."""
        real_M = torch.ones_like(rows.reshape(-1), dtype=torch.bool) if real is None else real.reshape(-1)
        return TokenRoutes(self, rows.reshape(-1), positions.reshape(-1), real_M, all_real=real is None)


class TokenRoutes:
    """A `Routing` for one forward's tokens (row_M, position_M, real_M, flattened in the forward's order);
    `layer(n)` gives the n-th MoE layer's view. `all_real`: no padding among them."""

    def __init__(self, routing: Routing, row_M: torch.Tensor, position_M: torch.Tensor, real_M: torch.Tensor,
                 all_real: bool = False):
        self.routing, self.real_M, self.all_real = routing, real_M, all_real
        # Padding reads row 0, position 0 (any valid index): its result is masked out.
        self.row_M, self.position_M = ((row_M, position_M) if all_real
                                       else (row_M.where(real_M, 0), position_M.where(real_M, 0)))

    def read(self, routes_BLNK: torch.Tensor, n: int) -> torch.Tensor:
        return routes_BLNK[self.row_M, self.position_M, n].long()

    def layer(self, n: int) -> "LayerRoutes":
        return LayerRoutes(self, n)


class LayerRoutes:
    """One MoE layer of one forward: chooses, records and compares its tokens' experts."""

    def __init__(self, tokens: TokenRoutes, n: int):
        self.tokens, self.n = tokens, n

    def choose(self, gate: torch.nn.Module, logits_ME: torch.Tensor, natural_MK: torch.Tensor,
               natural_weights_MK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        routing, tokens, n = self.tokens.routing, self.tokens, self.n
        # Padding goes to experts 0..k-1 whatever the router says: its outputs are never read, and an expert's
        # matmul then sees the same rows whichever weights route the real tokens (a row's result can depend in its
        # last bits on how many rows the matmul has), so a replay reproduces a recording bit for bit.
        padding_MK = torch.arange(natural_MK.shape[-1], device=natural_MK.device).expand_as(natural_MK)
        experts_MK = torch.where(tokens.real_M[:, None], natural_MK, padding_MK)
        weights_MK = natural_weights_MK
        if routing.replay_BLNK is not None:
            replayed_MK = tokens.read(routing.replay_BLNK, n)
            _check_replayed(replayed_MK, tokens.real_M, logits_ME.shape[-1], n)
            experts_MK = torch.where(tokens.real_M[:, None], replayed_MK, padding_MK)
        if routing.replay_BLNK is not None or routing.reweight:
            weights_MK = gate_weights(logits_ME, experts_MK, renormalises(gate)).to(natural_weights_MK.dtype)
        if routing.record_BLNK is not None and tokens.all_real:
            routing.record_BLNK[tokens.row_M, tokens.position_M, n] = natural_MK.to(ROUTE_DTYPE)
        elif routing.record_BLNK is not None:
            real = tokens.real_M
            routing.record_BLNK[tokens.row_M[real], tokens.position_M[real], n] = natural_MK[real].to(ROUTE_DTYPE)
        if routing.compare:
            self._count_agreement(natural_MK)
        if routing.balance is not None:
            self._collect_balance(logits_ME, experts_MK)
        return experts_MK, weights_MK

    def _collect_balance(self, logits_ME: torch.Tensor, experts_MK: torch.Tensor) -> None:
        real_M = self.tokens.real_M
        probs_ME = torch.softmax(logits_ME.float(), dim=-1)[real_M]
        count_E = torch.zeros(logits_ME.shape[-1], device=logits_ME.device).index_add_(
            0, experts_MK[real_M].flatten(), torch.ones(experts_MK[real_M].numel(), device=logits_ME.device))
        entry = self.tokens.routing.balance.setdefault(self.n, [0.0, 0.0, 0])
        entry[0], entry[1], entry[2] = entry[0] + probs_ME.sum(0), entry[1] + count_E, entry[2] + int(real_M.sum())

    def _count_agreement(self, natural_MK: torch.Tensor) -> None:
        routing, tokens = self.tokens.routing, self.tokens
        counted_M = tokens.real_M
        if routing.counted_BL is not None:
            counted_M = counted_M & routing.counted_BL[tokens.row_M, tokens.position_M]
        natural_MK = natural_MK.sort(-1).values
        for name, routes_BLNK in routing.compare.items():
            other_MK = tokens.read(routes_BLNK, self.n)
            valid_M = counted_M & (other_MK >= 0).all(-1)
            same_M = (other_MK.sort(-1).values == natural_MK).all(-1) & valid_M
            routing.agreement[name] += torch.stack([same_M.sum(), valid_M.sum()]).double().cpu()


def _check_replayed(replayed_MK: torch.Tensor, real_M: torch.Tensor, experts: int, layer: int) -> None:
    """Recorded ids of real tokens must name experts: a missing route (−1) or an id ≥ E is an error, never a
    silent fall-back to natural routing."""
    bad_M = real_M & ((replayed_MK < 0) | (replayed_MK >= experts)).any(-1)
    if bool(bad_M.any()):
        count = int(bad_M.sum())
        raise ValueError(f"routing replay: {count} token(s) have no valid recorded experts at MoE layer {layer} "
                         f"(ids must be in [0, {experts})); the batch's routes do not cover its tokens")


def new_routes(rows: int, length: int, layers: int, top_k: int, device: torch.device) -> torch.Tensor:
    """An empty routes tensor [rows, length, layers, k] (−1: not routed)."""
    return torch.full((rows, length, layers, top_k), NO_ROUTE, dtype=ROUTE_DTYPE, device=device)
