"""The learner: where the update and the no-grad log-prob passes run, behind one small protocol.

The trainer asks a learner for three things per step, and never how or where they are computed:

    old     ← learner.logprobs(batch)               log π_old of the rollout batch (no grad)
    ref     ← learner.reference_logprobs(batch)     log π_ref (no grad), when the objective has a KL term
    metrics ← learner.update(train)                 N optimizer steps, each Σ_micro objective.loss(micro).backward()

`InProcessLearner` runs them in this process (the policy's `PolicyForward`, one optimizer). Trainer ranks on a
Ray cluster (`literl.distributed.learner.RayLearner`) implement the same methods with FSDP2 and micro-batches
spread over the ranks; because `Objective.prepare` folds the whole step's aggregation counts into `weight_BT`,
each micro-batch's loss is a plain weighted sum and the summed gradient is the same wherever it is computed.

`weights()` is what `Engine.sync_weights` receives (the policy module here, a handle to the ranks' shards
there); `policy()` is the whole policy in this process with the current weights (what checkpoints and the final
model are written from); `state_dict()` / `load_state_dict()` carry the optimizer and scheduler in the
single-process layout, so a checkpoint of one kind of learner resumes in the other.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, NamedTuple, Protocol

import torch

from literl.algorithm.batch import RolloutBatch, TrainBatch
from literl.algorithm.metric_reduction import MetricAccumulator, read_back
from literl.model.capabilities import AUTO_TOKEN_LIMITS
from literl.algorithm.ops import masked_max, masked_mean

log = logging.getLogger(__name__)
# trainer.micro_batch_tokens=auto after a micro-batch ran out of memory: this share of the size that failed, in
# multiples of 1024 tokens, down to the smallest size `auto` gives (`capabilities.AUTO_TOKEN_LIMITS`).
OOM_BACKOFF = 0.75

Observe = Callable[[TrainBatch, dict], None]     # (micro-batch, its per-token maps) → None: mechanism diagnostics


class StepReport(NamedTuple):
    """One optimizer step's outcome, for the trainer's bookkeeping (non-finite steps in a row, weights moved)."""

    stepped: bool           # the optimizer step ran (some loss token, finite loss and gradient norm)
    non_finite: bool        # skipped: a NaN/inf loss or gradient norm would have made every weight NaN
    loss: float             # the step's loss (its micro-batches' shares summed)
    grad_norm: float        # before clipping; 0 when no token entered the loss


OnStep = Callable[[StepReport], None]


class Learner(Protocol):
    def update(self, train: TrainBatch, observe: Observe | None = None, on_step: OnStep | None = None
               ) -> dict[str, float]:
        """One rollout batch's optimizer steps; per-step metrics (loss/*, optim/*, entropy/*, policy_loss/*...).
        `observe` sees every micro-batch with its token maps, `on_step` every optimizer step's outcome (it may
        raise to stop the run)."""
        ...

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_θ(y_t) of the batch under the current weights, without autograd (the old-log-prob pass)."""
        ...

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_ref(y_t) of the batch under the frozen reference policy."""
        ...

    def take_metrics(self) -> dict[str, float]:
        """What the forwards measured since the last call (e.g. MoE route agreement)."""
        ...

    def weights(self):
        """What `Engine.sync_weights` takes to make an engine sample from the current weights."""
        ...

    def policy(self) -> torch.nn.Module:
        """The whole policy in this process, holding the current weights."""
        ...

    def state_dict(self) -> dict:
        """{"optimizer": ..., "scheduler": ...} in the single-process layout."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore the optimizer and scheduler, and take the weights `policy()` holds now (a checkpoint's)."""
        ...


