"""The composer: exact micro-batch invariance of the whole objective, and each term against its formula."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from literl.algorithm.batch import RolloutBatch
from literl.config.load import load_config
from literl.algorithm.objective import Objective
from literl.algorithm.tricks import AGGREGATIONS


def _batch(B=8, T=6, G=4, seed=0, empty_row=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lengths[-1] = 0
    mask = torch.arange(T)[None] < lengths[:, None]
    prompt_len = torch.randint(1, 4, (B,), generator=g)
    L = int((prompt_len + lengths).max())
    tokens = torch.randint(3, 50, (B, L), generator=g)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return RolloutBatch(
        tokens_BL=tokens, prompt_len_B=prompt_len, response_ids_BT=torch.randint(3, 50, (B, T), generator=g),
        mask_BT=mask, rollout_logp_BT=-torch.rand(B, T, generator=g) * mask,
        truncated_B=lengths == T, group_B=torch.arange(B) // G, scores_B=rewards, correct_B=rewards > 0,
        rewards_B=rewards, problem_B=torch.arange(B) // G)


def _objective(*overrides):
    return Objective.from_config(load_config(overrides=list(overrides)))


ROW_LOCAL = {                       # tricks whose every quantity is per token or per row: exact under any split
    "ppo_clip": [], "cispo": ["algorithm.policy_loss.name=cispo"], "gspo": ["algorithm.policy_loss.name=gspo"],
    "minirl": ["algorithm.policy_loss.name=minirl"], "gmpo": ["algorithm.policy_loss.name=gmpo"],
    "sapo": ["algorithm.policy_loss.name=sapo"],
    "opsm": ["algorithm.policy_masks.opsm.delta=0.02"],          # masks about a third of the negative rows
    "sapo+opsm": ["algorithm.policy_loss.name=sapo", "algorithm.policy_masks.opsm.delta=0.02"],
}


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
@pytest.mark.parametrize("loss", sorted(ROW_LOCAL))
def test_micro_batches_sum_to_the_full_step_loss_and_gradient(aggregation, loss):
    """For every aggregation mode: Σ over uneven micro-batches of objective.loss = full-batch loss, same grads."""
    obj = _objective(f"algorithm.aggregation.name={aggregation}", *ROW_LOCAL[loss],
                     "algorithm.entropy_coef=0.01", "algorithm.kl_coef=0.05")
    batch = _batch()
    old = batch.rollout_logp_BT + 0.05 * torch.randn(batch.rollout_logp_BT.shape, generator=torch.Generator().manual_seed(1))
    ref = batch.rollout_logp_BT - 0.1
    train, _ = obj.prepare(batch, old_logp_BT=old, ref_logp_BT=ref)
    base_logp = (old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2))).detach()
    entropy = torch.rand(old.shape, generator=torch.Generator().manual_seed(3))

    full_logp = base_logp.clone().requires_grad_(True)
    full = obj.loss(full_logp, train, entropy)
    full.loss.backward()

    split_logp = base_logp.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 5], [1, 2, 3], [4], [6, 7]):          # uneven micro-batches of uneven lengths
        micro = train.select(torch.tensor(rows))
        part = obj.loss(split_logp[rows], micro, entropy[rows])
        part.loss.backward()
        total = total + part.loss.detach()
    torch.testing.assert_close(total, full.loss.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(split_logp.grad, full_logp.grad, rtol=1e-6, atol=1e-7)


def test_micro_batches_from_trainbatch_split_are_exact():
    """The trainer's own split (sorted by length, trimmed) gives the same step loss.
    log-probs are a function of the token ids, so each micro-batch can recompute its own."""
    obj = _objective("algorithm.aggregation.name=token_mean")
    batch = _batch(B=12, T=7, G=3)
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)

    def logp_of(b):
        return -0.01 * b.response_ids_BT.float()

    full = obj.loss(logp_of(train), train).loss
    micros = train.micro_batches(max_tokens=20)
    assert len(micros) > 2
    total = sum(obj.loss(logp_of(m), m).loss for m in micros)
    torch.testing.assert_close(total, full, rtol=1e-6, atol=1e-7)


def test_token_mean_weights_sum_to_one_per_minibatch_and_groups_stay_whole():
    obj = _objective("algorithm.aggregation.name=token_mean")
    batch = _batch(B=16, T=5, G=4, empty_row=False)
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT, minibatches=2,
                           rng=torch.Generator().manual_seed(0))
    for mb in train.minibatches():
        assert float(mb.weight_BT.sum()) == pytest.approx(1.0)
        assert len(mb) == 8
    for gid in torch.unique(train.group_B if hasattr(train, "group_B") else batch.group_B):
        assert len(torch.unique(train.minibatch_B[batch.group_B == gid])) == 1


def test_epochs_take_the_same_minibatches_again_numbered_by_optimizer_step():
    """16 rows in 4 groups, 2 mini-batches, 3 epochs: 6 optimizer steps, in the order (pass, mini-batch) =
    (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1); pass e's k-th step holds the rows and weights of pass 0's k-th
    and is numbered e·2 + k, so per-mini-batch metrics follow the drift through all six."""
    obj = _objective("algorithm.aggregation.name=token_mean")
    batch = _batch(B=16, T=5, G=4, empty_row=False)
    once, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT, minibatches=2,
                          rng=torch.Generator().manual_seed(0))
    thrice, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT, minibatches=2, epochs=3,
                            rng=torch.Generator().manual_seed(0))
    first = once.minibatches()
    steps = thrice.minibatches()
    assert len(first) == 2 and len(steps) == 6
    for index, step in enumerate(steps):
        same = first[index % 2]
        assert torch.equal(step.tokens_BL, same.tokens_BL) and torch.equal(step.weight_BT, same.weight_BT)
        assert step.minibatch_B.tolist() == [index] * 8
        assert float(step.weight_BT.sum()) == pytest.approx(1.0)
    assert thrice.select(torch.arange(8)).epochs == 3 and thrice.trimmed().epochs == 3   # a scalar, kept whole


def test_entropy_bonus_and_kl_loss_terms_match_their_formulas():
    """Two tokens of one sequence, token_mean (w = 1/2 each), A = 0 so the policy term is 0:
    KL k1 per token = logp − ref = [0.2, −0.4] → β·Σw·kl = 0.5·0.5·(0.2 − 0.4) = −0.05;
    entropy [1, 3] → −c·Σw·H = −0.1·2 = −0.2.  Total −0.25."""
    obj = _objective("algorithm.aggregation.name=token_mean", "algorithm.kl.name=k1", "algorithm.kl_coef=0.5",
                     "algorithm.entropy_coef=0.1", "algorithm.advantage.name=dr_grpo")
    batch = RolloutBatch(
        tokens_BL=torch.zeros(1, 3, dtype=torch.long), prompt_len_B=torch.tensor([1]),
        response_ids_BT=torch.zeros(1, 2, dtype=torch.long), mask_BT=torch.tensor([[True, True]]),
        rollout_logp_BT=torch.tensor([[-1.0, -1.0]]), truncated_B=torch.tensor([False]), group_B=torch.tensor([0]),
        scores_B=torch.tensor([1.0]), correct_B=torch.tensor([True]), rewards_B=torch.tensor([1.0]),
        problem_B=torch.tensor([0]))
    logp = torch.tensor([[-1.0, -1.0]])
    train, _ = obj.prepare(batch, old_logp_BT=logp, ref_logp_BT=torch.tensor([[-1.2, -0.6]]))
    out = obj.loss(logp.clone().requires_grad_(True), train, torch.tensor([[1.0, 3.0]]))
    assert float(out.loss.detach()) == pytest.approx(-0.25, abs=1e-6)
    assert float(out.metrics["loss/kl"]) == pytest.approx(-0.1, abs=1e-6)


def test_old_logp_pass_is_skipped_only_when_exact():
    assert not _objective().needs_old_logp_pass(1)
    assert _objective().needs_old_logp_pass(2)
    assert _objective("algorithm.is_correction.name=token_tis").needs_old_logp_pass(1)
    assert not _objective("algorithm.bypass_mode=true").needs_old_logp_pass(4)
    assert load_config(preset="reinforce_pp") and Objective.from_config(
        load_config(preset="reinforce_pp")).needs_old_logp_pass(1)


def test_recompute_old_logp_always_asks_for_the_pass_the_objective_could_skip():
    """One on-policy optimizer step with no IS correction: auto skips the pass (old_logp = sg(logp) is exact), always
    asks for it; bypass mode never runs it (old_logp is the rollout's by definition), not even with always."""
    assert not _objective("trainer.recompute_old_logp=auto").needs_old_logp_pass(1)
    assert _objective("trainer.recompute_old_logp=always").needs_old_logp_pass(1)
    assert not _objective("trainer.recompute_old_logp=always", "algorithm.bypass_mode=true").needs_old_logp_pass(1)


def test_bypass_mode_uses_rollout_logp_as_old():
    obj = _objective("algorithm.bypass_mode=true")
    batch = _batch()
    train, _ = obj.prepare(batch)
    assert torch.equal(train.old_logp_BT, batch.rollout_logp_BT)


def test_overlong_mask_removes_truncated_rows_from_loss_and_denominator():
    obj = _objective("algorithm.loss_masks={overlong: {}}", "algorithm.aggregation.name=token_mean")
    batch = _batch(empty_row=False)
    train, metrics = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    assert not train.loss_mask_BT[batch.truncated_B].any()
    kept = batch.mask_BT & ~batch.truncated_B[:, None]
    torch.testing.assert_close(train.weight_BT, kept.float() / kept.sum())
    assert metrics["loss_mask/kept_token_frac"] == pytest.approx(float(kept.sum() / batch.mask_BT.sum()))


def test_metrics_carry_axis_prefixes_and_token_maps_are_separate():
    obj = _objective("algorithm.is_correction.name=token_tis")
    batch = _batch()
    train, prep = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT + 0.3)
    assert any(k.startswith("is_correction/") for k in prep) and "advantage/mean" in prep
    out = obj.loss(batch.rollout_logp_BT.clone().requires_grad_(True), train)
    assert "policy_loss/clipfrac_binding_high" in out.metrics
    assert "clipped_high_BT" in out.token_maps and not any(k.endswith("_BT") for k in out.metrics)


