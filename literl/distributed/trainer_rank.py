"""One trainer rank: a Ray actor holding an FSDP2 shard of the policy, its optimizer shard and the objective.

The ranks form one `torch.distributed` group (gloo on CPU, NCCL on GPU). The policy is wrapped whole in one
FSDP2 unit (`_PolicyLogprobs`), whose forward is `PolicyForward.logprobs`: the unit's pre-forward all-gathers the
parameters, literl's runtime then runs its usual path on whole tensors (the hand-applied layers, the chunked
head), and the post-backward reduce-scatters the gradients. Outside a forward every rank holds 1/world of the
parameters, of the gradients and of AdamW's state. (A unit per decoder layer would also shard the parameters
during the forward, but the runtime applies the layers by hand, so their modules' FSDP hooks would never run:
see docs/scaling.md.)

Exactness. Each optimizer step's micro-batches are spread round-robin over the ranks; every micro-batch loss is a
plain weighted sum whose weights `Objective.prepare` normalised over the whole step, so the step's gradient is
the sum of the micro-batch gradients wherever they were computed. FSDP2 divides reduced gradients by the world
size by default (a mean over data-parallel ranks): here the divide factor is 1, a plain sum (algorithms.md §3).
Every rank runs the same number of forward/backward rounds (a collective each); a rank with no micro-batch left
in a round runs a zero-weight copy of one, whose gradient is exactly zero.
"""

from __future__ import annotations

import dataclasses
import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from literl.distributed import weight_sync
from literl.distributed.cluster import free_port, node_address
from literl.algorithm.metric_reduction import MetricAccumulator
from literl.model import PolicyForward
from literl.model.capabilities import cluster_micro_batch_tokens
from literl.model.precision import MASTER_DTYPE, compute_dtype
from literl.algorithm.objective import Objective
from literl.training.forwards import policy_forward, reference_forward
from literl.training.learner import micro_step, optimizer_step, to_device
from literl.training.optim import build_optimizer

TRAINER_TIMEOUT = timedelta(minutes=10)


class _PolicyLogprobs(torch.nn.Module):
    """The FSDP2 unit: the policy as a submodule, its forward the policy forward's log-probs of a micro-batch."""

    def __init__(self, policy: torch.nn.Module, policy_forward: PolicyForward):
        super().__init__()
        self.policy = policy
        self._forward = policy_forward

    def forward(self, micro):
        return tuple(self._forward.logprobs(micro, with_entropy=True))


