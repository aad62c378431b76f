"""Asynchronous rollouts on Ray rollout workers (`rollout.max_staleness=1`, `cluster.rollout_workers=2`): the
producer thread in the driver drives the workers while the trainer rank updates, each worker loads the scheduled
policy version (a snapshot of the ranks' weights) between generations, and a worker killed mid-generation is
replaced with that version's weights and its prompts re-sampled; the run goes on (docs/async.md)."""

from __future__ import annotations

import copy
import os
import signal
import threading

import torch

from literl.assembly.builder import build_components
from literl.config.load import load_config
from literl.distributed.weight_sync import weights_hash
from literl.model import PolicyForward
from literl.rollout.async_rollout import VersionedEngine
from literl.run.metrics_log import read_metrics
from literl.training.trainer import Trainer
from tests.rollout.test_async_rollout import length_reward

RUN = ["model.testbed=micro", "trainer.steps=4", "rollout.prompts_per_step=4", "rollout.group_size=4",
       "rollout.max_new_tokens=24", "trainer.micro_batch_tokens=200", "eval.before=false", "eval.every=0",
       "eval.limit=4", "eval.samples=1", "eval.greedy=false", "trainer.progress=false", "data.size=64", "seed=3",
       "cluster.address=local", "cluster.trainer_ranks=1", "cluster.rollout_workers=2", "rollout.max_staleness=1"]


class KillWorkerOnce:
    """The Ray generator, one of whose workers is killed (SIGKILL) 10 ms into the `at`-th generation."""

    def __init__(self, engine, at: int):
        self.engine, self.at, self.calls, self.victim = engine, at, 0, None

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            self.victim = self.engine.worker_pids()[0]
            threading.Timer(0.01, os.kill, (self.victim, signal.SIGKILL)).start()
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_rollout_worker_killed_mid_flight_costs_its_share_not_the_run(ray_cluster, tmp_path):
    cfg = load_config(preset="lite_ppo", overrides=RUN + [f"trainer.output_dir={tmp_path / 'run'}"])
    parts = build_components(cfg, reward_fns=[length_reward])
    versioned = parts.engine
    assert isinstance(versioned, VersionedEngine)
    killer = KillWorkerOnce(versioned.engine, at=2)
    versioned.engine = killer
    weights, batches = [], []
    prepare = parts.objective.prepare

    def keep(batch, **kwargs):      # each step's starting weights (version = step, from 0) and its batch
        weights.append(copy.deepcopy(parts.learner.policy()).eval())
        batches.append(batch)
        return prepare(batch, **kwargs)

    parts.objective.prepare = keep
    trainer = Trainer(parts)
    try:
        trainer._fit()          # not fit(): its end stops the actors, whose weights are checked below
        rows = read_metrics(parts.run_dir)
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        assert [r["async/version"] for r in rows] == [0, 0, 1, 2]
        assert all(r["async/staleness_max"] == min(i, 1) for i, r in enumerate(rows))
        assert sum(r.get("cluster/rollout_retries", 0) for r in rows) >= 1
        assert killer.victim not in killer.worker_pids()
        # μ is the scheduled version's, also for batch 1, whose generation lost a worker and was partly re-sampled
        # by its replacement (float32 workers: their log-probs agree with the trainer's recompute).
        for step, version in ((1, 0), (2, 1), (3, 2)):
            batch = batches[step]
            expected = PolicyForward(weights[version], temperature=1.0).batch_logprobs(batch)
            assert torch.allclose(batch.rollout_logp_BT[batch.mask_BT], expected[batch.mask_BT], atol=1e-4), step
        # The final evaluation loaded the last version (4) into both workers, the replacement included.
        assert versioned.loaded == 4 and killer.weights_hashes() == [weights_hash(parts.learner.policy())] * 2
    finally:
        parts.release()