def test_fully_masked_step_gives_zero_loss_not_nan():
    obj = _objective("algorithm.loss_masks={overlong: {}}")
    batch = _batch(empty_row=False)
    batch = dataclasses.replace(batch, truncated_B=torch.ones_like(batch.truncated_B))
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    logp = batch.rollout_logp_BT.clone().requires_grad_(True)
    out = obj.loss(logp, train)
    out.loss.backward()
    assert float(out.loss) == 0.0 and torch.isfinite(logp.grad).all()


def test_zero_std_group_frac_leaves_nan_rewards_out():
    """Groups (ids 0..3): [1, 1, NaN] → scorable [1, 1], zero std; [0, 1, NaN] → not; [NaN, 0.5, NaN] → one
    scorable reward, not judged; [0.1, 0.1, 0.1] → zero std (min = max, no rounding noise). 2 of 3 judged → 2/3."""
    nan = float("nan")
    rewards = torch.tensor([1, 1, nan, 0, 1, nan, nan, 0.5, nan, 0.1, 0.1, 0.1])
    batch = dataclasses.replace(_batch(B=12, G=3, empty_row=False), rewards_B=rewards)
    with pytest.warns(UserWarning, match="single valid member"):
        _, metrics = _objective().prepare(batch)
    assert metrics["advantage/zero_std_group_frac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("advantage, expected", [("grpo", 0.0), ("dr_grpo", 0.0), ("lite_ppo", 0.0),
                                                 ("batch_norm", 0.5)])
