"""The policy's forward as the trainer sees it: log-probs (and entropies) of a batch's response tokens.

    z_t = lm_head(h_t) / temperature,  logp_t = z_t[y_t] − logsumexp(z_t),  H_t = logsumexp(z_t) − E_softmax(z_t)[z]

`PolicyForward` is built once per model (the policy, the reference) with everything that decides how the
forward runs — temperature, compile, device, the record of the rollout's forward, the head's tiling — so that
the trainer asks it for the log-probs of a batch and never threads those through its calls. Which path runs is
`literl.model.capabilities`' decision:

    head is not a plain linear map         → the model's own logits (direct)
    record valid for these weights         → replayed (literl.model.forward, literl.model.record)
    the device packs rows (CUDA)           → packed: whole rows as one token stream (literl.model.packing)
    rows share prompts, shared path exact  → shared prompts, hand-applied layers (or the model's cached forward)
    otherwise                              → whole rows through the model's own forward, grouped by length

and the head then runs tile by tile (`literl.model.head`). Gradients reach every parameter, the tied embedding
included, whenever autograd is on. With a `compute_dtype` narrower than the parameters (`model.dtype=bfloat16`
over float32 master weights, `literl.model.precision`) the layers run under autocast and the head's matmuls in
that dtype; log-probs, entropies and gradients come back in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from literl.model.attention import PACKED_KERNELS
from literl.model.capabilities import capabilities, fuses_head_tiles, micro_batch_tokens
from literl.model.forward import hidden_by_length, response_hidden
from literl.model.grouping import forward_groups, replay_groups
from literl.model.head import Tiling, direct_logprobs, head_logprobs, scatter_rows
from literl.model.moe import OLD_ROUTES, ROLLOUT_ROUTES, Routing, new_routes
from literl.model.packing import pack_rows, packed_layers, unpacked
from literl.model.precision import autocasts, computing_in
from literl.model.prompt_pass import batch_prompts
from literl.model.record import ForwardRecord, Recorder
from literl.algorithm.ops import Ratio

ROUTING_REPLAY = ("none", "r2", "r3")
PACKING = ("auto", "off", *PACKED_KERNELS)


class Logprobs(NamedTuple):
    """A forward's log-probs of the response tokens (0 past each response's end), their entropies when asked, and
    an auxiliary loss the model's own training adds (the MoE load-balancing loss, when it is on)."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None
    aux_loss: torch.Tensor | None = None


