"""Observation and boundary tokens through every trick: a multi-turn batch holds context between sampled tokens
(`context_mask_BT`), and the objective must read the sampled tokens only.

The batch: four rows in two groups; S = sampled, C = context (observation or boundary), . = padding:
    row 0   S S C C S .        3 sampled
    row 1   S C S . . .        2 sampled
    row 2   S S S S . .        4 sampled
    row 3   S C C C C S        2 sampled
Its compaction drops every C and left-aligns the S (a single-turn batch of the same sampled tokens). Since context
must be absent from every statistic, each quantity of the two batches must agree: the loss, each metric (IS weights,
clip fractions, KL, entropy, GSPO/GMPO sequence ratios, the normalisers) and the gradient on each sampled token,
while the gradient on each context position is exactly 0.
"""

from __future__ import annotations

import pytest
import torch

from literl.algorithm.batch import RolloutBatch
from literl.algorithm.objective import Objective
from literl.algorithm.tricks import AGGREGATIONS, IS_CORRECTIONS, POLICY_LOSSES
from literl.config.load import load_config

PATTERN = ["SSCCS.", "SCS...", "SSSS..", "SCCCCS"]
PROMPT = 2


def _masks():
    sampled = torch.tensor([[c == "S" for c in row] for row in PATTERN])
    context = torch.tensor([[c == "C" for c in row] for row in PATTERN])
    return sampled, context