def test_equal_reward_groups_carry_advantage_only_under_a_batch_mean(advantage, expected):
    """Groups [1, 1] (equal rewards) and [0, 1]. Group-centred advantages give the first group 0. Batch
    normalisation: mean_B = 0.75, std_B (unbiased) = sqrt((3 · 0.25² + 0.75²) / 3) = sqrt(0.25) = 0.5, so both of
    its responses get (1 − 0.75) / 0.5 = 0.5 on every token: mean |A| there 0.5 (eps 1e-6 moves the 7th digit)."""
    batch = dataclasses.replace(_batch(B=4, G=2, empty_row=False), rewards_B=torch.tensor([1.0, 1.0, 0.0, 1.0]))
    _, metrics = _objective(f"algorithm.advantage.name={advantage}").prepare(batch)
    assert metrics["advantage/equal_reward_abs"] == pytest.approx(expected, abs=1e-5)


def test_equal_reward_abs_advantage_is_zero_without_equal_groups():
    """No group of equal rewards selects no token: the metric is 0, not NaN."""
    batch = dataclasses.replace(_batch(B=4, G=2, empty_row=False), rewards_B=torch.tensor([0.0, 1.0, 1.0, 0.0]))
    _, metrics = _objective("algorithm.advantage.name=batch_norm").prepare(batch)
    assert metrics["advantage/equal_reward_abs"] == 0.0


def _two_rows(lengths=(1, 3), T=3):
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    B = len(lengths)
    return RolloutBatch(
        tokens_BL=torch.full((B, 1 + T), 5), prompt_len_B=torch.ones(B, dtype=torch.long),
        response_ids_BT=torch.full((B, T), 7), mask_BT=mask, rollout_logp_BT=-0.5 * mask.float(),
        truncated_B=torch.zeros(B, dtype=torch.bool), group_B=torch.arange(B), scores_B=torch.zeros(B),
        correct_B=torch.zeros(B, dtype=torch.bool), rewards_B=torch.zeros(B), problem_B=torch.arange(B))