class PolicyForward:
    """Log-probs of response tokens under `model` (see the module docstring).

    temperature      the sampling temperature (log-probs of every policy use it, algorithms.md §0.3)
    compile          run the hand-applied layers through `torch.compile` (Llama/Qwen-style models)
    record_max_bytes memory the rollout may use to keep its forward for this model (0: never); the engine
                     writes into `recorder`, and `watch(optimizer)` makes records stale after each step
    max_tokens       padded tokens per forward of `batch_logprobs` (the no-grad passes), or "auto"
                     (`capabilities.micro_batch_tokens`)
    tiling           the head's tile (`head.Tiling.default` for the model's device when None)
    compute_dtype    the dtype the forward computes in (None: the parameters'); narrower than the parameters, the
                     layers run under autocast (mixed precision, `literl.model.precision`)
    packed           "auto": pack rows where `capabilities.packed_kernel` says (CUDA); "off": never; a kernel of
                     `attention.PACKED_KERNELS`: always, with that kernel (tests, benchmarks)
    routing_replay   for the policy of a mixture-of-experts model: "none" | "r2" | "r3" (see `_routing`); None
                     (the reference) routes naturally and records nothing
    router_aux_loss  the update's forwards also return the MoE load-balancing loss (`moe.Routing.balance_loss`)
    """

    def __init__(self, model: torch.nn.Module, *, temperature: float = 1.0, compile: bool = False,
                 record_max_bytes: int = 0, max_tokens: int | str = 16384, tiling: Tiling | None = None,
                 routing_replay: str | None = None, router_aux_loss: bool = False,
                 compute_dtype: torch.dtype | None = None, packed: str = "auto"):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        if routing_replay not in (None, *ROUTING_REPLAY):
            raise ValueError(f"routing_replay must be one of {ROUTING_REPLAY} or None (got {routing_replay!r})")
        if packed not in PACKING:
            raise ValueError(f"packed must be one of {PACKING} (got {packed!r})")
        self.model, self.temperature, self.compile = model, float(temperature), bool(compile)
        self.device = next(model.parameters()).device
        self._max_tokens = max_tokens if max_tokens == "auto" else int(max_tokens)
        # The dtype the layers autocast to (None: they compute in the parameters' own dtype).
        self.compute_dtype = compute_dtype if autocasts(model, compute_dtype) else None
        self.packed = packed
        self.recorder = Recorder(model, record_max_bytes) if record_max_bytes > 0 else None
        self._tiling = tiling
        self.routing_replay = routing_replay
        self.router_aux_loss = router_aux_loss and capabilities(model).moe is not None
        self._metrics: dict[str, Ratio] = {}
        if routing_replay in ("r2", "r3") and capabilities(model).moe is None:
            raise ValueError(f"algorithm.routing_replay={routing_replay} replays the experts a mixture-of-experts "
                             f"model routed its tokens to, but {type(model).__name__} has no MoE layers the runtime "
                             f"can route (a dense model, or MoE blocks it does not run); set "
                             f"algorithm.routing_replay=none")

    @property
    def max_tokens(self) -> int:
        """Tokens per forward (`max_tokens`, with "auto" resolved once: `capabilities.micro_batch_tokens`)."""
        if self._max_tokens == "auto":
            self._max_tokens = micro_batch_tokens(self, "auto")
        return self._max_tokens

    def lower_max_tokens(self, tokens: int) -> None:
        """Tokens per forward from now on: the update's budget after a micro-batch ran out of memory."""
        self._max_tokens = int(tokens)

    @property
    def packed_kernel(self) -> str | None:
        """The attention kernel when this forward packs rows into one token stream, else None."""
        if self.packed == "off":
            return None
        if self.packed != "auto":
            if not capabilities(self.model).layers:
                raise ValueError(f"packed={self.packed}: {type(self.model).__name__} does not run through literl's "
                                 "layer body, which the packed forward needs")
            return self.packed
        return capabilities(self.model).packed_kernel(self.compute_dtype)

    @property
    def shares_packed_prompts(self) -> bool:
        """Whether the packed route runs each distinct prompt once for the rows that continue it
        (`capabilities.packed_prompts_shared`; never with MoE routes replayed: they are read by batch row)."""
        kernel = self.packed_kernel
        return kernel is not None and capabilities(self.model).packed_prompts_shared(kernel, self.compute_dtype)

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Count this optimizer's steps: a record made before a step never stands in for the weights after it."""
        if self.recorder is not None:
            self.recorder.watch(optimizer)

    # ------------------------------------------------------------------------------------------ batches
    def logprobs(self, rows, *, with_entropy: bool = False) -> Logprobs:
        """The log-probs (and entropies) of a batch's rows (`literl.algorithm.batch` layout) in one forward, with
        autograd when it is on. An update's forward: MoE routes replayed as `routing_replay` says, and the
        load-balancing loss returned when it is on."""
        routing = self._routing(rows, old_pass=False)
        logp_BT, entropy_BT = self.token_logprobs(rows.tokens_BL, rows.prompt_len_B, rows.response_ids_BT.shape[1],
                                                  mask_BT=_forward_mask(rows), with_entropy=with_entropy,
                                                  record=rows.forward_record, routing=routing)
        logp_BT, entropy_BT = _only_sampled(rows, logp_BT), _only_sampled(rows, entropy_BT)
        return Logprobs(logp_BT, entropy_BT, None if routing is None else routing.balance_loss())

    @torch.no_grad()
    def batch_logprobs(self, batch) -> torch.Tensor:
        """logp_BT of a whole batch without autograd, in forwards of at most `max_tokens` padded tokens, on the CPU
        in batch row order. For the policy of an MoE model this is the old-log-prob pass: it records the experts
        it chose into `batch.extras["old_routes_BLNK"]` (what R2 replays, and what staleness agreement compares
        with)."""
        out = torch.zeros_like(batch.rollout_logp_BT)
        T = batch.response_ids_BT.shape[1]
        rows = torch.arange(len(batch))
        step = max(1, self.max_tokens // max(int(batch.lengths_B.max()), 1))
        moe = capabilities(self.model).moe if self.routing_replay is not None else None
        old_routes = None if moe is None else new_routes(len(batch), batch.tokens_BL.shape[1], moe.layers,
                                                         moe.top_k, torch.device("cpu"))
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(batch), step):
                index = rows[start:start + step]
                part = batch.select(index).trimmed()
                routing = self._routing(part, old_pass=True)
                logp, _ = self.token_logprobs(part.tokens_BL, part.prompt_len_B, part.response_ids_BT.shape[1],
                                              mask_BT=_forward_mask(part), record=part.forward_record,
                                              routing=routing)
                out[index, :logp.shape[1]] = logp.float().cpu()
                if routing is not None:
                    old_routes[index, :routing.record_BLNK.shape[1]] = routing.record_BLNK.cpu()
        finally:
            self.model.train(was_training)
        if old_routes is not None:
            batch.extras[OLD_ROUTES] = old_routes
        return torch.where(batch.mask_BT, out, torch.zeros_like(out))[:, :T]

    def take_metrics(self) -> dict[str, float]:
        """What the forward measured since the last call (MoE route agreement, algorithms.md §7), as floats."""
        out = {key: float(value) for key, value in self._metrics.items()}
        self._metrics = {}
        return out

    # ------------------------------------------------------------------------------------------ MoE routes
    def _routing(self, rows, *, old_pass: bool) -> Routing | None:
        """How this forward routes the rows' MoE layers (algorithms.md §6):

            pass        none                        r2                            r3
            old-logp    natural, recorded           natural, recorded (replay     rollout routes replayed,
                                                    weights)                      natural recorded
            update      natural                     old routes replayed           rollout routes replayed

        and which agreements it counts: `moe/route_agree_ti` (the natural choice against the engine's routes, at
        θ_old: in the old-log-prob pass, else in the first mini-batch's forwards) and `moe/route_agree_st` with
        `_mb<k>` (the natural choice under θ against θ_old's, in mini-batch k)."""
        if self.routing_replay is None or capabilities(self.model).moe is None:
            return None
        rollout, old = rows.extras.get(ROLLOUT_ROUTES), rows.extras.get(OLD_ROUTES)
        counted_BL = _predicting_positions(rows).to(self.device)
        compare_to = {name: routes.to(self.device) for name, routes in (("ti", rollout), ("st", old))
                      if routes is not None}
        if old_pass:
            moe = capabilities(self.model).moe
            record = new_routes(len(rows), rows.tokens_BL.shape[1], moe.layers, moe.top_k, self.device)
            replay = self._required(rollout, "r3", ROLLOUT_ROUTES) if self.routing_replay == "r3" else None
            compare = {"moe/route_agree_ti": compare_to["ti"]} if "ti" in compare_to else {}
            return Routing(replay_BLNK=replay, record_BLNK=record, compare=compare, counted_BL=counted_BL,
                           reweight=self.routing_replay == "r2")
        replay = None
        if self.routing_replay == "r2":
            replay = self._required(old, "r2", OLD_ROUTES)
        elif self.routing_replay == "r3":
            replay = self._required(rollout, "r3", ROLLOUT_ROUTES)
        minibatch = int(rows.minibatch_B[0]) if hasattr(rows, "minibatch_B") and len(rows) else 0
        compare = {}
        if "st" in compare_to:
            compare[f"moe/route_agree_st_mb{minibatch}"] = compare_to["st"]
        elif "ti" in compare_to and minibatch == 0:
            compare["moe/route_agree_ti"] = compare_to["ti"]
        return Routing(replay_BLNK=replay, compare=compare, counted_BL=counted_BL,
                       balance=self.router_aux_loss and torch.is_grad_enabled())

    def _note_agreement(self, routing: Routing | None) -> None:
        """Add a forward's route agreement counts to the metrics (`take_metrics`)."""
        if routing is None:
            return
        for key, (agree, total) in routing.agreement.items():
            if float(total) == 0:
                continue
            keys = [key] + (["moe/route_agree_st"] if key.startswith("moe/route_agree_st_mb") else [])
            for name in keys:
                self._metrics[name] = self._metrics.get(name, Ratio(0.0, 0.0)) + Ratio(float(agree), float(total))

    def _required(self, routes, mode: str, key: str):
        if routes is None:
            source = {"r2": "the old-log-prob pass recorded none (it must run before the update)",
                      "r3": "the rollout engine returned none (only engines that route MoE layers through literl's "
                            "runtime, or vLLM on GPU, return them)"}[mode]
            raise ValueError(f"algorithm.routing_replay={mode} replays the batch's {key}, but {source}")
        return routes.to(self.device)

    # ------------------------------------------------------------------------------------------ tensors
    def token_logprobs(self, tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, T: int, *,
                       mask_BT: torch.Tensor | None = None, with_entropy: bool = False,
                       record: ForwardRecord | None = None, routing: Routing | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π(y_t) of response tokens t < T of each row, and the entropy of π at those positions if asked.

        Row b holds its prompt then its response, right-padded; response token t is
        `tokens_BL[b, prompt_len_B[b] + t]`. Returns fp32 (logp_BT, entropy_BT or None). Positions past a row's end
        hold finite values of no meaning, or 0 where `mask_BT` is given: the head then skips them, which saves the
        vocabulary-sized matmul on padding. A `record` of the rollout's forward (covering these rows) is replayed
        when it still matches the model's weights: same values, gradients within float rounding. A `routing`
        (`literl.model.moe.Routing` over these rows) routes the MoE layers of every token by its batch position.
        """
        B = tokens_BL.shape[0]
        if B == 0 or T == 0:
            empty = torch.zeros(B, T, device=self.device)
            return empty, (empty.clone() if with_entropy else None)
        caps = capabilities(self.model)
        if (mask_BT is not None and self.packed_kernel is not None and not self.replays(record)
                and caps.head is not None and caps.fits_window(tokens_BL.shape[1])):
            return self._packed_logprobs(tokens_BL, prompt_len_B, mask_BT[:, :T], with_entropy, routing)
        tokens_BL, prompt_len_B = tokens_BL.to(self.device), prompt_len_B.to(self.device)
        if int(prompt_len_B.min()) < 1:
            raise ValueError("every row needs a prompt of at least one token")
        pos_BT = prompt_len_B[:, None] - 1 + torch.arange(T, device=self.device)[None, :]
        # The last response token is never an input: the forward only needs columns up to its predictor.
        L = min(tokens_BL.shape[1], int(pos_BT[:, -1].max()) + 1)
        pos_BT = pos_BT.clamp(max=L - 1)
        target_BT = tokens_BL.gather(1, (pos_BT + 1).clamp(max=tokens_BL.shape[1] - 1))
        dense = mask_BT is None
        valid_BT = torch.ones(B, T, dtype=torch.bool, device=self.device) if dense else mask_BT.to(self.device).bool()

        head = caps.head
        if head is None:
            with computing_in(self.model, self.compute_dtype):
                return direct_logprobs(self.model, tokens_BL[:, :L], pos_BT, target_BT, valid_BT, self.temperature,
                                       with_entropy)
        with computing_in(self.model, self.compute_dtype):
            if dense:
                hidden_BLH = self.model.get_decoder()(input_ids=tokens_BL[:, :L], use_cache=False).last_hidden_state
                index_BTH = pos_BT[:, :, None].expand(-1, -1, hidden_BLH.shape[-1])
                hidden_MH = hidden_BLH.gather(1, index_BTH).flatten(0, 1)
            else:
                hidden_MH = self._response_hidden(tokens_BL, prompt_len_B, pos_BT, valid_BT, record, routing)
        if not dense:
            self._note_agreement(routing)
        logp_M, entropy_M = head_logprobs(head, hidden_MH, target_BT[valid_BT], self.temperature, with_entropy,
                                          self._head_tiling(head), self.compute_dtype,
                                          fused=fuses_head_tiles(self.device, self.compile))
        logp_BT = scatter_rows(logp_M, valid_BT, dense)
        return logp_BT, (scatter_rows(entropy_M, valid_BT, dense) if with_entropy else None)

    def _packed_logprobs(self, tokens_BL, prompt_len_B, valid_BT, with_entropy: bool, routing: Routing | None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed route: the rows' stream laid out on the CPU (every shape and index known there, so nothing
        waits on the device), moved in one copy, run through the layers and the head. Prompts are shared where
        `shares_packed_prompts` says, except with MoE routes (read by each token's batch row)."""
        share = routing is None and self.shares_packed_prompts
        packed = pack_rows(tokens_BL, prompt_len_B, valid_BT, share_prompts=share)
        if packed.target_P.numel() == 0:
            empty = torch.zeros(valid_BT.shape, device=self.device)
            return empty, (empty.clone() if with_entropy else None)
        packed = packed.to(self.device)
        routes = None if routing is None else routing.at(packed.row_M, packed.position_M,
                                                         torch.ones_like(packed.row_M, dtype=torch.bool))
        with computing_in(self.model, self.compute_dtype):
            hidden_PH = packed_layers(self.model.get_decoder(), packed, self.packed_kernel, routes,
                                      compiled=self.compile)
        self._note_agreement(routing)
        head = capabilities(self.model).head
        logp_P, entropy_P = head_logprobs(head, hidden_PH, packed.target_P, self.temperature, with_entropy,
                                          self._head_tiling(head), self.compute_dtype,
                                          fused=fuses_head_tiles(self.device, self.compile))
        return unpacked(logp_P, packed), (unpacked(entropy_P, packed) if with_entropy else None)

    def _head_tiling(self, head: torch.nn.Linear) -> Tiling:
        return self._tiling or Tiling.default(head.out_features, self.device)

    def replays(self, record: ForwardRecord | None) -> bool:
        """Whether a forward of rows carrying this record replays it: the record is still in its buffers, was made
        from this model with its current weights, and the model runs through the layer body."""
        return (record is not None and capabilities(self.model).layers and record.valid()
                and record.matches(self.model))

    def _response_hidden(self, tokens_BL, prompt_len_B, pos_BT, valid_BT, record: ForwardRecord | None,
                         routing: Routing | None):
        """Hidden states at the real response positions (valid_BT's True entries, row-major). Routed MoE layers
        need the layer body, so their rows take the shared-prompt path even when no prompt is shared."""
        caps = capabilities(self.model)
        replay = record if self.replays(record) else None
        prompts = batch_prompts(tokens_BL, prompt_len_B, only_if_shared=replay is None and routing is None)
        if prompts is not None and caps.fits_window(tokens_BL.shape[1]) and caps.shared_prompts:
            return response_hidden(self.model, tokens_BL, prompt_len_B, valid_BT, prompts,
                                   buckets=forward_groups if replay is None else replay_groups,
                                   by_layers=caps.layers, compiled=self.compile, record=replay, routing=routing)
        if routing is not None:
            raise ValueError("MoE routes can only be recorded or replayed on sequences shorter than the model's "
                             f"attention window ({caps.window}) of a model whose shared-prompt forward matches")
        return hidden_by_length(self.model.get_decoder(), tokens_BL, pos_BT, valid_BT)



def _forward_mask(rows) -> torch.Tensor:
    """The response positions to compute: the sampled tokens, and a multi-turn row's context between them (so the
    positions the forward reads stay a prefix of each row, as every route needs)."""
    return rows.forward_mask_BT if hasattr(rows, "forward_mask_BT") else rows.mask_BT


def _only_sampled(rows, values_BT: torch.Tensor | None) -> torch.Tensor | None:
    """A multi-turn row's log-probs (or entropies) at its context positions are set to 0 with no gradient path:
    context is read, never trained on. Single-turn rows (no context) are returned as they are."""
    context_BT = getattr(rows, "context_mask_BT", None)
    if values_BT is None or context_BT is None:
        return values_BT
    keep_BT = rows.mask_BT[:, :values_BT.shape[1]].to(values_BT.device)
    return torch.where(keep_BT, values_BT, torch.zeros((), dtype=values_BT.dtype, device=values_BT.device))


def _predicting_positions(rows) -> torch.Tensor:
    """bool [B, L]: the positions whose output predicts a response token in the mask (p = prompt_len − 1 + t for
    each response token t): where route agreement is counted."""
    B, L = rows.tokens_BL.shape
    counted_BL = torch.zeros(B, L, dtype=torch.bool)
    t_BT = torch.arange(rows.mask_BT.shape[1])[None, :].expand_as(rows.mask_BT)
    position_BT = (rows.prompt_len_B.cpu()[:, None] - 1 + t_BT).clamp(max=L - 1)
    row_BT = torch.arange(B)[:, None].expand_as(rows.mask_BT)
    mask_BT = rows.mask_BT.cpu().bool()
    counted_BL[row_BT[mask_BT], position_BT[mask_BT]] = True
    return counted_BL
