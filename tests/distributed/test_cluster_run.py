"""A local Ray cluster with 2 FSDP2 trainer ranks and 2 rollout workers trains the micro testbed for 3 steps.

- End to end: the cluster run's step-1 metrics equal those of a single-process run with the same seed fed the
  same samples. The samples themselves differ from a single-process run's by design: each rollout worker samples
  with its own generator seeded from the run's RNG (literl/distributed/rollout.py), so the single-process run here
  replays the cluster's generations (and draws the same seeds from its RNG, so its random stream stays in step).
- Weight sync: after the run every worker's weights hash equal to the ranks' (gathered) weights.
- Faults: a rollout worker's process killed in the middle of a generation is replaced, its prompts re-sampled,
  the call completes with every row, and the replacement holds the trainer's weights after the next sync; a
  trainer rank's process killed stops the next update with an error naming the rank and the resume command.
"""

from __future__ import annotations

import math
import os
import signal
import threading

import pytest
import torch

from literl.assembly.builder import build_components
from literl.config.load import load_config
from literl.rollout.engine import SamplingParams
from literl.run.metrics_log import read_metrics
from literl.training.trainer import Trainer
from tests.training.test_trainer import length_reward

RUN = ["model.testbed=micro", "trainer.steps=3", "rollout.prompts_per_step=4", "rollout.group_size=4",
       "rollout.max_new_tokens=24", "trainer.micro_batch_tokens=200", "eval.before=false", "eval.every=0",
       "eval.limit=4", "eval.samples=1", "eval.greedy=false", "trainer.progress=false", "data.size=64",
       "seed=3"]
CLUSTER = ["cluster.address=local", "cluster.trainer_ranks=2", "cluster.rollout_workers=2"]
NOT_COMPARED = ("time/", "throughput/", "sync/", "cluster/")