class TrainerRank:
    def __init__(self, rank: int, world: int, cfg, threads: int):
        torch.set_num_threads(threads)
        self.rank, self.world, self.cfg = rank, world, cfg
        self.device = torch.device("cuda" if cfg.cluster.gpus_per_worker > 0 and torch.cuda.is_available()
                                   else "cpu")
        self._sync_group = None

    def pid(self) -> int:
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """Where the ranks meet (asked of rank 0)."""
        return node_address(), free_port()

    def setup(self, host: str, port: int, policy: torch.nn.Module, reference: torch.nn.Module | None) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        cfg = self.cfg
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world,
                                timeout=TRAINER_TIMEOUT)
        mesh = init_device_mesh(self.device.type, (self.world,))
        torch.manual_seed(cfg.seed)
        self.objective = Objective.from_config(cfg)
        # Mixed precision as in one process (literl/model/precision.py): float32 shards of the master weights,
        # gradients and AdamW state, the forward under autocast, so the reduce-scatter sums float32 gradients.
        self.policy = policy.to(device=self.device, dtype=MASTER_DTYPE)
        compute = compute_dtype(cfg.model.dtype)
        self.micro_batch_tokens = cluster_micro_batch_tokens(cfg.trainer.micro_batch_tokens)
        self.policy_forward = policy_forward(cfg, self.policy, max_tokens=self.micro_batch_tokens)
        self.unit = _shard(_PolicyLogprobs(self.policy, self.policy_forward), mesh, fully_shard)
        self.optimizer, self.scheduler = build_optimizer(cfg, self.policy)
        self.reference_forward = self.reference_unit = None
        if reference is not None:
            reference = reference.to(device=self.device, dtype=compute).eval().requires_grad_(False)
            self.reference_forward = reference_forward(cfg, reference, max_tokens=self.micro_batch_tokens)
            self.reference_unit = _shard(_PolicyLogprobs(reference, self.reference_forward), mesh, fully_shard)
        self.policy.eval()

    # ------------------------------------------------------------------------------------------ the update
    def update(self, train) -> tuple[list[MetricAccumulator], list[dict], dict, list]:
        """This rank's share of the rollout batch's optimizer steps: one metric accumulator per mini-batch (rank
        0's also holds the optim/* values, which every rank computes alike), the token maps of its micro-batches
        in order, the policy forward's counts, and each optimizer step's `StepReport`."""
        accs, token_maps, reports = [], [], []
        self.policy.train()
        forward = self.unit
        for k, minibatch in enumerate(train.minibatches()):
            acc = MetricAccumulator()
            self.optimizer.zero_grad(set_to_none=True)
            micros = self.objective.micro_batches(minibatch, self.micro_batch_tokens)
            mine = micros[self.rank::self.world]
            rounds = math.ceil(len(micros) / self.world)
            step_loss = torch.zeros((), device=self.device)
            for i in range(rounds):
                last = i == rounds - 1
                # Gradients are reduced once per optimizer step, after its last round.
                self.unit.set_requires_gradient_sync(last)
                self.unit.set_reshard_after_backward(last)
                if i < len(mine):
                    maps, loss = micro_step(forward, self.objective, mine[i], self.device, acc, k)
                    token_maps.append(maps)
                    step_loss = step_loss + loss
                else:
                    idle = _zero_weight(micros[0])
                    logp_BT, entropy_BT, aux_loss = forward(idle)
                    self.objective.loss(logp_BT, to_device(idle, self.device), entropy_BT,
                                        aux_loss=aux_loss).loss.backward()
            # Every rank sees the whole mini-batch (so each knows whether the step has any loss token) and, after
            # these two collectives, the step's whole loss and gradient norm: all decide alike.
            loss_tokens = int(minibatch.loss_mask_BT.sum())
            dist.all_reduce(step_loss)
            report = optimizer_step(self.optimizer, self.scheduler, list(self.policy.parameters()),
                                    acc if self.rank == 0 else MetricAccumulator(), loss_tokens=loss_tokens,
                                    step_loss=step_loss, max_grad_norm=self.cfg.optim.max_grad_norm,
                                    queue_on_device=False)     # FSDP2's DTensor shards: decided on the host
            accs.append(acc)
            reports.append(report)
        self.policy.eval()
        return accs, token_maps, self._forward_metrics(), reports

    def _forward_metrics(self) -> dict:
        # The policy forward's counts (MoE route agreement) as Ratios, so the driver adds the ranks' exactly.
        metrics, self.policy_forward._metrics = dict(self.policy_forward._metrics), {}
        return metrics

    # ------------------------------------------------------------------------------------------ no-grad passes
    def logprobs(self, batch, reference: bool = False):
        """log-probs of this rank's rows (rank::world) under the policy or the reference, and the extras the pass
        added to them (the old-log-prob pass's MoE routes). One all-gather, then forwards on whole weights."""
        unit, forward = (self.reference_unit, self.reference_forward) if reference else (self.unit,
                                                                                        self.policy_forward)
        rows = torch.arange(self.rank, len(batch), self.world)
        unit.unshard()
        try:
            if len(rows) == 0:
                return rows, None, {}
            part = batch.select(rows)
            before = set(part.extras)
            logp_BT = forward.batch_logprobs(part)
            return rows, logp_BT, {key: part.extras[key] for key in set(part.extras) - before}
        finally:
            unit.reshard()

    # ------------------------------------------------------------------------------------------ weights and state
    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Every parameter gathered whole (a collective); rank 0 returns them on the CPU."""
        out = {}
        for name, param in self.policy.named_parameters():
            tensor = weight_sync.full(param).detach()
            if self.rank == 0:
                out[name] = tensor.cpu().clone()
        return out if self.rank == 0 else None

    def full_gradients(self) -> dict[str, torch.Tensor] | None:
        """Every parameter's gradient gathered whole (a collective); rank 0 returns them (what the exactness tests
        compare with one process's)."""
        out = {}
        for name, param in self.policy.named_parameters():
            if param.grad is not None:
                grad = weight_sync.full(param.grad).detach()
                if self.rank == 0:
                    out[name] = grad.cpu().clone()
        return out if self.rank == 0 else None

    def optimizer_state(self) -> dict | None:
        """The optimizer and scheduler state in the single-process layout (each state tensor whole); rank 0."""
        state = self.optimizer.state_dict()
        whole = {index: {key: weight_sync.full(value).cpu() if torch.is_tensor(value) else value
                         for key, value in per_param.items()}
                 for index, per_param in state["state"].items()}
        if self.rank != 0:
            return None
        return {"optimizer": {"state": whole, "param_groups": state["param_groups"]},
                "scheduler": self.scheduler.state_dict()}

    def load(self, weights: dict[str, torch.Tensor], state: dict | None) -> None:
        """Take whole weights (and optimizer/scheduler state in the single-process layout): each rank keeps its
        shard."""
        from torch.distributed.tensor import distribute_tensor

        with torch.no_grad():
            for name, param in self.policy.named_parameters():
                if name not in weights:
                    continue
                value = weights[name].to(device=self.device, dtype=param.dtype)
                if hasattr(param, "device_mesh"):
                    value = distribute_tensor(value, param.device_mesh, param.placements).to_local()
                    param.to_local().copy_(value)
                else:
                    param.copy_(value)
        if state is None:
            return
        params = [p for p in self.policy.parameters() if p.requires_grad]
        sharded = {}
        for index, per_param in state["optimizer"]["state"].items():
            param = params[int(index)]
            sharded[index] = {key: _like(value, param) for key, value in per_param.items()}
        self.optimizer.load_state_dict({"state": sharded, "param_groups": state["optimizer"]["param_groups"]})
        self.scheduler.load_state_dict(state["scheduler"])

    def join_sync(self, host: str, port: int, size: int) -> None:
        """Rank 0 hosts the sync group's store and is its group rank 0 (see weight_sync)."""
        self._sync_group = None
        self._sync_group, self._sync_store = weight_sync.join_group(host, port, 0, size, self.device, is_host=True)

    def send_weights(self, bucket_bytes: int) -> tuple[int, str | None]:
        named = list(self.policy.named_parameters())
        return weight_sync.send(named, bucket_bytes, self._sync_group if self.rank == 0 else None)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _shard(unit: torch.nn.Module, mesh, fully_shard) -> torch.nn.Module:
    fully_shard(unit, mesh=mesh)
    unit.set_gradient_divide_factor(1.0)     # a sum over ranks, not FSDP's default mean (see the module docstring)
    unit.set_force_sum_reduction_for_comms(True)     # a plain SUM (gloo has no pre-multiplied sum)
    return unit


def _zero_weight(micro):
    """A micro-batch whose loss is 0·(its terms): it runs the forward and backward collectives, adds nothing."""
    return dataclasses.replace(micro, weight_BT=torch.zeros_like(micro.weight_BT), step_share=0.0)


def _like(value, param):
    """An optimizer state value as this rank holds it: the shard of a per-element one (exp_avg, exp_avg_sq), the
    value itself for a scalar (step)."""
    if not torch.is_tensor(value):
        return value
    if hasattr(param, "device_mesh") and value.shape == param.shape:
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(device=param.device, dtype=param.dtype), param.device_mesh,
                                 param.placements)
    return value.to(param.device)
