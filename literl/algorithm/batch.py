"""Batches that flow through a step: what the rollout produced, and what the objective prepared.

Dimension key: the suffix letters on every tensor that crosses a function boundary, one meaning each.
    the batch      P  prompts per step        G  samples per prompt (group size)   B = P·G rows (sequences)
                   T  response tokens (padded)   L  prompt + response tokens (padded)   V  vocabulary (or a tile)
    the model      H  hidden size     D  head dimension     Q  query heads     J  key/value heads
                   Z  query heads per key/value head (Q = J·Z)     F  a projection's output features (q|k|v, …)
                   I, O  a linear map's input and output features     N  decoder layers
                   E  experts         K  experts chosen per token (top-k)
    a forward      R  a subset of the rows (one forward's, the live "slots" of a decode, the rows a scan reads)
                   U  distinct prompts     X  prompt columns (left-padded)     W  response columns of one forward
                   S  key columns attended over (a decode cache's capacity; prefix + W)
                   M  packed tokens (valid positions, flattened)     C  tokens of one tile of the LM head
                   Y  a packed stream's keys, segment after segment (with shared prompts a response segment's
                      are its prompt's, then its own)     A  the copies of prompt keys among them

The four log-probs, one name each:
    rollout_logp  log μ(y_t): what the inference engine reported while sampling (no grad)
    old_logp      log π_old(y_t): the trainer's recompute under the pre-update policy, the proximal policy
                  of the PPO ratio (no grad); equals rollout_logp in bypass mode
    logp          log π_θ(y_t): the current policy, with grad (never stored on a batch)
    ref_logp      log π_ref(y_t): the frozen reference policy, for KL (no grad)
All are taken from temperature-scaled logits (algorithms.md §0.3).

Layout: `tokens_BL` holds each row's prompt then its response, right-padded with `pad_id`; response token t
of row b sits at `tokens_BL[b, prompt_len_B[b] + t]` and equals `response_ids_BT[b, t]`. Right padding lets
training forwards run with a plain causal mask (pads come last, so no real token ever attends to one).

Multi-turn rows (`literl.multiturn.collector`) hold more than sampled tokens in their response: the observations
and turn-boundary ids between turns, context the model conditions on but never trained on. `mask_BT` stays the
sampled tokens only (what every loss, statistic and IS weight reads), and `context_mask_BT` marks the others;
`forward_mask_BT`, their union, is a prefix of each row: the positions the forward computes and the batch is
trimmed and packed by. Single-turn batches have no context (`context_mask_BT` None), and then
`forward_mask_BT` is `mask_BT` itself.

Per-token extras (MoE routes, engine log-probs, ...) ride in `extras`, tensors keyed with their shape suffix
(`rollout_routes_BLNK`), and are sliced and trimmed with the batch like every other field. An asynchronous run
(`rollout.max_staleness >= 1`) adds `policy_version_BT` (the policy version that sampled each token) and
`rollout_staleness_BT` (the training step minus that version), both long and −1 on padding. The record of the
rollout's forward (`forward_record`, `literl.model.record.ForwardRecord`) is one field, opaque here: its buffers stay
whole, and selecting rows selects its per-row index.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


POLICY_VERSION = "policy_version_BT"        # the policy version (weights after that many steps) that sampled a token
STALENESS = "rollout_staleness_BT"          # step that trains the token − its policy version


def slice_rows(value: Any, index: torch.Tensor):
    """The rows `index` of a per-row value: a tensor's, a list's, each entry of a dict, or an object's own
    `select` (the forward record); other values are not per-row and stay whole."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)]
    if isinstance(value, list):
        return [value[i] for i in index.tolist()]
    if isinstance(value, dict):
        return {k: slice_rows(v, index) for k, v in value.items()}
    if hasattr(value, "select"):
        return value.select(index)
    return value


def _trim(name: str, value: Any, T: int, L: int):
    if isinstance(value, dict):
        return {k: _trim(k, v, T, L) for k, v in value.items()}
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return value
    if "_BT" in name:
        return value[:, :T]
    if "_BL" in name:
        return value[:, :L]
    return value


class _Rows:
    """Row selection, shuffling and length-trimming shared by both batch types (driven by shape suffixes)."""

    def __len__(self) -> int:
        return int(self.mask_BT.shape[0])

    def select(self, index) -> "_Rows":
        index = torch.as_tensor(index, dtype=torch.long)
        return dataclasses.replace(
            self, **{f.name: slice_rows(getattr(self, f.name), index) for f in dataclasses.fields(self)
                     if f.name not in self._scalars})

    @property
    def forward_mask_BT(self) -> torch.Tensor:
        """The response positions a forward computes: the sampled tokens and, in multi-turn rows, the context
        between them (a prefix of each row; `mask_BT` itself when there is no context)."""
        context_BT = getattr(self, "context_mask_BT", None)
        return self.mask_BT if context_BT is None else self.mask_BT | context_BT

    def trimmed(self) -> "_Rows":
        """Drop padding columns that no row of this (micro-)batch uses."""
        region_BT = self.forward_mask_BT
        T = int(region_BT.sum(-1).max().item()) if len(self) else 0
        T = max(T, 1)
        L = int((self.prompt_len_B + region_BT.sum(-1)).max().item()) if len(self) else 1
        return dataclasses.replace(
            self, **{f.name: _trim(f.name, getattr(self, f.name), T, L) for f in dataclasses.fields(self)
                     if f.name not in self._scalars})

    @property
    def lengths_B(self) -> torch.Tensor:
        """Prompt + response tokens of each row (a multi-turn row's context included: what its forward reads)."""
        return self.prompt_len_B + self.forward_mask_BT.sum(-1)

    @property
    def num_tokens(self) -> int:
        """Sampled response tokens (context excluded: no loss, no statistic counts it)."""
        return int(self.mask_BT.sum())

    _scalars: tuple[str, ...] = ("pad_id",)