def test_local_normaliser_is_the_mean_of_micro_batch_means():
    """algorithms.md §9.7: rows of 1 and 3 tokens in micro-batches of one row each. token_mean, global: every
    token 1/4. Local (verl legacy): each micro-batch's own token mean ÷ 2 micro-batches → 1/2 for the lone
    token, 1/6 for each of the other three. With one sequence per micro-batch seq_mean_token_mean is the same
    either way (1/2 · 1/|y_i|)."""
    expected = {("token_mean", "global"): [[1 / 4, 0, 0], [1 / 4, 1 / 4, 1 / 4]],
                ("token_mean", "local"): [[1 / 2, 0, 0], [1 / 6, 1 / 6, 1 / 6]],
                ("seq_mean_token_mean", "global"): [[1 / 2, 0, 0], [1 / 6, 1 / 6, 1 / 6]],
                ("seq_mean_token_mean", "local"): [[1 / 2, 0, 0], [1 / 6, 1 / 6, 1 / 6]]}
    for (aggregation, normaliser), weights in expected.items():
        obj = _objective(f"algorithm.aggregation.name={aggregation}",
                         f"algorithm.aggregation_normaliser={normaliser}")
        train, _ = obj.prepare(_two_rows())
        micros = obj.micro_batches(train, max_tokens=3)
        assert [len(m) for m in micros] == [1, 1]           # longest row first
        got = {int(m.group_B[0]): m.weight_BT[0].tolist() + [0.0] * (3 - m.weight_BT.shape[1]) for m in micros}
        torch.testing.assert_close(torch.tensor([got[0], got[1]]), torch.tensor(weights), msg=str((aggregation,
                                                                                                  normaliser)))


def test_local_normaliser_equals_global_when_micro_batches_hold_equal_counts():
    for normaliser in ("global", "local"):
        obj = _objective("algorithm.aggregation.name=token_mean", f"algorithm.aggregation_normaliser={normaliser}")
        train, _ = obj.prepare(_two_rows(lengths=(2, 2)))
        micros = obj.micro_batches(train, max_tokens=2)
        assert len(micros) == 2
        assert all(torch.allclose(m.weight_BT[m.loss_mask_BT], torch.tensor(0.25)) for m in micros)


# ---- the newer tricks through the objective (newer-losses.md; algorithms.md §10) ---------------------------------

def _step(obj, batch, seed=1):
    """prepare() with a perturbed old policy, and the current log-probs and entropies of a step (no grad yet)."""
    g = torch.Generator().manual_seed(seed)
    old = batch.rollout_logp_BT + 0.05 * torch.randn(batch.rollout_logp_BT.shape, generator=g)
    train, _ = obj.prepare(batch, old_logp_BT=old, rng=torch.Generator().manual_seed(7))
    logp = (old + 0.3 * torch.randn(old.shape, generator=g)).detach()
    entropy = torch.rand(old.shape, generator=g) * 2
    return train, logp, entropy


SELECTING = {
    "clip_cov": ["algorithm.policy_loss.name=clip_cov", "algorithm.policy_loss.params.clip_cov_lb=-100",
                 "algorithm.policy_loss.params.clip_cov_ub=100", "algorithm.policy_loss.params.clip_cov_ratio=0.2"],
    "kl_cov": ["algorithm.policy_loss.name=kl_cov", "algorithm.policy_loss.params.kl_cov_ratio=0.2"],
    "high_entropy": ["algorithm.policy_masks.high_entropy.top_ratio=0.2"],
}


@pytest.mark.parametrize("trick", sorted(SELECTING))
def test_selecting_tricks_select_within_each_micro_batch_and_normalise_by_the_step(trick):
    """Clip-Cov, KL-Cov and the 80/20 mask select over the tensors passed, i.e. each micro-batch (verl, the authors'
    code; newer-losses.md §4–6). Their normaliser is still the optimizer step's: a micro-batch's share equals the
    trick applied to that micro-batch ALONE (its own prepare, so its own selection), token_mean over its N_mb
    tokens, scaled by N_mb / N_step (a local normaliser would miss that factor)."""
    obj = _objective("algorithm.aggregation.name=token_mean", *SELECTING[trick])
    batch = _batch(B=8, T=6, G=2)
    train, logp, entropy = _step(obj, batch)
    n_step = int(train.loss_mask_BT.sum())
    for rows in ([0, 5], [1, 2, 3], [4, 6, 7]):
        micro = train.select(torch.tensor(rows))
        alone = dataclasses.replace(micro, weight_BT=micro.loss_mask_BT.float() / micro.loss_mask_BT.sum())
        share = obj.loss(logp[rows], micro, entropy[rows]).loss
        torch.testing.assert_close(share, obj.loss(logp[rows], alone, entropy[rows]).loss
                                   * micro.loss_mask_BT.sum() / n_step, rtol=1e-6, atol=1e-7)