def clip_gradients(params: list[torch.nn.Parameter], max_grad_norm: float) -> torch.Tensor | float:
    """Clip the gradients' global norm to `max_grad_norm` (0: no clipping) and return the norm before clipping, a
    0-dim tensor where the gradients are (`close_step` reads it, with the step's loss, in one transfer)."""
    params = [q for q in params if q.grad is not None]
    if not params:
        return 0.0
    max_norm = max_grad_norm if max_grad_norm > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` can be told to skip a step by a device flag instead of a host decision: torch's fused
    Adam and AdamW take `found_inf` (the flag `torch.amp.GradScaler` uses), skip the whole update where it is 1 and
    leave the step count as it was, so a skipped step leaves the weights and both moments exactly as before."""
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and all(
        group.get("fused") for group in optimizer.param_groups)


def step_on_device(optimizer: torch.optim.Optimizer, step_loss, grad_norm) -> None:
    """Queue an optimizer step that the device itself skips when the step's loss or gradient norm is not finite
    (`close_step`'s rule), with nothing read back; the flag is cleared afterwards, so no later step inherits it."""
    device = next((value.device for value in (step_loss, grad_norm) if torch.is_tensor(value)), "cpu")
    flag = torch.zeros((), dtype=torch.float32, device=device)
    for value in (step_loss, grad_norm):
        if torch.is_tensor(value):
            flag = torch.maximum(flag, (~torch.isfinite(value.detach())).float().to(flag.device))
        elif not math.isfinite(value):
            flag = torch.ones_like(flag)
    optimizer.found_inf = flag
    try:
        optimizer.step()
    finally:
        optimizer.found_inf = None


def phase(name: str):
    """A named range of the update in a `torch.profiler` trace (`literl/forward`, `literl/backward`, ...), so a
    profile says which part of the update the host was in while the device waited; ~1 µs when nothing profiles."""
    return torch.profiler.record_function(f"literl/{name}")


def micro_step(forward: Callable, objective, micro: TrainBatch, device: torch.device, acc: MetricAccumulator,
               minibatch: int) -> tuple[dict, torch.Tensor]:
    """Forward, loss and backward of one micro-batch, its metrics added to `acc`; returns its per-token maps and
    its (detached) loss.

    `forward(micro)` returns (logp_BT, entropy_BT, aux_loss). Shared by every learner so that the numbers of an
    update are computed by one piece of code wherever it runs. `micro` is the CPU-side batch: token counts are read
    from it, never from a device tensor, and the metrics stay on the device until the step asks for them
    (`MetricAccumulator`), so on a GPU nothing here waits for the device."""
    with phase("forward"):
        logp_BT, entropy_BT, aux_loss = forward(micro)
    loss_tokens, response_tokens = int(micro.loss_mask_BT.sum()), int(micro.mask_BT.sum())
    with phase("loss"):
        on_device = to_device(micro, device)
        out = objective.loss(logp_BT, on_device, entropy_BT, aux_loss=aux_loss, loss_tokens=loss_tokens)
    with phase("backward"):
        out.loss.backward()
    acc.add(out.metrics, weight=loss_tokens)
    acc.add({f"st/ppo_kl_mb{minibatch}": out.metrics.get("st/ppo_kl", 0.0)}, weight=loss_tokens)
    mask = on_device.mask_BT
    acc.add({"entropy/mean": masked_mean(entropy_BT.detach(), mask)}, weight=response_tokens)
    acc.add({"entropy/token_max": masked_max(entropy_BT.detach(), mask)})
    return out.token_maps, out.loss.detach().float()


def close_step(acc: MetricAccumulator, *, loss_tokens: int, step_loss, grad_norm, lr: float) -> StepReport:
    """The optimizer step's decision and metrics, after its last backward: skipped when no token entered the loss
    (the gradient is zero, but AdamW's momentum would still move the weights: algorithms.md §4.1) or when the loss
    or the gradient norm is not finite (it would make every weight NaN). The loss and the norm (numbers, or 0-dim
    tensors on the device) are read in one transfer: the one host synchronisation the decision needs."""
    tensors = read_back([value for value in (step_loss, grad_norm) if torch.is_tensor(value)])
    step_loss, grad_norm = (tensors[id(value)] if torch.is_tensor(value) else float(value)
                            for value in (step_loss, grad_norm))
    skipped = loss_tokens == 0
    non_finite = not skipped and not (math.isfinite(grad_norm) and math.isfinite(step_loss))
    acc.add({"optim/grad_norm": grad_norm, "optim/lr": lr, "optim/skipped_step": float(skipped or non_finite),
             "optim/non_finite_step": float(non_finite)})
    return StepReport(stepped=not (skipped or non_finite), non_finite=non_finite, loss=step_loss, grad_norm=grad_norm)


def optimizer_step(optimizer: torch.optim.Optimizer, scheduler, params: list[torch.nn.Parameter],
                   acc: MetricAccumulator, *, loss_tokens: int, step_loss, max_grad_norm: float,
                   before_decision: Callable[[], None] | None = None, on_decision: OnStep | None = None,
                   queue_on_device: bool = True) -> StepReport:
    """The end of one optimizer step, after its last backward, the same for every learner (this process, each
    trainer rank): clip the gradients (not when no token entered the loss), decide (`close_step`), drop a
    non-finite step's gradients, step the optimizer and the schedule. `before_decision` runs before the step's
    device values are read (the mechanism diagnostics' look at the micro-batches), `on_decision` sees the outcome
    before the weights move (it may raise to stop the run). `queue_on_device=False` always decides on the host
    first (the trainer ranks' sharded parameters)."""
    with phase("clip_and_check"):
        grad_norm = 0.0 if loss_tokens == 0 else clip_gradients(params, max_grad_norm)
    # Where the optimizer can skip a step on the device, the step is queued before anything reads a device value,
    # so the clip, the step and the reads below run back to back instead of the device waiting for the host between
    # them; the decision is read afterwards and is the same.
    queued = queue_on_device and loss_tokens > 0 and skips_on_device(optimizer)
    if queued:
        with phase("optimizer"):
            step_on_device(optimizer, step_loss, grad_norm)
    if before_decision is not None:
        with phase("observe"):
            before_decision()
    with phase("clip_and_check"):
        report = close_step(acc, loss_tokens=loss_tokens, step_loss=step_loss, grad_norm=grad_norm,
                            lr=scheduler.get_last_lr()[0])
    if report.non_finite:
        optimizer.zero_grad(set_to_none=True)
    if on_decision is not None:
        on_decision(report)
    if report.stepped:
        with phase("optimizer"):
            if not queued:
                optimizer.step()
            scheduler.step()
    return report


class InProcessLearner:
    """The update and the log-prob passes in this process, on the policy's own `PolicyForward`."""

    def __init__(self, *, policy: torch.nn.Module, policy_forward, reference, objective, optimizer, scheduler,
                 micro_batch_tokens: int | str, max_grad_norm: float, device: torch.device):
        self._policy, self.policy_forward, self.reference = policy, policy_forward, reference
        self.objective, self.optimizer, self.scheduler = objective, optimizer, scheduler
        self.micro_batch_tokens, self.max_grad_norm, self.device = micro_batch_tokens, max_grad_norm, device

    def update(self, train: TrainBatch, observe: Observe | None = None, on_step: OnStep | None = None
               ) -> dict[str, float]:
        """N optimizer steps; each accumulates its micro-batches' exact shares of the step loss. Micro-batches hold
        at most `micro_batch_tokens` padded tokens, or real tokens where the policy forward packs rows (no padding
        is computed there). Nothing in the micro-batch loop reads a device value: the loss, the metrics and the
        token maps `observe` looks at are read once the step's micro-batches are done. With
        `micro_batch_tokens="auto"`, an optimizer step whose micro-batch runs out of accelerator memory starts again
        with smaller micro-batches (`_smaller_budget`), which the rest of the run keeps."""
        acc = MetricAccumulator()
        self._policy.train()
        forward = lambda micro: self.policy_forward.logprobs(micro, with_entropy=True)  # noqa: E731
        budget = self.micro_batch_tokens if self.micro_batch_tokens != "auto" else self.policy_forward.max_tokens
        packed = self.policy_forward.packed_kernel is not None
        for k, minibatch in enumerate(train.minibatches()):
            while True:
                before = acc.snapshot()
                self.optimizer.zero_grad(set_to_none=True)
                try:
                    loss_tokens, step_loss, observed = self._accumulate(forward, minibatch, budget, packed, acc, k)
                    break
                except torch.OutOfMemoryError as err:
                    smaller = self._smaller_budget(budget, err)
                # Out of the handler, so the failed micro-batch's tensors are gone with the exception: the optimizer
                # step starts again from its first micro-batch (its gradient is their sum whatever their size).
                acc.restore(before)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                budget = smaller
            acc.end_minibatch()     # loss/* of this optimizer step are complete: steps are averaged, not summed

            def look() -> None:
                for micro, token_maps in observed:
                    observe(micro, token_maps)
            optimizer_step(self.optimizer, self.scheduler, list(self._policy.parameters()), acc,
                           loss_tokens=loss_tokens, step_loss=step_loss, max_grad_norm=self.max_grad_norm,
                           before_decision=look if observe is not None else None, on_decision=on_step)
        self._policy.eval()     # sampling and log-prob passes run without dropout
        with phase("metrics"):
            return acc.result()

    def _accumulate(self, forward, minibatch: TrainBatch, budget: int, packed: bool, acc: MetricAccumulator,
                    k: int) -> tuple[int, torch.Tensor | float, list]:
        """One optimizer step's micro-batches, forward and backward: (loss tokens, the step's loss on the device,
        each micro-batch with its token maps)."""
        loss_tokens, step_loss, observed = 0, 0.0, []
        for micro in self.objective.micro_batches(minibatch, budget, packed=packed):
            token_maps, loss = micro_step(forward, self.objective, micro, self.device, acc, k)
            loss_tokens += int(micro.loss_mask_BT.sum())
            step_loss = step_loss + loss       # on the device: one sync per step
            observed.append((micro, token_maps))
        return loss_tokens, step_loss, observed

    def _smaller_budget(self, budget: int, err: Exception) -> int:
        """The micro-batch size after one of `budget` tokens ran out of memory: with trainer.micro_batch_tokens=auto
        OOM_BACKOFF of it, kept for the rest of the run; a size the user set, or the smallest, raises with the fix."""
        smallest = AUTO_TOKEN_LIMITS[0]
        if self.micro_batch_tokens != "auto" or budget <= smallest:
            setting = self.micro_batch_tokens
            raise torch.OutOfMemoryError(
                f"a micro-batch of at most {budget} tokens ran out of accelerator memory "
                f"(trainer.micro_batch_tokens={setting}): set trainer.micro_batch_tokens lower"
                + (", or to auto (sized from the free memory, and smaller after an out-of-memory error)"
                   if setting != "auto" else ", use a smaller model or rollout batch, or free the accelerator")
                + f". {err}") from err
        smaller = max(smallest, int(budget * OOM_BACKOFF) // 1024 * 1024)
        log.warning("literl: trainer.micro_batch_tokens=auto: a micro-batch of at most %d tokens ran out of "
                    "accelerator memory; this optimizer step starts again at %d tokens, and the rest of the run "
                    "keeps that size", budget, smaller)
        self.policy_forward.lower_max_tokens(smaller)
        return smaller

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        return self.policy_forward.batch_logprobs(batch)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        if self.reference is None:
            raise ValueError("this run has no reference policy (algorithm.kl_coef is 0)")
        return self.reference.batch_logprobs(batch)

    def take_metrics(self) -> dict[str, float]:
        return self.policy_forward.take_metrics()

    def weights(self) -> torch.nn.Module:
        return self._policy

    def policy(self) -> torch.nn.Module:
        return self._policy

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch's tensors on `device`; to CUDA through pinned memory without blocking the host (a copy from
    pageable memory would first wait for everything queued on the device)."""
    if device.type == "cpu":
        return batch
    pinned = device.type == "cuda"
    return dataclasses.replace(batch, **{f.name: _moved(getattr(batch, f.name), device, pinned)
                                         for f in dataclasses.fields(batch)
                                         if torch.is_tensor(getattr(batch, f.name))})


def _moved(tensor: torch.Tensor, device: torch.device, pinned: bool) -> torch.Tensor:
    if pinned and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