@dataclass
class RolloutBatch(_Rows):
    """Sampled groups with their rewards, before any training quantity is computed."""

    tokens_BL: torch.Tensor            # long: prompt + response, right-padded
    prompt_len_B: torch.Tensor         # long
    response_ids_BT: torch.Tensor      # long
    mask_BT: torch.Tensor              # bool: response tokens (EOS included, padding excluded)
    rollout_logp_BT: torch.Tensor      # float32
    truncated_B: torch.Tensor          # bool: stopped by max_new_tokens, not by EOS
    group_B: torch.Tensor              # long: prompt/group id (explicit, never inferred from order)
    scores_B: torch.Tensor             # float32: reward functions' combined score, before shaping
    correct_B: torch.Tensor            # bool: the accuracy verdict (first reward fn >= 0.5)
    rewards_B: torch.Tensor            # float32: after reward shaping; what the advantage sees
    problem_B: torch.Tensor            # long: index of the problem in its dataset
    responses: list[str] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)   # the problem record of each row (id, answer, tier...)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)     # per-token tensors (see the module doc)
    # The rollout's forward, when an on-policy update may replay it: a `literl.model.record.ForwardRecord`, opaque
    # here (only the policy forward reads it; rows are selected through its own `select`).
    forward_record: Any = None
    # bool: multi-turn context in the response (observations, turn boundaries); None for single-turn rows
    context_mask_BT: torch.Tensor | None = None
    pad_id: int = 0


@dataclass
class TrainBatch(_Rows):
    """A rollout batch with every per-step quantity the loss needs; built once by `Objective.prepare`.

    `weight_BT` is the aggregation weight: it already folds in the loss mask (response ∧ loss masks ∧ IS
    keep) and the normaliser of the whole optimizer step, so the loss of any micro-batch is a plain
    weighted sum and micro-batch losses add up exactly to the full-batch loss.
    """

    tokens_BL: torch.Tensor
    prompt_len_B: torch.Tensor
    response_ids_BT: torch.Tensor
    mask_BT: torch.Tensor              # bool: response tokens
    loss_mask_BT: torch.Tensor         # bool: tokens that enter the loss (mask ∧ loss masks ∧ IS keep)
    rollout_logp_BT: torch.Tensor
    old_logp_BT: torch.Tensor | None   # None: reuse sg(logp) (single on-policy update, see Objective)
    ref_logp_BT: torch.Tensor | None
    adv_BT: torch.Tensor
    is_weight_BT: torch.Tensor         # detached training–inference correction weight (1 when off)
    weight_BT: torch.Tensor            # aggregation weight for the policy loss, normalised per optimizer step
    minibatch_B: torch.Tensor          # long: which optimizer step of this rollout batch the row belongs to
    group_B: torch.Tensor              # long: prompt/group id (the group-level aggregations need it)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    forward_record: Any = None          # as RolloutBatch's
    context_mask_BT: torch.Tensor | None = None     # as RolloutBatch's: context, never in mask_BT or the loss
    pad_id: int = 0
    step_share: float = 1.0            # this micro-batch's share of its optimizer step's response tokens
    epochs: int = 1                    # passes the update makes over the mini-batches (PPO epochs)

    _scalars: ClassVar[tuple[str, ...]] = ("pad_id", "step_share", "epochs")

    def minibatches(self) -> list["TrainBatch"]:
        """One batch per optimizer step, in order: the N mini-batches, `epochs` times over. Each one's
        `minibatch_B` says which optimizer step of the rollout batch it is (e·N + k in pass e), so what is logged
        per mini-batch (`st/ppo_kl_mb<k>`, `moe/route_agree_st_mb<k>`) follows the policy's drift through every
        pass."""
        n = int(self.minibatch_B.max().item()) + 1 if len(self) else 0
        parts = [self.select(torch.nonzero(self.minibatch_B == k).flatten()) for k in range(n)]
        return [part if epoch == 0 else dataclasses.replace(part, minibatch_B=part.minibatch_B + epoch * n)
                for epoch in range(self.epochs) for part in parts]

    def micro_batches(self, max_tokens: int, *, packed: bool = False) -> list["TrainBatch"]:
        """Split into micro-batches of at most `max_tokens` padded tokens (`packed`: real tokens, for a forward
        that packs rows without padding), grouping similar lengths.

        Rows are sorted by length so each micro-batch trims to its own longest row: little padding is
        computed. Exactness does not depend on the split because `weight_BT` is normalised per step.
        """
        lengths = self.lengths_B
        order = torch.argsort(lengths, descending=True, stable=True)
        chunks, current, current_max, current_sum = [], [], 0, 0
        for i in order.tolist():
            row_len = int(lengths[i])
            new_max = max(current_max, row_len)
            size = current_sum + row_len if packed else new_max * (len(current) + 1)
            if current and size > max_tokens:
                chunks.append(current)
                current, new_max, current_sum = [], row_len, 0
            current.append(i)
            current_max = new_max
            current_sum += row_len
        if current:
            chunks.append(current)
        micros = [self.select(torch.tensor(c)).trimmed() for c in chunks]
        total = max(self.num_tokens, 1)
        return [dataclasses.replace(micro, step_share=micro.num_tokens / total) for micro in micros]