def test_policy_masks_scale_only_the_policy_term_and_report_metrics():
    """OPSM with δ = −1 masks every negative-advantage row. The KL and entropy terms and every weight are those
    of the unmasked objective; the policy term keeps only the rows with A ≥ 0."""
    base = ["algorithm.aggregation.name=token_mean", "algorithm.kl_coef=0.1", "algorithm.entropy_coef=0.01"]
    plain, masked = _objective(*base), _objective(*base, "algorithm.policy_masks.opsm.delta=0")
    batch = _batch()
    train, logp, entropy = _step(plain, batch)
    ref = batch.rollout_logp_BT - 0.1
    train_p, _ = plain.prepare(batch, old_logp_BT=train.old_logp_BT, ref_logp_BT=ref)
    train_m, _ = masked.prepare(batch, old_logp_BT=train.old_logp_BT, ref_logp_BT=ref)
    assert torch.equal(train_p.weight_BT, train_m.weight_BT)
    rollout = batch.rollout_logp_BT.clone()
    rollout[train.adv_BT < 0] = 5.0                 # μ far above π_θ: D > 0 on the negative rows
    train_m = dataclasses.replace(train_m, rollout_logp_BT=rollout)
    train_p = dataclasses.replace(train_p, rollout_logp_BT=rollout)
    out_p, out_m = plain.loss(logp, train_p, entropy), masked.loss(logp, train_m, entropy)
    assert out_p.metrics["loss/kl"] == out_m.metrics["loss/kl"]
    assert out_p.metrics["loss/entropy_bonus"] == out_m.metrics["loss/entropy_bonus"]
    negative_B = (train.adv_BT < 0).any(-1)
    assert negative_B.any() and float(out_m.metrics["policy_mask/opsm/masked_seq_frac"]) == pytest.approx(
        float(negative_B.sum()) / float(batch.mask_BT.any(-1).sum()))
    kept = dataclasses.replace(train_p, weight_BT=torch.where(negative_B[:, None], 0.0, train_p.weight_BT))
    torch.testing.assert_close(out_m.metrics["loss/policy"], plain.loss(logp, kept, entropy).metrics["loss/policy"])


def test_the_entropy_mask_reads_the_entropies_the_objective_is_given():
    """The 80/20 mask keeps the tokens of highest update-forward entropy: raising one token's entropy above all
    others puts it in the kept set, and the kept tokens' mean entropy is above the mean of all."""
    obj = _objective("algorithm.policy_masks.high_entropy.top_ratio=0.1")
    batch = _batch()
    train, logp, entropy = _step(obj, batch)
    entropy[2, 0] = 50.0
    out = obj.loss(logp, train, entropy)
    kept_mean = float(out.metrics["policy_mask/high_entropy/entropy_kept_mean"])
    assert kept_mean >= 50.0 / 4 and kept_mean > float(out.metrics["policy_mask/high_entropy/entropy_all_mean"])
    with pytest.raises(ValueError, match="entropies"):
        obj.loss(logp, train)


def test_clip_cov_draws_from_seeds_of_the_run_and_leaves_other_runs_streams_alone():
    """prepare() gives every row a seed from the run's generator (only when a trick draws at random); a micro-batch
    seeds its draw from its rows' seeds. The same run seed selects the same tokens, another seed other tokens;
    an objective that draws nothing does not touch the run's generator."""
    wide = ["algorithm.policy_loss.name=clip_cov", "algorithm.policy_loss.params.clip_cov_lb=-100",
            "algorithm.policy_loss.params.clip_cov_ub=100", "algorithm.policy_loss.params.clip_cov_ratio=0.3"]
    obj = _objective("algorithm.aggregation.name=token_mean", *wide)
    batch = _batch(B=8, T=6, G=2)

    def selected(seed):
        train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT, rng=torch.Generator().manual_seed(seed))
        logp = batch.rollout_logp_BT - 0.1 * batch.response_ids_BT / 50
        return obj.loss(logp, train).token_maps["cov_detached_BT"]

    first, again, other = selected(3), selected(3), selected(4)
    assert first.any() and torch.equal(first, again) and not torch.equal(first, other)
    rng = torch.Generator().manual_seed(5)
    state = rng.get_state()
    _objective().prepare(batch, old_logp_BT=batch.rollout_logp_BT, rng=rng)
    assert torch.equal(rng.get_state(), state)
