"""Scale-out on a Ray cluster: rollout workers behind the `Engine` protocol, FSDP2 trainer ranks behind the
`Learner` protocol, weight sync between them. The only package that imports `ray` (lazily: a single-process run
never needs it). `start_cluster` is what `literl.assembly.builder` calls when `cluster.address` is set.

    driver (the trainer's loop)        ── prompts ──► RolloutWorker × W    (NativeEngine on a policy copy)
      Collector, Objective.prepare     ◄─ samples ──
      metrics, checkpoints             ── batch ───► TrainerRank × R      (FSDP2 shards, one process group)
                                       ◄─ metrics ──
                                       rank 0 ── weights, bucketed broadcast ──► every worker
"""

from __future__ import annotations

from pathlib import Path

from literl.distributed.cluster import INSTALL, ClusterError, connect

__all__ = ["ClusterError", "INSTALL", "connect", "start_cluster"]


def start_cluster(cfg, *, policy, reference, objective, engine_options: dict, run_dir: Path, console=None):
    """Connect to (or start) the Ray cluster of `cfg.cluster` and start its actors; returns (engine, learner):
    a `RayRolloutEngine` and a `RayLearner`. Both start from `policy`'s (and `reference`'s) current weights."""
    from literl.distributed.learner import RayLearner
    from literl.distributed.rollout import RayRolloutEngine

    c = cfg.cluster
    ray = connect(c)
    if console is not None:
        console.note(f"Ray cluster at {c.address}: {c.trainer_ranks} trainer rank(s), {c.rollout_workers} rollout "
                     f"worker(s), {c.cpus_per_worker:g} CPU / {c.gpus_per_worker:g} GPU each")
    policy = policy.cpu()
    engine = RayRolloutEngine(ray, cfg, policy=policy, engine_options=engine_options)
    try:
        learner = RayLearner(ray, cfg, policy=policy, reference=None if reference is None else reference.cpu(),
                             objective=objective, run_dir=run_dir)
    except BaseException:
        engine.shutdown()
        raise
    return engine, learner