def _multiturn_batch(seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    sampled, context = _masks()
    B, T = sampled.shape
    region = sampled | context
    ids_BT = torch.randint(3, 50, (B, T), generator=g) * region
    tokens_BL = torch.zeros(B, PROMPT + T, dtype=torch.long)
    tokens_BL[:, :PROMPT] = 5
    tokens_BL[:, PROMPT:] = ids_BT
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return RolloutBatch(
        tokens_BL=tokens_BL, prompt_len_B=torch.full((B,), PROMPT), response_ids_BT=ids_BT, mask_BT=sampled,
        rollout_logp_BT=-torch.rand(B, T, generator=g) * sampled, truncated_B=torch.tensor([False, False, True, False]),
        group_B=torch.tensor([0, 0, 1, 1]), scores_B=rewards, correct_B=rewards > 0, rewards_B=rewards,
        problem_B=torch.tensor([0, 0, 1, 1]), context_mask_BT=context)


def _compact(values_BT: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """The sampled positions of each row, left-aligned, zero-padded to the longest row's count."""
    width = int(sampled.sum(-1).max())
    out = torch.zeros(values_BT.shape[0], width, dtype=values_BT.dtype)
    for b in range(values_BT.shape[0]):
        kept = values_BT[b][sampled[b]]
        out[b, :len(kept)] = kept
    return out


def _compacted(batch: RolloutBatch) -> RolloutBatch:
    sampled = batch.mask_BT
    ids = _compact(batch.response_ids_BT, sampled)
    tokens_BL = torch.zeros(len(batch), PROMPT + ids.shape[1], dtype=torch.long)
    tokens_BL[:, :PROMPT] = 5
    tokens_BL[:, PROMPT:] = ids
    return RolloutBatch(
        tokens_BL=tokens_BL, prompt_len_B=batch.prompt_len_B, response_ids_BT=ids,
        mask_BT=_compact(sampled, sampled), rollout_logp_BT=_compact(batch.rollout_logp_BT, sampled),
        truncated_B=batch.truncated_B, group_B=batch.group_B, scores_B=batch.scores_B, correct_B=batch.correct_B,
        rewards_B=batch.rewards_B, problem_B=batch.problem_B)


def _objective(*overrides) -> Objective:
    return Objective.from_config(load_config(overrides=["algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01",
                                                        "rollout.max_new_tokens=8", *overrides]))


def _inputs(seed: int, shape):
    """old, ref, current log-probs and entropies on every position (context and padding too: there they are
    garbage the objective must never read)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g) - 0.1
    return old, old - 0.1 * torch.rand(shape, generator=g), old + 0.1 * torch.randn(shape, generator=g), \
        torch.rand(shape, generator=g)


def _step(objective: Objective, batch: RolloutBatch, old, ref, logp, entropy):
    train, prepared = objective.prepare(batch, old_logp_BT=old, ref_logp_BT=ref, rng=torch.Generator().manual_seed(0))
    leaf = logp.clone().requires_grad_(True)
    out = objective.loss(leaf, train, entropy)
    out.loss.backward()
    metrics = {k: float(v) for k, v in out.metrics.items()}
    return out.loss.detach(), {**prepared, **metrics}, leaf.grad, train


def _policy_loss_overrides(name: str) -> list[str]:
    # minirl has its own TIS; the rules refuse a second IS correction with it
    return [f"algorithm.policy_loss.name={name}"] + (["algorithm.is_correction.name=none"] if name == "minirl" else [])


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_context_positions_get_exactly_zero_gradient_and_move_no_statistic_under_every_policy_loss(name):
    """Every registered policy loss: the gradient at each context position is exactly 0, and writing garbage
    (±5 nats) into old/ref/current log-probs and entropies at the context positions changes no loss, no metric
    and no sampled token's gradient, bit for bit."""
    objective = _objective(*_policy_loss_overrides(name), "algorithm.policy_masks.high_entropy.top_ratio=0.5")
    batch = _multiturn_batch()
    sampled, context = _masks()
    old, ref, logp, entropy = _inputs(1, sampled.shape)
    loss, metrics, grad, train = _step(objective, batch, old, ref, logp, entropy)
    assert (grad[context] == 0).all()
    assert (train.weight_BT[context] == 0).all() and not train.loss_mask_BT[context].any()

    noise = 5 * torch.randn(sampled.shape, generator=torch.Generator().manual_seed(9)) * context
    loss2, metrics2, grad2, _ = _step(objective, batch, old + noise, ref - noise, logp + noise, entropy + noise.abs())
    assert torch.equal(loss, loss2)
    assert metrics == metrics2
    assert torch.equal(grad, grad2)


DRAWS_AT_RANDOM = {"clip_cov", "kl_cov"}    # their random picks depend on the batch's width: checked above only


@pytest.mark.parametrize("is_correction", IS_CORRECTIONS.names())
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
@pytest.mark.parametrize("name", sorted(set(POLICY_LOSSES.names()) - DRAWS_AT_RANDOM))
def test_a_batch_with_context_trains_as_its_compaction_of_sampled_tokens(name, aggregation, is_correction):
    """The same sampled tokens with and without the context between them: equal loss, metrics (IS weights and
    their diagnostics, clip fractions, KL, entropy, GSPO/GMPO sequence ratios, normalisers) and per-token gradient.
    The overlong loss mask is on (row 2 is truncated) and the 80/20 entropy mask picks the top half of tokens."""
    if name == "minirl" and is_correction != "none":
        pytest.skip("the rules refuse minirl with a second IS correction")
    objective = _objective(f"algorithm.policy_loss.name={name}", f"algorithm.aggregation.name={aggregation}",
                           f"algorithm.is_correction.name={is_correction}", "algorithm.loss_masks.overlong={}",
                           "algorithm.policy_masks.high_entropy.top_ratio=0.5")
    batch = _multiturn_batch()
    sampled, context = _masks()
    old, ref, logp, entropy = _inputs(2, sampled.shape)
    loss, metrics, grad, _ = _step(objective, batch, old, ref, logp, entropy)
    c = lambda x: _compact(x, sampled)  # noqa: E731
    loss_c, metrics_c, grad_c, _ = _step(objective, _compacted(batch), c(old), c(ref), c(logp), c(entropy))
    torch.testing.assert_close(loss, loss_c, rtol=1e-6, atol=1e-7)
    assert metrics.keys() == metrics_c.keys()
    for key in metrics:
        assert metrics[key] == pytest.approx(metrics_c[key], rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(c(grad), grad_c, rtol=1e-5, atol=1e-7)
    assert (grad[context] == 0).all()


def test_the_token_mean_normaliser_counts_sampled_tokens_only():
    """token_mean over 3 + 2 + 4 + 2 = 11 sampled tokens: every sampled token weighs 1/11 (not 1/17, which the 6
    context tokens would make it), every context token 0. seq_mean_token_mean: row b's tokens weigh 1/(4·n_b):
    1/12, 1/8, 1/16, 1/8."""
    batch = _multiturn_batch()
    sampled, context = _masks()
    train, _ = _objective("algorithm.aggregation.name=token_mean").prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    assert torch.equal(train.weight_BT[sampled], torch.full((11,), 1 / 11))
    assert (train.weight_BT[context] == 0).all()
    train, _ = _objective("algorithm.aggregation.name=seq_mean_token_mean").prepare(
        batch, old_logp_BT=batch.rollout_logp_BT)
    for b, n in enumerate([3, 2, 4, 2]):
        assert torch.equal(train.weight_BT[b][sampled[b]], torch.full((n,), 1 / (4 * n)))


def test_lengths_trimming_and_micro_batches_count_the_context_as_forward_input():
    """The forward reads the whole region: lengths_B = prompt 2 + region 5, 3, 4, 6 = [7, 5, 6, 8]; trimming keeps the
    6 response columns row 3 needs (its last token sits after 4 context tokens) and num_tokens counts the 11
    sampled tokens only."""
    batch = _multiturn_batch()
    assert batch.lengths_B.tolist() == [7, 5, 6, 8]
    assert batch.num_tokens == 11
    train, _ = _objective().prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    micros = train.micro_batches(16)
    assert sum(m.num_tokens for m in micros) == 11
    for micro in micros:
        widest = int(micro.forward_mask_BT.sum(-1).max())
        assert micro.mask_BT.shape[1] == widest and micro.context_mask_BT.shape[1] == widest
    assert sum(m.step_share for m in micros) == pytest.approx(1.0)
