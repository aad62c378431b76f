"""The update's micro-batch loop reads no device value: metrics wait on the device until the step ends (then one
transfer), token counts come from the CPU-side batch, batches move through pinned memory. On CPU the numbers are
exactly those of reading each value at once; on CUDA a test runs the loop with torch's sync detector."""

from __future__ import annotations

import pytest
import torch

from literl.algorithm import metric_reduction
from literl.algorithm.metric_reduction import MetricAccumulator
from literl.algorithm.ops import Ratio
from literl.training.learner import to_device
from tests.training.test_metrics_accumulation import _batch, _logp, _objective


def _metrics_of_a_step(micro_tokens=12):
    obj = _objective("trainer.minibatches=2", "algorithm.is_correction.name=token_tis")
    batch = _batch(B=16, T=6)
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT + 0.01, minibatches=2,
                           rng=torch.Generator().manual_seed(0))
    acc = MetricAccumulator()
    for minibatch in train.minibatches():
        for micro in minibatch.micro_batches(micro_tokens):
            out = obj.loss(_logp(micro), micro, torch.full(micro.mask_BT.shape, 4.6),
                           loss_tokens=int(micro.loss_mask_BT.sum()))
            acc.add(out.metrics, weight=out.num_loss_tokens)
            acc.add({"entropy/token_max": out.metrics["loss/total"], "extra/ratio": Ratio(out.loss.detach(), 2.0)})
        acc.end_minibatch()
    return acc.result()


def test_metrics_read_once_per_step_equal_metrics_read_at_once(monkeypatch):
    """The same step's metrics with every tensor value treated as an accelerator's (held until the mini-batch
    closes, then read in one transfer) and read one at a time: equal to the last bit, key for key."""
    at_once = _metrics_of_a_step()
    monkeypatch.setattr(metric_reduction, "_on_accelerator", lambda value: torch.is_tensor(value))
    deferred = _metrics_of_a_step()
    assert deferred.keys() == at_once.keys() and len(at_once) > 10
    assert all(deferred[key] == at_once[key] for key in at_once), {
        key: (deferred[key], at_once[key]) for key in at_once if deferred[key] != at_once[key]}


def test_pending_metrics_settle_before_pickling_and_merging(monkeypatch):
    """A trainer rank's accumulator travels pickled: it carries plain numbers, never device tensors."""
    import pickle

    monkeypatch.setattr(metric_reduction, "_on_accelerator", lambda value: torch.is_tensor(value))
    acc = MetricAccumulator()
    acc.add({"a": torch.tensor(2.0), "loss/total": torch.tensor(0.5)}, weight=3)
    acc.add({"a": torch.tensor(4.0)}, weight=1)
    assert acc._pending
    copy = pickle.loads(pickle.dumps(acc))
    assert not copy._pending and copy.result() == {"a": (2.0 * 3 + 4.0) / 4, "loss/total": 0.5}
    other = MetricAccumulator()
    other.add({"a": torch.tensor(1.0)}, weight=4)
    acc.merge(other)
    assert acc.result()["a"] == (6.0 + 4.0 + 4.0) / 8


def test_the_loss_token_count_given_by_the_caller_is_the_counted_one():
    obj = _objective()
    batch = _batch()
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    counted = obj.loss(_logp(train), train)
    given = obj.loss(_logp(train), train, loss_tokens=int(train.loss_mask_BT.sum()))
    assert counted.num_loss_tokens == given.num_loss_tokens > 0
    assert torch.equal(counted.loss, given.loss)


def test_to_device_leaves_a_cpu_batch_as_it_is():
    obj = _objective()
    batch = _batch()
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    assert to_device(train, torch.device("cpu")) is train


@pytest.mark.gpu
def test_the_micro_batch_loop_never_waits_for_the_gpu():
    """A mixed-precision update's micro-steps on CUDA (the packed route) under torch's sync detector set to
    raise: the forward, the loss, the backward and the metric bookkeeping of each micro-batch issue no host
    synchronisation (the step's end reads the loss, the gradient norm and the metrics once)."""
    from literl.model import PolicyForward
    from literl.training.learner import micro_step
    from tests.conftest import build_tiny_qwen3

    model = build_tiny_qwen3(num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_size=256).cuda()
    forward = PolicyForward(model, compute_dtype=torch.bfloat16)
    assert forward.packed_kernel is not None
    obj = _objective("algorithm.entropy_coef=0.01")
    batch = _batch(B=16, T=6)
    train, _ = obj.prepare(batch, old_logp_BT=batch.rollout_logp_BT)
    micros = obj.micro_batches(train, 40, packed=True)
    acc = MetricAccumulator()
    run = lambda micro: forward.logprobs(micro, with_entropy=True)  # noqa: E731
    micro_step(run, obj, micros[0], torch.device("cuda"), acc, 0)      # first call: probes, allocator warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for micro in micros[1:]:
            micro_step(run, obj, micro, torch.device("cuda"), acc, 0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    acc.end_minibatch()
    assert len(micros) > 1 and all(value == value for value in acc.result().values())


@pytest.mark.parametrize("bad", ["loss", "norm", "none"])
def test_a_step_queued_with_a_device_flag_equals_the_host_decided_step(bad):
    """The optimizer step is queued before the skip decision is read (`learner.step_on_device`): fused AdamW skips
    it on the device when the step's loss or gradient norm is not finite. Weights, both moments and the step count
    equal the host-decided path's (skip, or step) to the bit: three steps of two parameters, the second one bad."""
    from literl.training.learner import skips_on_device, step_on_device

    torch.manual_seed(0)
    start = [torch.randn(4, 3), torch.randn(3)]
    device_side = [torch.nn.Parameter(t.clone()) for t in start]
    host_side = [torch.nn.Parameter(t.clone()) for t in start]
    opt_device = torch.optim.AdamW(device_side, lr=0.1, weight_decay=0.01, fused=True)
    opt_host = torch.optim.AdamW(host_side, lr=0.1, weight_decay=0.01, fused=True)
    assert skips_on_device(opt_device) and not skips_on_device(torch.optim.AdamW(start, foreach=True))
    for step in range(3):
        grads = [torch.randn_like(t) for t in start]
        loss, norm = torch.tensor(0.5), torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
        if step == 1 and bad == "loss":
            loss = torch.tensor(float("nan"))
        if step == 1 and bad == "norm":
            grads[0][0, 0], norm = float("inf"), torch.tensor(float("inf"))
        for params in (device_side, host_side):
            for p, g in zip(params, grads):
                p.grad = g.clone()
        step_on_device(opt_device, loss, norm)
        assert opt_device.found_inf is None
        if bool(torch.isfinite(loss)) and bool(torch.isfinite(norm)):
            opt_host.step()
    for p, q in zip(device_side, host_side):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_device.state[p][key], opt_host.state[q][key]), key
    assert float(opt_device.state[device_side[0]]["step"]) == (2 if bad != "none" else 3)


def test_a_non_finite_float_skips_the_step_without_a_device_value():
    """A loss or norm that is a plain number (no tensor on any device) still decides: NaN skips."""
    from literl.training.learner import step_on_device

    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.ones(2)
    step_on_device(opt, float("nan"), 1.0)
    assert torch.equal(p, torch.ones(2))
    step_on_device(opt, 0.5, 1.0)
    assert not torch.equal(p, torch.ones(2))
