"""The objective: the one place where tricks are composed.

    L(θ) = Σ_{b,t} w_bt · ( c_bt · g_bt · ℓ_policy(logp, old_logp, rollout_logp, A)_bt
                            + β · KL_est(logp, ref_logp)_bt            (KL as a loss term)
                            − c_H · H_bt )                             (entropy bonus)
           + λ_aux · aux                                               (MoE load balancing, off by default)

    w  = aggregation weights: numerator_bt / Σ denominator, computed once per optimizer step over the
         whole step batch, with the loss mask folded in (response ∧ loss masks ∧ IS keep)
    c  = training–inference IS-correction weight (detached)
    g  = product of the policy masks' gates (detached; 1 when none): computed per micro-batch from the current
         policy (OPSM's drift, the 80/20 entropy mask), they leave w, and so every denominator, unchanged
    A  = advantages from the shaped rewards (and −β·KL per token when KL is a reward penalty)

Because every normaliser is in `w`, the loss of a micro-batch is a plain weighted sum: micro-batch
losses add up to the full-step loss exactly, whatever the split (and, later, whatever the ranks, once
the denominators are all-reduced). Axis metrics come back with their axis as prefix
(`policy_loss/clipfrac_binding_high`, `is_correction/ess`, ...). Nothing here compares a trick name:
every trick arrives built from its registry.

What a trick needs from the step besides its positional tensors it declares (`register(inputs=...)`), and
this is where it is supplied: `entropy_BT` (the update forward's entropies, detached) and `generator` (a
torch.Generator per micro-batch, seeded from per-row seeds drawn in `prepare` from the run's generator, so the
same seed makes the same selection, a resumed run included, wherever the micro-batch is computed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from literl.algorithm.batch import STALENESS, RolloutBatch, TrainBatch
from literl.algorithm.diagnostics.importance import is_decomposition
from literl.algorithm.ops import dense_group_index, group_min_max, masked_mean
from literl.algorithm.metric_reduction import scalars
from literl.algorithm.tricks import (ADVANTAGES, AGGREGATIONS, GROUP_FILTERS, IS_CORRECTIONS, KL_ESTIMATORS, LOSS_MASKS,
                           POLICY_LOSSES, POLICY_MASKS, REWARD_SHAPING)

SELECTION_SEED = "selection_seed_B"     # TrainBatch.extras: per-row seeds of the tricks that draw at random


@dataclass
class LossOutput:
    loss: torch.Tensor                      # this micro-batch's share of the step loss (with grad)
    metrics: dict                           # 0-dim tensors token-weighted by `num_loss_tokens`, and ops.Ratio /
                                            # ops.SampleSize diagnostics that carry their own counts
    token_maps: dict[str, torch.Tensor] = field(default_factory=dict)   # per-token maps (clipped_high_BT ...)
    num_loss_tokens: int = 0


class Objective:
    """Built once from `cfg.algorithm`; `prepare` runs once per rollout batch, `loss` per micro-batch."""

    def __init__(self, *, advantage: Callable, policy_loss: Callable, aggregation: Callable,
                 is_correction: Callable, kl: Callable, kl_coef: float, kl_in_reward: bool, entropy_coef: float,
                 loss_masks: list[Callable], reward_shaping: list[Callable], group_filter: Callable,
                 bypass_mode: bool, local_normaliser: bool = False, routing_replay: str = "none",
                 router_aux_coef: float = 0.0, policy_masks: dict[str, Callable] | None = None,
                 max_staleness: int = 0, always_recompute_old_logp: bool = False):
        self.advantage, self.policy_loss, self.aggregation = advantage, policy_loss, aggregation
        self.is_correction, self.kl, self.group_filter = is_correction, kl, group_filter
        self.kl_coef, self.kl_in_reward, self.entropy_coef = kl_coef, kl_in_reward, entropy_coef
        self.loss_masks, self.reward_shaping, self.bypass_mode = loss_masks, reward_shaping, bypass_mode
        self.local_normaliser = local_normaliser
        self.routing_replay, self.router_aux_coef = routing_replay, router_aux_coef
        self.policy_masks = dict(policy_masks or {})
        self.draws_at_random = any("generator" in _inputs(fn) for fn in (policy_loss, *self.policy_masks.values()))
        self.max_staleness = max_staleness     # asynchronous runs: the ti/st statistics per staleness 0..k
        # trainer.recompute_old_logp=always: run the old-log-prob pass even where it could be read off the update
        # (to time the pass, or to compare both routes); auto skips it where that is exact.
        self.always_recompute_old_logp = always_recompute_old_logp

    @classmethod
    def from_config(cls, cfg) -> "Objective":
        """Build every axis from a full `Config` (the run's max_new_tokens is context for some tricks), and run it
        once on a tiny synthetic batch (`self_check`), so that a parameter value no trick can run with fails
        here, not at step 300."""
        if cfg.rollout.max_new_tokens is None:      # not resolved yet: the profile's value (literl/config/profiles.py)
            from literl.config.load import resolve  # noqa: PLC0415 - the config's rules import this module

            cfg = resolve(cfg)
        a = cfg.algorithm
        ctx = {"max_new_tokens": cfg.rollout.max_new_tokens}

        def one(registry, spec, where):
            return registry.build(spec.name, spec.params, where=f"algorithm.{where}", context=ctx)

        objective = cls(
            advantage=one(ADVANTAGES, a.advantage, "advantage"),
            policy_loss=one(POLICY_LOSSES, a.policy_loss, "policy_loss"),
            aggregation=one(AGGREGATIONS, a.aggregation, "aggregation"),
            is_correction=one(IS_CORRECTIONS, a.is_correction, "is_correction"),
            kl=one(KL_ESTIMATORS, a.kl, "kl"),
            group_filter=one(GROUP_FILTERS, a.group_filter, "group_filter"),
            loss_masks=[LOSS_MASKS.build(n, p or {}, where=f"algorithm.loss_masks.{n}", context=ctx)
                        for n, p in a.loss_masks.items()],
            reward_shaping=[REWARD_SHAPING.build(n, p or {}, where=f"algorithm.reward_shaping.{n}", context=ctx)
                            for n, p in a.reward_shaping.items()],
            policy_masks={n: POLICY_MASKS.build(n, p or {}, where=f"algorithm.policy_masks.{n}", context=ctx)
                          for n, p in a.policy_masks.items()},
            kl_coef=a.kl_coef, kl_in_reward=a.kl_in_reward, entropy_coef=a.entropy_coef, bypass_mode=a.bypass_mode,
            local_normaliser=a.aggregation_normaliser == "local", routing_replay=a.routing_replay,
            router_aux_coef=a.router_aux_loss_coef, max_staleness=cfg.rollout.max_staleness,
            always_recompute_old_logp=cfg.trainer.recompute_old_logp == "always",
        )
        objective.self_check()
        return objective

    # ------------------------------------------------------------------------------------ what the loop asks
    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def needs_old_logp_pass(self, optimizer_steps: int) -> bool:
        """Whether old_logp must be recomputed before an update of `optimizer_steps` steps on one rollout batch
        (mini-batches × epochs).

        It need not when it can be read off the update itself: with one on-policy optimizer step, θ = θ_old in
        the only forward, so old_logp = sg(logp) exactly — unless something in `prepare` (an IS correction,
        a KL reward penalty) needs it first, or R2 Routing Replay needs the experts that pass chooses (algorithms.md
        §6). `trainer.recompute_old_logp=always` asks for the pass every step. Bypass mode never recomputes, not
        even then: old_logp := rollout_logp by its definition, so a pass would be discarded.
        """
        if self.bypass_mode:
            return False
        identity_correction = getattr(self.is_correction, "is_identity", False)
        return (self.always_recompute_old_logp or optimizer_steps > 1 or not identity_correction
                or (self.kl_in_reward and self.kl_coef > 0) or self.routing_replay == "r2")

    def shape_rewards(self, scores_B: torch.Tensor, lengths_B: torch.Tensor, truncated_B: torch.Tensor):
        rewards_B = scores_B.float()
        for shape in self.reward_shaping:
            rewards_B = shape(rewards_B, lengths_B, truncated_B)
        return rewards_B

    def keep_groups(self, correct_B: torch.Tensor, rewards_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
        return self.group_filter(correct_B, rewards_B, group_B)

    # ------------------------------------------------------------------------------------ once per rollout batch
    def prepare(self, batch: RolloutBatch, *, old_logp_BT: torch.Tensor | None = None,
                ref_logp_BT: torch.Tensor | None = None, minibatches: int = 1, epochs: int = 1,
                rng: torch.Generator | None = None) -> tuple[TrainBatch, dict[str, float]]:
        """Everything that does not depend on θ: masks, IS weights, advantages, aggregation weights.

        The rows are shuffled into `minibatches` optimizer steps, which the update takes `epochs` times over (the
        same mini-batches in the same order each pass: their aggregation weights hold in every pass).

        Metrics come back as floats of the whole batch; a min/max over no token (all masked) is left out.
        """
        if self.bypass_mode:
            old_logp_BT = batch.rollout_logp_BT
        mask_BT = batch.mask_BT
        loss_mask_BT = mask_BT.clone()
        for loss_mask in self.loss_masks:
            loss_mask_BT &= loss_mask(mask_BT, batch.truncated_B)
        metrics: dict[str, float] = {}
        if old_logp_BT is not None:
            is_weight_BT, keep_BT, is_metrics = self.is_correction(old_logp_BT, batch.rollout_logp_BT, loss_mask_BT)
            metrics.update(_prefixed("is_correction", is_metrics))
        elif getattr(self.is_correction, "is_identity", False):
            is_weight_BT, keep_BT = torch.ones_like(batch.rollout_logp_BT), torch.ones_like(mask_BT)
        else:
            raise ValueError("this objective's IS correction needs old_logp in prepare(); run the old-logp pass "
                             "(see Objective.needs_old_logp_pass)")
        advantage_mask_BT = loss_mask_BT.clone()
        loss_mask_BT &= keep_BT

        token_rewards_BT = torch.zeros_like(batch.rollout_logp_BT)
        if self.kl_in_reward and self.kl_coef > 0:
            behaviour_BT = old_logp_BT if old_logp_BT is not None else batch.rollout_logp_BT
            token_rewards_BT = -self.kl_coef * self.kl(behaviour_BT, ref_logp_BT).detach()
            metrics["kl/reward_penalty_mean"] = float(masked_mean(-token_rewards_BT, advantage_mask_BT))
        adv_BT = self.advantage(batch.rewards_B, batch.group_B, advantage_mask_BT, token_rewards_BT).detach()

        minibatch_B = _assign_minibatches(batch.group_B, minibatches, rng)
        weight_BT = torch.zeros_like(batch.rollout_logp_BT)
        for k in range(minibatches):
            rows = minibatch_B == k
            numerator_BT, denominator = self.aggregation(loss_mask_BT[rows], batch.group_B[rows])
            weight_BT[rows] = numerator_BT / denominator.clamp(min=1)

        metrics.update(self._batch_metrics(batch, adv_BT, mask_BT, loss_mask_BT))
        extras = dict(batch.extras)
        if self.draws_at_random:
            # Only then: every other objective leaves the run's random stream exactly as it was.
            draw = rng if rng is not None else torch.Generator().manual_seed(0)
            extras[SELECTION_SEED] = torch.randint(0, 2**31 - 1, (len(batch),), generator=draw)
        train = TrainBatch(
            tokens_BL=batch.tokens_BL, prompt_len_B=batch.prompt_len_B, response_ids_BT=batch.response_ids_BT,
            mask_BT=mask_BT, loss_mask_BT=loss_mask_BT, rollout_logp_BT=batch.rollout_logp_BT,
            old_logp_BT=old_logp_BT, ref_logp_BT=ref_logp_BT, adv_BT=adv_BT, is_weight_BT=is_weight_BT.detach(),
            weight_BT=weight_BT, minibatch_B=minibatch_B, group_B=batch.group_B, extras=extras,
            forward_record=batch.forward_record, context_mask_BT=batch.context_mask_BT,
            pad_id=batch.pad_id, epochs=epochs)
        return train, scalars(metrics)

    @staticmethod
    def _batch_metrics(batch: RolloutBatch, adv_BT, mask_BT, loss_mask_BT) -> dict[str, float]:
        response_tokens = int(mask_BT.sum())
        equal_group, judged_group, equal_rows_B = _equal_reward_groups(batch.rewards_B, batch.group_B)
        return {
            "advantage/mean": float(masked_mean(adv_BT, loss_mask_BT)),
            "advantage/std": float(masked_mean((adv_BT - masked_mean(adv_BT, loss_mask_BT)) ** 2, loss_mask_BT).sqrt()),
            "advantage/zero_std_group_frac": float(equal_group.sum()) / max(int(judged_group.sum()), 1),
            # Mean |A| on the rows of those groups: 0 under any group-centred advantage, |mean_g − mean_B| / std_B
            # under a batch-centred one (`batch_norm`), the whole-group push of the LitePPO paper's §8.2.2.
            "advantage/equal_reward_abs": float(masked_mean(adv_BT.abs(), loss_mask_BT & equal_rows_B[:, None])),
            "loss_mask/kept_token_frac": float(loss_mask_BT.sum()) / max(response_tokens, 1),
            "loss_mask/masked_seq_frac": float((~loss_mask_BT.any(-1) & mask_BT.any(-1)).float().mean())
            if len(batch) else 0.0,
        }

    # ------------------------------------------------------------------------------------ once per optimizer step
    def micro_batches(self, minibatch: TrainBatch, max_tokens: int, *, packed: bool = False) -> list[TrainBatch]:
        """The optimizer step's micro-batches (at most `max_tokens` padded tokens each; `packed`: real tokens, for
        a forward that packs rows without padding).

        Global normaliser (default): each keeps the step's weights, so the micro-batch losses add up exactly to
        the step loss whatever the split. `aggregation_normaliser=local` (verl's legacy actor, TRL's `bnpo`):
        each micro-batch is aggregated over its own counts and scaled by 1/#micro-batches, a mean of
        micro-batch means that differs from the step loss whenever the micro-batches' counts differ
        (algorithms.md §3, §9.7); for reproducing those frameworks, not for new runs.
        """
        micros = minibatch.micro_batches(max_tokens, packed=packed)
        if not self.local_normaliser:
            return micros
        local = []
        for micro in micros:
            numerator_BT, denominator = self.aggregation(micro.loss_mask_BT, micro.group_B)
            local.append(dataclasses.replace(micro, weight_BT=numerator_BT / denominator.clamp(min=1) / len(micros)))
        return local

    # ------------------------------------------------------------------------------------ once per micro-batch
    def loss(self, logp_BT: torch.Tensor, mb: TrainBatch, entropy_BT: torch.Tensor | None = None,
             aux_loss: torch.Tensor | None = None, loss_tokens: int | None = None) -> LossOutput:
        """This micro-batch's share of the step loss: Σ w · (c·g·ℓ + β·KL − c_H·H), plus λ_aux times the forward's
        auxiliary loss (the MoE load balancing of its tokens) weighted by the micro-batch's share of the optimizer
        step's response tokens. The policy loss and the policy masks see this micro-batch's tensors (a selection
        they make — the 80/20 quantile, the covariance tricks' top tokens — is over this micro-batch, as in verl);
        every normaliser is the optimizer step's, in `mb.weight_BT`. `loss_tokens`: the count of mb.loss_mask_BT,
        when the caller has it from the CPU-side batch (counted here otherwise, which on a GPU waits for the
        device)."""
        mask_BT = mb.loss_mask_BT
        old_logp_BT = mb.old_logp_BT if mb.old_logp_BT is not None else logp_BT.detach()
        detached_entropy_BT = entropy_BT.detach() if entropy_BT is not None else None
        policy_BT, policy_metrics = self.policy_loss(logp_BT, old_logp_BT, mb.rollout_logp_BT, mb.adv_BT, mask_BT,
                                                     **self._inputs_for(self.policy_loss, mb, logp_BT,
                                                                        detached_entropy_BT))
        token_maps = {k: v for k, v in policy_metrics.items() if k.endswith("_BT")}
        metrics = _prefixed("policy_loss", {k: v for k, v in policy_metrics.items() if not k.endswith("_BT")})
        gate_BT = None
        for name, policy_mask in self.policy_masks.items():
            gate_part_BT, mask_metrics = policy_mask(logp_BT, old_logp_BT, mb.rollout_logp_BT, mb.adv_BT, mask_BT,
                                                     detached_entropy_BT,
                                                     **self._inputs_for(policy_mask, mb, logp_BT, detached_entropy_BT))
            gate_BT = gate_part_BT.detach() if gate_BT is None else gate_BT * gate_part_BT.detach()
            metrics.update(_prefixed(f"policy_mask/{name}", mask_metrics))
        if gate_BT is not None:
            policy_BT = policy_BT * gate_BT

        w_BT = mb.weight_BT
        zero = torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
        # where(): a masked token may hold inf/NaN from a clamped ratio; 0·NaN would poison the sum
        policy_term = torch.where(w_BT != 0, w_BT * mb.is_weight_BT * policy_BT, zero).sum()
        total = policy_term
        metrics["loss/policy"] = policy_term.detach()
        if self.kl_coef > 0 and not self.kl_in_reward:
            kl_BT = self.kl(logp_BT, mb.ref_logp_BT)
            kl_term = torch.where(w_BT != 0, w_BT * kl_BT, zero).sum()
            total = total + self.kl_coef * kl_term
            metrics["loss/kl"] = kl_term.detach()
            metrics["kl/mean"] = masked_mean(kl_BT.detach(), mask_BT)
        if self.entropy_coef > 0 and entropy_BT is not None:
            entropy_term = torch.where(w_BT != 0, w_BT * entropy_BT, zero).sum()
            total = total - self.entropy_coef * entropy_term
            metrics["loss/entropy_bonus"] = entropy_term.detach()
        if self.router_aux_coef > 0 and aux_loss is not None:
            aux_term = mb.step_share * aux_loss
            total = total + self.router_aux_coef * aux_term
            metrics["loss/router_aux"] = aux_term.detach()
        metrics["loss/total"] = total.detach()
        metrics.update(is_decomposition(logp_BT.detach(), old_logp_BT, mb.rollout_logp_BT, mb.mask_BT,
                                        mb.extras.get(STALENESS), self.max_staleness))
        return LossOutput(total, {k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()},
                          token_maps, int(mask_BT.sum()) if loss_tokens is None else loss_tokens)

    def _inputs_for(self, fn: Callable, mb: TrainBatch, logp_BT: torch.Tensor,
                    entropy_BT: torch.Tensor | None) -> dict:
        """The step inputs `fn` declared (`register(inputs=...)`) that the objective supplies."""
        wanted = _inputs(fn)
        supplied = {}
        if "entropy_BT" in wanted:
            supplied["entropy_BT"] = entropy_BT
        if "generator" in wanted:
            seeds_B = mb.extras.get(SELECTION_SEED)
            # The micro-batch's rows name its seed: the same rows draw the same numbers on any rank or resume.
            seed = int(seeds_B.sum()) if seeds_B is not None else 0
            supplied["generator"] = torch.Generator(device=logp_BT.device).manual_seed(seed)
        return supplied

    # ------------------------------------------------------------------------------------ config-time check
    def self_check(self) -> None:
        """Run prepare → loss → backward on a tiny synthetic batch, so bad param values fail at load time."""
        g = torch.Generator().manual_seed(0)
        B, T = 4, 3
        mask_BT = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
        rollout_BT = -torch.rand(B, T, generator=g)
        batch = RolloutBatch(
            tokens_BL=torch.zeros(B, T + 1, dtype=torch.long), prompt_len_B=torch.ones(B, dtype=torch.long),
            response_ids_BT=torch.zeros(B, T, dtype=torch.long), mask_BT=mask_BT, rollout_logp_BT=rollout_BT,
            truncated_B=torch.tensor([False, True, False, False]), group_B=torch.tensor([0, 0, 1, 1]),
            scores_B=torch.tensor([1.0, 0.0, 1.0, 0.0]), correct_B=torch.tensor([True, False, True, False]),
            rewards_B=torch.tensor([1.0, 0.0, 1.0, 0.0]), problem_B=torch.tensor([0, 0, 1, 1]))
        batch.rewards_B = self.shape_rewards(batch.scores_B, mask_BT.sum(-1), batch.truncated_B)
        self.keep_groups(batch.correct_B, batch.rewards_B, batch.group_B)
        train, _ = self.prepare(batch, old_logp_BT=rollout_BT + 0.01, ref_logp_BT=rollout_BT - 0.01, rng=g)
        logp_BT = (rollout_BT + 0.02).requires_grad_(True)
        out = self.loss(logp_BT, train, entropy_BT=torch.rand(B, T, generator=g))
        out.loss.backward()
        if not torch.isfinite(out.loss) or not torch.isfinite(logp_BT.grad).all():
            raise ValueError("the configured objective produced a non-finite loss on a test batch; check the "
                             "algorithm params (e.g. clip bounds, caps)")


def _equal_reward_groups(rewards_B: torch.Tensor, group_B: torch.Tensor):
    """The groups whose scorable rewards are all equal (A = 0 for them under group centring), among those judged
    (≥ 2 scorable rewards): (equal, judged) per group, and per row whether its reward is scorable and in such a group.

    NaN rewards are left out, as the advantages leave them out (algorithms.md §1); min = max is exact, where a
    std of equal floats can carry rounding noise.
    """
    valid_B = ~torch.isnan(rewards_B)
    index_B, n_groups = dense_group_index(group_B)
    judged = torch.zeros(n_groups, device=rewards_B.device).index_add_(0, index_B, valid_B.float()) > 1
    lo_B, hi_B = group_min_max(rewards_B, group_B, valid_B)
    equal = judged & torch.zeros_like(judged).index_put_((index_B,), lo_B == hi_B)
    return equal, judged, equal[index_B] & valid_B


def _assign_minibatches(group_B: torch.Tensor, minibatches: int, rng: torch.Generator | None) -> torch.Tensor:
    """Shuffle whole groups into `minibatches` nearly equal parts (a group never straddles two steps)."""
    groups = torch.unique(group_B)
    if minibatches <= 1 or len(groups) == 0:
        return torch.zeros_like(group_B)
    order = groups[torch.randperm(len(groups), generator=rng)]
    part_of_group = {int(gid): i * minibatches // len(order) for i, gid in enumerate(order.tolist())}
    return torch.tensor([part_of_group[int(gid)] for gid in group_B.tolist()], dtype=torch.long)


def _inputs(fn: Callable) -> frozenset:
    return getattr(fn, "step_inputs", frozenset())


def _prefixed(axis: str, metrics: dict) -> dict:
    return {f"{axis}/{k}": v for k, v in metrics.items()}