class Recording:
    """The cluster's generator, keeping what it returned to the collector."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, params, *, rng=None):
        generation = self.engine.generate(prompts, params, rng=rng)
        self.calls.append(([list(p) for p in prompts], generation))
        return generation

    def sync_weights(self, source):
        return self.engine.sync_weights(source)


class Replay:
    """The cluster's generations, handed out again in order to a single-process run (which must ask for the same
    prompts); draws one seed per rollout worker from the run's RNG, as the cluster's generator did."""

    def __init__(self, calls, workers: int):
        self.calls, self.workers = list(calls), workers

    def generate(self, prompts, params, *, rng=None):
        expected, generation = self.calls.pop(0)
        assert [list(p) for p in prompts] == expected
        for _ in range(self.workers):
            torch.randint(0, 2**62, (1,), generator=rng)
        return generation

    def sync_weights(self, source):
        return None


@pytest.fixture(scope="module")
def cluster_run(ray_cluster, tmp_path_factory):
    cfg = load_config(preset="lite_ppo", overrides=RUN + CLUSTER + [
        f"trainer.output_dir={tmp_path_factory.mktemp('cluster') / 'run'}"])
    parts = build_components(cfg, reward_fns=[length_reward])     # a reward that varies within groups
    initial = {name: p.detach().clone() for name, p in parts.learner.policy().named_parameters()}
    recording = Recording(parts.engine)
    parts.collector.engine = recording
    Trainer(parts)._fit()       # not fit(): its end stops the actors, which the tests below still use
    yield parts, recording, initial
    parts.release()


def test_step_one_metrics_equal_a_single_process_run_with_the_same_samples(cluster_run, tmp_path):
    parts, recording, _ = cluster_run
    cluster = read_metrics(parts.run_dir)
    assert [r["step"] for r in cluster] == [1, 2, 3]
    assert all(r["sync/bytes"] > 0 and r["cluster/rollout_retries"] == 0 for r in cluster)
    assert cluster[0]["optim/skipped_step"] == 0.0 and cluster[0]["optim/grad_norm"] > 0

    cfg = load_config(preset="lite_ppo", overrides=RUN + [f"trainer.output_dir={tmp_path / 'single'}"])
    single_parts = build_components(cfg, reward_fns=[length_reward])
    single_parts.collector.engine = Replay(recording.calls, workers=2)
    Trainer(single_parts).fit()
    single = read_metrics(single_parts.run_dir)

    got = {k: v for k, v in cluster[0].items() if not k.startswith(NOT_COMPARED)}
    expected = {k: v for k, v in single[0].items() if not k.startswith(NOT_COMPARED)}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float) and math.isfinite(value):
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
        else:
            assert got[key] == value, key


def test_every_worker_holds_the_trainer_ranks_weights_after_the_steps(cluster_run):
    from literl.distributed.weight_sync import weights_hash

    parts, _, initial = cluster_run
    trained = parts.learner.policy()
    assert any(not torch.equal(p, initial[name]) for name, p in trained.named_parameters()), "weights never moved"
    assert parts.engine.weights_hashes() == [weights_hash(trained)] * 2


def test_a_rollout_worker_killed_mid_generation_is_replaced_and_its_prompts_resampled(cluster_run):
    from literl.distributed.weight_sync import weights_hash

    parts, _, _ = cluster_run
    engine = parts.engine
    victim = engine.worker_pids()[0]
    prompts = [[5 + i % 7, 9, 11 + i % 5] for i in range(48) for _ in range(4)]      # 48 groups of 4
    params = SamplingParams(max_new_tokens=96)
    # Killed while the call is under way: before its share reaches the victim or while the victim samples it
    # (a share takes far longer than the kill; which of the two happens does not change what must follow).
    threading.Timer(0.01, os.kill, (victim, signal.SIGKILL)).start()
    generation = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    assert generation.response_ids_BT.shape[0] == len(prompts) and generation.mask_BT[:, 0].all()
    assert victim not in engine.worker_pids()
    metrics = engine.sync_weights(parts.learner.weights())
    assert metrics["cluster/rollout_retries"] >= 1
    assert engine.weights_hashes() == [weights_hash(parts.learner.policy())] * 2


def test_checkpoints_move_between_the_cluster_and_one_process(cluster_run, tmp_path):
    """The cluster run's last checkpoint holds the ranks' optimizer state whole, in the single-process layout;
    one process resumes it and trains a step; the ranks then take that checkpoint (as a resume in cluster mode
    does: weights into the driver's copy, then the learner) and hold exactly its weights and optimizer state."""
    import shutil

    from literl.run.checkpoint import latest_checkpoint, load_checkpoint

    parts, _, _ = cluster_run
    learner = parts.learner
    saved = torch.load(latest_checkpoint(parts.run_dir) / "trainer_state.pt", weights_only=False)
    assert saved["step"] == 3
    _assert_same_state(saved["optimizer"], learner.state_dict()["optimizer"])

    run = tmp_path / "run"
    shutil.copytree(parts.run_dir, run)
    cfg = load_config(preset="lite_ppo", overrides=RUN + [f"trainer.output_dir={run}", "trainer.resume=true",
                                                          "trainer.steps=4"])
    single = build_components(cfg, reward_fns=[length_reward])
    Trainer(single).fit()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    path = latest_checkpoint(run)
    state = load_checkpoint(path, learner.policy())
    learner.load_state_dict(state)
    _assert_same_state(state["optimizer"], learner.state_dict()["optimizer"])
    for name, param in learner.policy().named_parameters():
        assert torch.equal(param, dict(single.learner.policy().named_parameters())[name]), name


def _assert_same_state(expected: dict, got: dict) -> None:
    assert expected["param_groups"] == got["param_groups"]
    assert sorted(expected["state"]) == sorted(got["state"]) and expected["state"]
    for index, values in expected["state"].items():
        for key, value in values.items():
            assert torch.equal(got["state"][index][key], value), (index, key)


def test_a_dead_trainer_rank_stops_the_run_naming_the_rank_and_how_to_resume(cluster_run):
    from literl.distributed import ClusterError

    parts, recording, _ = cluster_run
    learner = parts.learner
    os.kill(learner.wait([rank.pid.remote() for rank in learner.ranks])[1], signal.SIGKILL)
    with pytest.raises(ClusterError, match=r"trainer rank 1 failed.*trainer\.resume=true trainer\.output_dir="):
        learner.logprobs(parts.collector.collect(torch.Generator().manual_seed(0))[0])
