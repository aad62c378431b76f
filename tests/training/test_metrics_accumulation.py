"""Per-step metrics combine exactly: over micro-batches (any split), over mini-batches (loss/* averaged, not
summed), and with micro-batches that select nothing (a max/min over no token never reaches the step)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from literl.algorithm import ops
from literl.algorithm.batch import RolloutBatch
from literl.config.load import load_config
from literl.algorithm.objective import Objective
from literl.algorithm.metric_reduction import MetricAccumulator, scalars

# ---- the accumulator on its own ------------------------------------------------------------------------------


def test_each_key_kind_reduces_by_its_rule():
    """Two micro-batches with 3 and 1 loss tokens:
    token-weighted mean (0.5·3 + 1.0·1)/4 = 0.625; max 2.0; min 0.5; loss/* sum 0.25 + 0.5 = 0.75;
    Ratio (1 + 2)/(2 + 4) = 0.5 whatever the weights; SampleSize Σw = 4, Σw² = 10, n = 2 → 16/20 = 0.8."""
    acc = MetricAccumulator()
    acc.add({"a/mean": 0.5, "a/x_max": 2.0, "a/x_min": 1.0, "loss/total": 0.25, "r": ops.Ratio(1.0, 2.0),
             "ess": ops.SampleSize(1.0, 1.0, 1.0)}, weight=3)
    acc.add({"a/mean": torch.tensor(1.0), "a/x_max": 1.0, "a/x_min": 0.5, "loss/total": 0.5,
             "r": ops.Ratio(torch.tensor(2.0), torch.tensor(4.0)), "ess": ops.SampleSize(3.0, 9.0, 1.0)}, weight=1)
    assert acc.result() == pytest.approx({"a/mean": 0.625, "a/x_max": 2.0, "a/x_min": 0.5, "loss/total": 0.75,
                                          "r": 0.5, "ess": 0.8})


def test_pooled_sums_are_read_back_together_not_one_by_one(monkeypatch):
    """Ratio and SampleSize sums that are still tensors at the end of a step (on a GPU: device tensors) are read in
    one transfer, not by a float() or .item() each (each a host synchronisation): with both forbidden on tensors
    the step's values are still Ratio (1 + 2)/(2 + 4) = 0.5 in float32 and SampleSize Σw = 4, Σw² = 10, n = 2 →
    0.8, the counts int64 as `mask.sum()` gives them."""
    acc = MetricAccumulator()
    for num, den, w in ((1.0, 2, 1.0), (2.0, 4, 3.0)):
        acc.add({"r": ops.Ratio(torch.tensor(num), torch.tensor(den)),
                 "ess": ops.SampleSize(torch.tensor(w), torch.tensor(w * w), torch.tensor(1))}, weight=1)

    def one_by_one(*args):
        raise AssertionError("a pooled sum was read on its own")

    monkeypatch.setattr(torch.Tensor, "item", one_by_one)
    monkeypatch.setattr(torch.Tensor, "__float__", one_by_one)
    assert acc.result() == {"r": 0.5, "ess": 0.8}


def test_loss_sums_within_a_minibatch_and_averages_across_minibatches():
    """Mini-batch 1: micro shares 0.25 + 0.75 = 1.0; mini-batch 2: 3.0 in one micro-batch → loss/total 2.0
    (mean of the two optimizer steps' losses, not their sum 4.0). Means and extremes ignore the boundary."""
    acc = MetricAccumulator()
    acc.add({"loss/total": 0.25, "k/mean": 1.0, "k/v_max": 1.0}, weight=1)
    acc.add({"loss/total": 0.75, "k/mean": 2.0, "k/v_max": 3.0}, weight=1)
    acc.end_minibatch()
    acc.add({"loss/total": 3.0, "k/mean": 6.0, "k/v_max": 2.0}, weight=2)
    assert acc.result() == pytest.approx({"loss/total": 2.0, "k/mean": 3.75, "k/v_max": 3.0})
    acc.end_minibatch()                           # closing the last one explicitly changes nothing
    assert acc.result()["loss/total"] == pytest.approx(2.0)


def test_without_end_minibatch_everything_is_one_optimizer_step():
    acc = MetricAccumulator()
    for share in (0.5, 0.25, 0.25):
        acc.add({"loss/policy": share})
    assert acc.result() == {"loss/policy": 1.0}


def test_empty_selections_never_reach_the_step():
    """A micro-batch with no selected token reports −inf for a max and +inf for a min (the identities); a NaN
    has nothing to compare. None of them moves the step's value; a key that only ever saw them is left out."""
    acc = MetricAccumulator()
    acc.add({"r_max": -math.inf, "r_min": math.inf, "e_max": -math.inf, "n_min": float("nan")}, weight=0)
    acc.add({"r_max": 1.5, "r_min": 0.5, "e_max": -math.inf, "n_min": 0.25}, weight=4)
    acc.add({"r_max": float("nan"), "r_min": math.inf}, weight=0)
    assert acc.result() == {"r_max": 1.5, "r_min": 0.5, "n_min": 0.25}


def test_a_mean_over_no_tokens_is_left_out_and_pooled_empties_take_their_empty_value():
    acc = MetricAccumulator()
    acc.add({"m": 0.0, "share": ops.Ratio(0.0, 0.0), "ess": ops.SampleSize(0.0, 0.0, 0.0)}, weight=0)
    assert acc.result() == {"share": 0.0, "ess": 1.0}


def test_masked_max_min_over_nothing_are_the_identities_or_the_given_value():
    x = torch.tensor([3.0, -1.0, 2.0])
    some, none = torch.tensor([True, False, True]), torch.zeros(3, dtype=torch.bool)
    assert float(ops.masked_max(x, some)) == 3.0 and float(ops.masked_min(x, some)) == 2.0
    assert float(ops.masked_max(x, none)) == -math.inf and float(ops.masked_min(x, none)) == math.inf
    assert float(ops.masked_min(x, none, empty=0.0)) == 0.0


def test_ratio_and_sample_size_hand():
    """Ratio: (1 + 3)/(2 + 2) = 1; empty → its `empty`. SampleSize of w = [1, 3]: (4)²/(2·10) = 0.8, equal to
    ops.effective_sample_size; n = 0 → 1; all-zero weights → 0."""
    assert float(ops.Ratio(1.0, 2.0) + ops.Ratio(3.0, 2.0)) == 1.0
    assert float(ops.Ratio(5.0, 0.0, empty=7.0)) == 7.0
    w, mask = torch.tensor([1.0, 3.0, 9.0]), torch.tensor([True, True, False])
    assert float(ops.pooled_ess(w, mask)) == pytest.approx(0.8) == float(ops.effective_sample_size(w, mask))
    assert float(ops.SampleSize(0.0, 0.0, 0.0)) == 1.0 and float(ops.SampleSize(0.0, 0.0, 3.0)) == 0.0


# ---- through the objective, as the trainer's `_update` drives it --------------------------------------------


def _batch(B=16, T=6, G=4, seed=0, truncated_rows=()):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T, (B,), generator=g)
    lengths[list(truncated_rows)] = T
    mask = torch.arange(T)[None] < lengths[:, None]
    prompt_len = torch.randint(1, 4, (B,), generator=g)
    tokens = torch.randint(3, 50, (B, int((prompt_len + lengths).max())), generator=g)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return RolloutBatch(
        tokens_BL=tokens, prompt_len_B=prompt_len, response_ids_BT=torch.randint(3, 50, (B, T), generator=g),
        mask_BT=mask, rollout_logp_BT=-0.01 * torch.randint(3, 50, (B, T), generator=g) * mask,
        truncated_B=lengths == T, group_B=torch.arange(B) // G, scores_B=rewards, correct_B=rewards > 0,
        rewards_B=rewards, problem_B=torch.arange(B) // G)


def _logp(b):
    """A stand-in policy: a function of the token ids, so any micro-batch recomputes its rows' values."""
    return -0.02 * b.response_ids_BT.float()


def _step_metrics(obj, train, micro_tokens, entropy=4.6):
    """What `Trainer._update` does with the metrics: add every micro-batch, close each mini-batch."""
    acc = MetricAccumulator()
    for minibatch in train.minibatches():
        for micro in minibatch.micro_batches(micro_tokens):
            out = obj.loss(_logp(micro), micro, torch.full(micro.mask_BT.shape, entropy))
            acc.add(out.metrics, weight=out.num_loss_tokens)
        acc.end_minibatch()
    return acc.result()


def _objective(*overrides):
    return Objective.from_config(load_config(overrides=["algorithm.entropy_coef=0.01", *overrides]))


@pytest.mark.filterwarnings("ignore:advantages")
def test_loss_metrics_do_not_grow_with_the_number_of_minibatches():
    """token_mean, entropy 4.6 on every token: each optimizer step's weights sum to 1, so each mini-batch's
    loss/entropy_bonus is Σ w·H = 4.6, and the step reports 4.6 with 1 or 4 mini-batches (it was 4 × 4.6).
    loss/total over 4 mini-batches is the mean of the 4 optimizer steps' losses."""
    obj = _objective("algorithm.aggregation.name=token_mean")
    batch = _batch()
    for n in (1, 4):
        train, _ = obj.prepare(batch, old_logp_BT=_logp(batch), minibatches=n, rng=torch.Generator().manual_seed(0))
        for micro_tokens in (10_000, 12, 5):
            m = _step_metrics(obj, train, micro_tokens)
            assert m["loss/entropy_bonus"] == pytest.approx(4.6, abs=1e-5), (n, micro_tokens)
        losses = [float(obj.loss(_logp(mb), mb, torch.full(mb.mask_BT.shape, 4.6)).loss) for mb in train.minibatches()]
        assert len(losses) == n
        assert m["loss/total"] == pytest.approx(sum(losses) / n, abs=1e-6)


@pytest.mark.filterwarnings("ignore:advantages")
@pytest.mark.parametrize("minibatches", [1, 2])
def test_every_step_metric_is_independent_of_the_micro_batch_split(minibatches):
    """Overlong filter (the loss mask drops truncated rows, which sort into micro-batches of their own) and
    token TIS: every metric, sequence-level diagnostics and max/min included, equals its one-micro-batch value."""
    obj = _objective("algorithm.loss_masks={overlong: {}}", "algorithm.is_correction.name=token_tis",
                     "algorithm.kl_coef=0.05", "rollout.max_new_tokens=6")
    batch = _batch(truncated_rows=(0, 5, 10))
    old = _logp(batch) + 0.05 * torch.randn(batch.mask_BT.shape, generator=torch.Generator().manual_seed(1))
    train, _ = obj.prepare(batch, old_logp_BT=old * batch.mask_BT, ref_logp_BT=_logp(batch) - 0.1,
                           minibatches=minibatches, rng=torch.Generator().manual_seed(0))
    full = _step_metrics(obj, train, 10_000)
    assert {"ti/chi2_seq", "ti/log_ppl_diff", "ti/ess", "share/ti", "policy_loss/ratio_min", "loss/kl"} <= full.keys()
    for micro_tokens in (6, 12, 30):
        split = _step_metrics(obj, train, micro_tokens)
        assert split.keys() == full.keys()
        for key in full:
            assert split[key] == pytest.approx(full[key], rel=1e-6, abs=1e-6), (micro_tokens, key)


@pytest.mark.filterwarnings("ignore:advantages")
def test_a_micro_batch_without_loss_tokens_leaves_ratio_min_and_max_alone():
    """The 6-token rows are truncated and overlong-masked; sorted by length they fill the first micro-batch,
    which has no loss token. ratio = e^0.02 on every kept token, so ratio_min = ratio_max = 1.0202 (not 0)."""
    obj = _objective("algorithm.loss_masks={overlong: {}}", "rollout.max_new_tokens=6")
    batch = _batch(B=4, G=2, truncated_rows=(0, 1))
    train, _ = obj.prepare(batch, old_logp_BT=_logp(batch) * batch.mask_BT)
    acc = MetricAccumulator()
    micros = train.micro_batches(12)
    for micro in micros:
        out = obj.loss(_logp(micro) + 0.02, micro)
        acc.add(out.metrics, weight=out.num_loss_tokens)
    assert not micros[0].loss_mask_BT.any()
    m = acc.result()
    assert m["policy_loss/ratio_min"] == pytest.approx(math.exp(0.02)) == m["policy_loss/ratio_max"]


def test_prepare_metrics_are_finite_floats_even_when_every_token_is_masked():
    """prepare's metrics are logged as they come: plain floats (a 0-dim tensor was written as null), and the
    IS weight max/min over no kept token are left out rather than logged as ±inf."""
    obj = _objective("algorithm.loss_masks={overlong: {}}", "algorithm.is_correction.name=token_tis",
                     "rollout.max_new_tokens=6")
    batch = _batch(B=4, G=2)
    for truncated in (torch.zeros(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool)):
        b = dataclasses.replace(batch, truncated_B=truncated)
        _, metrics = obj.prepare(b, old_logp_BT=b.rollout_logp_BT + 0.1 * b.mask_BT)
        assert all(type(v) is float and math.isfinite(v) for v in metrics.values()), metrics
        assert ("is_correction/weight_max" in metrics) == (not bool(truncated.all()))
        assert "is_correction/ess" in metrics


def test_scalars_matches_one_micro_batch_step():
    metrics = {"a": torch.tensor(0.5), "b_max": torch.tensor(-math.inf), "c": ops.Ratio(1.0, 4.0)}
    assert scalars(metrics) == {"a": 0.5, "c": 0.25}


def test_resumed_tensorboard_log_replaces_the_redone_steps(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from literl.run.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, ["tensorboard"], {}, run_name="r")
    for step in (1, 2, 3):
        log.log(step, {"loss/total": float(step)})
    log.close()
    log = MetricsLog(tmp_path, ["tensorboard"], {}, run_name="r")      # resumed from the step-1 checkpoint
    log.truncate_after(1)
    for step in (2, 3):
        log.log(step, {"loss/total": 10.0 * step})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/total")] == [(1, 1.0), (2, 20.0), (3, 30.0)]
