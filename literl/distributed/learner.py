"""`RayLearner`: the `Learner` protocol (literl.training.learner) over trainer ranks on a Ray cluster.

The driver (the trainer's process) keeps the loop, the objective's `prepare`, the metrics and the checkpoints;
the ranks (`trainer_rank.TrainerRank`) run the update and the no-grad passes on FSDP2 shards. Each call sends the
batch once (Ray's object store), runs on every rank and waits for all; a rank that fails stops the others and
raises `ClusterError` naming the rank and how to resume from the last checkpoint, which nothing here touched.
"""

from __future__ import annotations

from pathlib import Path

import torch

from literl.distributed.cluster import (ClusterError, actor_options, kill_actors, started, threads_for,
                                        wait_all)
from literl.distributed.trainer_rank import TrainerRank
from literl.algorithm.metric_reduction import MetricAccumulator
from literl.model.capabilities import cluster_micro_batch_tokens
from literl.algorithm.ops import Ratio


class RankWeights:
    """What `RayRolloutEngine.sync_weights` receives from a `RayLearner`: the ranks that hold the weights."""

    def __init__(self, learner: "RayLearner"):
        self.learner = learner

    @property
    def ranks(self) -> list:
        return self.learner.ranks

    def module(self) -> torch.nn.Module:
        """The weights gathered whole in this process (an asynchronous run snapshots them as a policy version)."""
        return self.learner.policy()


class RayLearner:
    def __init__(self, ray, cfg, *, policy: torch.nn.Module, reference: torch.nn.Module | None, objective,
                 run_dir: Path):
        self.ray, self.cfg, self._policy, self.run_dir = ray, cfg, policy, Path(run_dir)
        self.objective = objective
        world = cfg.cluster.trainer_ranks
        actor = ray.remote(TrainerRank).options(**actor_options(cfg.cluster))
        threads = threads_for(cfg.cluster)
        self.ranks = [started(actor.remote(rank, world, cfg, threads)) for rank in range(world)]
        host, port = wait_all(ray, [self.ranks[0].rendezvous.remote()], self.ranks[:1], "trainer rank")[0]
        policy_ref = ray.put(policy)
        reference_ref = ray.put(reference) if reference is not None else None
        self._call("setup", host, port, policy_ref, reference_ref)
        self._metrics: dict[str, Ratio] = {}
        self._fresh = True          # the driver's copy holds the ranks' weights (no update since it was copied)

    # ------------------------------------------------------------------------------------------ the protocol
    def update(self, train, observe=None, on_step=None) -> dict[str, float]:
        """The ranks' optimizer steps; `on_step` sees each step's outcome once they are all done (so a stop it
        raises comes after the ranks took the update's later steps, if any)."""
        results = self._call("update", self.ray.put(train))
        self._fresh = False
        total = MetricAccumulator()
        n_minibatches = len(results[0][0])
        for k in range(n_minibatches):
            for accs, _, _, _ in results:
                total.merge(accs[k])
            total.end_minibatch()
        for _, _, forward_metrics, _ in results:
            self._add_forward_metrics(forward_metrics)
        if observe is not None:
            self._observe(train, [maps for _, maps, _, _ in results], observe)
        if on_step is not None:
            for report in results[0][3]:
                on_step(report)
        return total.result()

    def logprobs(self, batch) -> torch.Tensor:
        return self._no_grad(batch, reference=False)

    def reference_logprobs(self, batch) -> torch.Tensor:
        return self._no_grad(batch, reference=True)

    def take_metrics(self) -> dict[str, float]:
        out = {key: float(value) for key, value in self._metrics.items()}
        self._metrics = {}
        return out

    def weights(self) -> RankWeights:
        return RankWeights(self)

    def policy(self) -> torch.nn.Module:
        """The driver's copy of the policy, refreshed with the ranks' weights (gathered whole by rank 0) when an
        update has changed them since the last call."""
        if not self._fresh:
            state = self._call("full_state")[0]
            with torch.no_grad():
                for name, param in self._policy.named_parameters():
                    param.copy_(state[name])
            self._fresh = True
        return self._policy

    def state_dict(self) -> dict:
        return self._call("optimizer_state")[0]

    def load_state_dict(self, state: dict) -> None:
        """The ranks take the driver's copy's weights (a checkpoint's, loaded into `policy()`) and `state`."""
        weights = {name: param.detach().cpu() for name, param in self._policy.named_parameters()}
        self._call("load", self.ray.put(weights), self.ray.put(state))
        self._fresh = True

    def shutdown(self) -> None:
        """Stop the actors (a dead one is skipped)."""
        kill_actors(self.ray, self.ranks)

    # ------------------------------------------------------------------------------------------ helpers
    def _no_grad(self, batch, *, reference: bool) -> torch.Tensor:
        """Rows spread over the ranks (rank r: rows r, r+world, ...), results put back in row order."""
        results = self._call("logprobs", self.ray.put(batch), reference)
        out = torch.zeros_like(batch.rollout_logp_BT)
        for rows, logp_BT, extras in results:
            if logp_BT is None:
                continue
            out[rows, :logp_BT.shape[1]] = logp_BT
            for key, value in extras.items():
                if key not in batch.extras:
                    fill = -1 if not (value.dtype.is_floating_point or value.dtype == torch.bool) else 0
                    shape = (len(batch), batch.tokens_BL.shape[1], *value.shape[2:])
                    batch.extras[key] = torch.full(shape, fill, dtype=value.dtype)
                batch.extras[key][rows, :value.shape[1]] = value
        return out

    def _observe(self, train, maps_per_rank: list[list[dict]], observe) -> None:
        """Hand each micro-batch's token maps to `observe` with the micro-batch itself, split as the ranks did."""
        world = len(self.ranks)
        cursor = [0] * world
        for minibatch in train.minibatches():
            micros = self.objective.micro_batches(minibatch,
                                                  cluster_micro_batch_tokens(self.cfg.trainer.micro_batch_tokens))
            for i, micro in enumerate(micros):
                rank = i % world
                observe(micro, maps_per_rank[rank][cursor[rank]])
                cursor[rank] += 1

    def _add_forward_metrics(self, metrics: dict) -> None:
        for key, value in metrics.items():
            self._metrics[key] = self._metrics[key] + value if key in self._metrics else value

    def _call(self, method: str, *args) -> list:
        return self.wait([getattr(rank, method).remote(*args) for rank in self.ranks])

    def wait(self, refs: list) -> list:
        """The results of one call per rank (all ranks, in rank order)."""
        try:
            return wait_all(self.ray, refs, self.ranks, "trainer rank")
        except ClusterError as err:
            raise ClusterError(f"{err}. The run stops here; its last checkpoint is intact: continue it with "
                               f"trainer.resume=true trainer.output_dir={self.run_dir} (with these cluster.* "
                               f"settings, or in one process with cluster.address=null)") from err
