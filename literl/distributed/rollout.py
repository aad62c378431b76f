"""`RayRolloutEngine`: the `Engine` protocol (literl.rollout.engine) over rollout workers on Ray.

Each worker (`RolloutWorker`, a Ray actor) holds a copy of the policy and an `NativeEngine` on it. `generate` cuts
the prompts into groups (runs of identical consecutive prompts: the collector repeats a prompt G times), gives
each worker a contiguous share of whole groups, and puts the results back in prompt order, per-token extras
(`rollout_routes_BLNK`, ...) included. Differences from one engine in the trainer's process, by design:

- sampling noise: each worker samples with its own generator, seeded from the run's RNG (one seed per worker
  per call, drawn whether or not a worker has prompts), so a seed reproduces a run for a given
  `cluster.rollout_workers`, but not the samples of the single-process run;
- no forward record: the record of the rollout's forward lives in the worker's memory and cannot cross
  processes, so cluster rollouts carry none and the update computes its forward (docs/scaling.md).

A worker that dies (its process killed, its node lost) is replaced by a new one, which gets the current weights
before it re-samples the dead worker's prompts with a fresh seed; the step completes, and `cluster/rollout_retries`
counts the re-sampled shares (reported with the next weight sync's metrics).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import torch

from literl.distributed import weight_sync
from literl.distributed.cluster import (ClusterError, actor_options, kill_actors, started, threads_for,
                                        wait_all)
from literl.model.precision import MASTER_DTYPE
from literl.rollout.engine import Generation, SamplingParams

MAX_RETRIES = 3
STUCK_AFTER_S = 30.0


class RolloutWorker:
    """A Ray actor: the policy (what a sync writes into) and an NativeEngine sampling from it (or from its own copy
    in the rollout precision)."""

    def __init__(self, policy: torch.nn.Module, cfg, engine_options: dict, threads: int):
        from literl.rollout.native_engine import NativeEngine

        torch.set_num_threads(threads)
        device = torch.device("cuda" if cfg.cluster.gpus_per_worker > 0 and torch.cuda.is_available() else "cpu")
        self.device = device
        # The trainer's float32 weights, as a sync sends them (the engine keeps its own copy in rollout.dtype).
        self.policy = policy.to(device=device, dtype=MASTER_DTYPE).eval()
        self.engine = NativeEngine(self.policy, **engine_options)
        self._group = None

    def pid(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None) -> Generation:
        rng = None if seed is None else torch.Generator().manual_seed(seed)
        return self.engine.generate(prompts, params, rng=rng)

    def join_sync(self, host: str, port: int, rank: int, size: int) -> None:
        self._group = None
        self._group, self._store = weight_sync.join_group(host, port, rank, size, self.device, is_host=False)

    def receive_weights(self, bucket_bytes: int) -> int:
        received = weight_sync.receive(self.policy, bucket_bytes, self._group)
        self.engine.sync_weights(self.policy)       # the engine's own copy (rollout.dtype), if it keeps one
        return received

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in self.policy.named_parameters():
                param.copy_(weights[name])
        self.engine.sync_weights(self.policy)

    def weights_hash(self) -> str:
        return weight_sync.weights_hash(self.policy)


class RayRolloutEngine:
    def __init__(self, ray, cfg, *, policy: torch.nn.Module, engine_options: dict):
        self.ray, self.cfg = ray, cfg
        self._actor = ray.remote(RolloutWorker).options(**actor_options(cfg.cluster))
        self._policy_ref = ray.put(policy)          # a replacement worker starts from these weights, then syncs
        self._engine_options = engine_options
        self.workers = [self._start_worker() for _ in range(cfg.cluster.rollout_workers)]
        self.ray.get([w.pid.remote() for w in self.workers])      # every worker up before the first step
        self._source = None          # what the last sync read from (a replacement worker is synced from it)
        self._group_members: list | None = None
        self._retries = 0
        self.bucket_bytes = int(cfg.cluster.sync_bucket_mb * 2**20)

    def _start_worker(self):
        return started(self._actor.remote(self._policy_ref, self.cfg, self._engine_options,
                                          threads_for(self.cfg.cluster)))

    # ------------------------------------------------------------------------------------------ generate
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, rng: torch.Generator | None = None,
) -> Generation:
        prompts = [list(p) for p in prompts]
        shares = split_groups(prompts, len(self.workers))
        seeds = [None if rng is None else int(torch.randint(0, 2**62, (1,), generator=rng))
                 for _ in self.workers]
        pending = {w: self.workers[w].generate.remote(prompts[a:b], params, seeds[w])
                   for w, (a, b) in enumerate(shares) if b > a}
        results: dict[int, Generation] = {}
        attempts = 0
        while pending:
            done, _ = self.ray.wait(list(pending.values()), num_returns=1)
            w = next(k for k, ref in pending.items() if ref == done[0])
            del pending[w]
            try:
                results[w] = self.ray.get(done[0])
                continue
            except self.ray.exceptions.RayActorError:
                pass
            attempts += 1
            if attempts > MAX_RETRIES * len(self.workers):
                raise ClusterError(f"rollout workers kept dying ({attempts} re-samplings in one call); see the "
                                   f"Ray logs (/tmp/ray/session_latest/logs)")
            self._replace(w)
            self._retries += 1
            a, b = shares[w]
            # A fresh seed: the dead worker's partial samples are gone, the share is sampled anew.
            seed = None if seeds[w] is None else (seeds[w] + attempts) % 2**62
            pending[w] = self.workers[w].generate.remote(prompts[a:b], params, seed)
        return concat([results[w] for w in sorted(results)], pad_id=self._engine_options["pad_id"],
                      width=params.max_new_tokens)

    # ------------------------------------------------------------------------------------------ weights
    def sync_weights(self, source) -> dict[str, float]:
        """Every worker gets the weights `source` holds (a `RankWeights` of a RayLearner, or a module in this
        process); returns sync/bytes (received by all workers together), sync/seconds and cluster/rollout_retries
        (re-sampled shares since the previous sync)."""
        start = time.perf_counter()
        self._source = source
        received = self._push(source)
        metrics = {"sync/bytes": float(received), "sync/seconds": time.perf_counter() - start,
                   "cluster/rollout_retries": float(self._retries)}
        self._retries = 0
        return metrics

    def _push(self, source) -> int:
        if source is None:
            return 0
        if isinstance(source, torch.nn.Module):
            weights = {name: p.detach().cpu() for name, p in source.named_parameters()}
            ref = self.ray.put(weights)
            wait_all(self.ray, [w.load_weights.remote(ref) for w in self.workers], self.workers, "rollout worker")
            return sum(t.numel() * t.element_size() for t in weights.values()) * len(self.workers)
        for attempt in range(MAX_RETRIES):
            self._ensure_group(source)
            rank_refs = [rank.send_weights.remote(self.bucket_bytes) for rank in source.ranks]
            worker_refs = [w.receive_weights.remote(self.bucket_bytes) for w in self.workers]
            sent = source.learner.wait(rank_refs)[0]
            # Rank 0 has broadcast everything (or stopped at a dead worker): a live worker finishes at once, one
            # still waiting is stuck on a bucket that never comes, and is replaced like a dead one.
            finished, stuck = self.ray.wait(worker_refs, num_returns=len(worker_refs), timeout=STUCK_AFTER_S)
            dead = [w for w, ref in enumerate(worker_refs) if ref in stuck]
            received = 0
            for w, ref in enumerate(worker_refs):
                if ref in stuck:
                    continue
                try:
                    received += self.ray.get(ref)
                except self.ray.exceptions.RayActorError:
                    dead.append(w)
                except Exception:  # noqa: BLE001 - a live worker whose broadcast broke because a peer died
                    pass
            if not dead and sent[1] is None:
                return received
            for w in dead:
                self._replace(w, sync=False)        # the next attempt syncs it with the others
                self._retries += 1
            self._group_members = None      # rebuilt with the new workers
        raise ClusterError(f"weight sync failed {MAX_RETRIES} times (last: {sent[1]}); see the Ray logs")

    def _ensure_group(self, source) -> None:
        members = [source.ranks[0], *self.workers]
        if self._group_members is not None and all(a is b for a, b in zip(self._group_members, members)):
            return
        host, port = source.learner.wait([source.ranks[0].rendezvous.remote()])[0]
        size = len(members)
        refs = [source.ranks[0].join_sync.remote(host, port, size)]
        refs += [w.join_sync.remote(host, port, i + 1, size) for i, w in enumerate(self.workers)]
        wait_all(self.ray, refs, members, "sync group member")
        self._group_members = members

    def _replace(self, w: int, *, sync: bool = True) -> None:
        """A new worker in slot w (with the weights of the last sync when `sync`)."""
        try:
            self.ray.kill(self.workers[w], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.workers[w] = self._start_worker()
        self._group_members = None
        if sync:
            self._push(self._source)

    def weights_hashes(self) -> list[str]:
        return self.ray.get([w.weights_hash.remote() for w in self.workers])

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers])

    def shutdown(self) -> None:
        """Stop the actors (a dead one is skipped)."""
        kill_actors(self.ray, self.workers)


def split_groups(prompts: list[list[int]], workers: int) -> list[tuple[int, int]]:
    """[start, end) of each worker's share: contiguous runs of whole groups (identical consecutive prompts), each
    share ending at the group boundary nearest to an even split of the rows."""
    bounds = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]] + [len(prompts)]
    shares, start = [], 0
    for w in range(workers):
        target = len(prompts) * (w + 1) / workers
        end = len(prompts) if w == workers - 1 else min((b for b in bounds if b >= start),
                                                        key=lambda b: abs(b - target))
        shares.append((start, end))
        start = end
    return shares


def concat(generations: list[Generation], *, pad_id: int, width: int) -> Generation:
    """One generation of the workers' rows in order, every per-token tensor padded to the widest."""
    T = max([width] + [g.mask_BT.shape[1] for g in generations])

    def stack(get, fill):
        parts = []
        for g in generations:
            t = get(g)
            if t.dim() > 1 and t.shape[1] < T:
                pad = torch.full((t.shape[0], T - t.shape[1], *t.shape[2:]), fill, dtype=t.dtype)
                t = torch.cat([t, pad], dim=1)
            parts.append(t)
        return torch.cat(parts)

    extras = {}
    for key in sorted(set.intersection(*(set(g.extras) for g in generations)) if generations else ()):
        first = generations[0].extras[key]
        fill = -1 if not (first.dtype.is_floating_point or first.dtype == torch.bool) else 0
        widest = max(g.extras[key].shape[1] for g in generations) if first.dim() > 1 else None
        parts = []
        for g in generations:
            t = g.extras[key]
            if widest is not None and t.shape[1] < widest:
                t = torch.cat([t, torch.full((t.shape[0], widest - t.shape[1], *t.shape[2:]), fill, dtype=t.dtype)], 1)
            parts.append(t)
        extras[key] = torch.cat(parts)
    return Generation(response_ids_BT=stack(lambda g: g.response_ids_BT, pad_id),
                      mask_BT=stack(lambda g: g.mask_BT, False),
                      rollout_logp_BT=stack(lambda g: g.rollout_logp_BT, 0.0),
                      truncated_B=torch.cat([g.truncated_B for g in generations]), extras=extras)
