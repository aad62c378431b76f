"""Asynchronous rollouts with bounded staleness (literl/rollout/async_rollout.py, docs/async.md): the schedule, the
versions every token carries, the IS weights they imply, drops, checkpoints with batches in flight, Ctrl-C.

Real engine (literl's HF engine on a tiny Qwen3, its own copy of the weights in a producer thread), nothing mocked.
The vLLM engine and Ray rollout workers are exercised in tests/vllm_engine/test_vllm_async.py and
tests/distributed/test_async_cluster.py."""

from __future__ import annotations

import copy
import os
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file

from literl.algorithm.batch import POLICY_VERSION, STALENESS, RolloutBatch
from literl.assembly.builder import build_components
from literl.config.load import load_config
from literl.model import PolicyForward
from literl.config.errors import ConfigError
from literl.rewards.isolation import time_bounded
from literl.rollout.async_rollout import AsyncCollector, batch_version, switch_step
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from literl.training.trainer import Trainer

TINY = ["model.profile=testbed", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "eval.before=false", "eval.every=0", "eval.limit=4", "eval.samples=1", "eval.greedy=false",
        "trainer.progress=false", "data.size=64", "optim.lr=1e-3", "trainer.threads=1"]
TIMING = ("time/", "throughput/", "sync/snapshot_seconds")


@time_bounded
def length_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Varies within groups even for a random model, so every step updates the weights; bounds its own time, so
    it is scored in-process (no checker process to start)."""
    return float(len(response) % 3 == 0)


def _cfg(model_dir, out, *extra, preset="lite_ppo"):
    return load_config(preset=preset, overrides=[f"model.path={model_dir}", f"trainer.output_dir={out}", *TINY,
                                                 *extra])


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def _weights(run_dir, sub="final"):
    out = {}
    for f in sorted((run_dir / sub).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_the_schedule_samples_batch_s_under_version_max_floor_s_minus_k():
    assert [batch_version(s, 2) for s in range(6)] == [0, 0, 0, 1, 2, 3]
    assert [batch_version(s, 1, floor=4) for s in range(4, 8)] == [4, 4, 5, 6]     # a run resumed at step 4
    assert switch_step(12) == 6 and switch_step(1) == 1


def test_every_token_carries_the_version_that_sampled_it_and_staleness_never_exceeds_k(tiny_qwen3_dir, tmp_path):
    """k = 2 over 5 steps: batches 0-2 under version 0 (staleness 0, 1, 2), then s − 2; the histogram holds it."""
    run = train(_cfg(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=5", "rollout.max_staleness=2"),
                reward_fns=[length_reward])
    records = read_metrics(run)
    assert [r["async/version"] for r in records] == [0, 0, 0, 1, 2]
    assert [r["async/staleness_mean"] for r in records] == [0, 1, 2, 2, 2]
    assert all(r["async/staleness_max"] <= 2 and r["async/dropped_rows"] == 0 for r in records)
    assert [r["async/staleness_frac_2"] for r in records] == [0, 0, 1, 1, 1]
    # The per-staleness breakdown fills the bin of the batch's staleness only (null elsewhere).
    assert records[0]["stale/1/ti_kl_k3"] is None and records[3]["stale/2/ti_kl_k3"] is not None


def test_the_threaded_producer_gives_the_numbers_of_producing_in_lockstep(tiny_qwen3_dir, tmp_path):
    """The version each batch samples under is the schedule's, not whichever thread finished first: a run whose
    producer thread overlaps the update equals, bit for bit, one that generates each batch when it is asked for."""
    runs = []
    for name, threaded in (("threaded", True), ("lockstep", False)):
        cfg = _cfg(tiny_qwen3_dir, tmp_path / name, "trainer.steps=4", "rollout.max_staleness=2", "eval.every=2")
        parts = build_components(cfg, reward_fns=[length_reward])
        assert isinstance(parts.collector, AsyncCollector)
        parts.collector.threaded = threaded
        runs.append(Trainer(parts).fit())
    threaded_run, lockstep_run = runs
    assert _comparable(read_metrics(threaded_run)) == _comparable(read_metrics(lockstep_run))
    assert (threaded_run / "eval.jsonl").read_text() == (lockstep_run / "eval.jsonl").read_text()
    a, b = _weights(threaded_run), _weights(lockstep_run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_is_weights_equal_a_hand_computation_from_the_recorded_versions(tiny_qwen3_dir, tmp_path):
    """k = 1, token TIS (cap 2). The batch of step 2 was sampled under version 0 (the starting weights) and is
    trained with version 1 (after one step): recomputing both from saved copies of those weights, μ must be
    log π_v0 and π_old log π_v1, and the IS weight min(π_v1/π_v0, 2) on every response token."""
    cfg = _cfg(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=2", "rollout.max_staleness=1",
               "algorithm.is_correction.name=token_tis", "algorithm.is_correction.params.cap=2.0")
    parts = build_components(cfg, reward_fns=[length_reward])
    weights = {0: copy.deepcopy(parts.learner.policy()).eval()}
    prepared = []
    prepare = parts.objective.prepare

    def keep(batch, **kwargs):
        # the step's starting weights
        weights.setdefault(len(prepared), copy.deepcopy(parts.learner.policy()).eval())
        train_batch, metrics = prepare(batch, **kwargs)
        prepared.append((batch, train_batch))
        return train_batch, metrics

    parts.objective.prepare = keep
    Trainer(parts).fit()
    batch, train_batch = prepared[1]
    assert (batch.extras[POLICY_VERSION][batch.mask_BT] == 0).all()
    assert (batch.extras[STALENESS][batch.mask_BT] == 1).all()
    mask = batch.mask_BT
    logp_v0 = PolicyForward(weights[0], temperature=1.0).batch_logprobs(batch)
    logp_v1 = PolicyForward(weights[1], temperature=1.0).batch_logprobs(batch)
    assert not torch.allclose(logp_v0[mask], logp_v1[mask], atol=1e-3), "one step must move the policy"
    assert torch.allclose(batch.rollout_logp_BT[mask], logp_v0[mask], atol=1e-4)
    assert torch.allclose(train_batch.old_logp_BT[mask], logp_v1[mask], atol=1e-5)
    expected = torch.exp(logp_v1 - logp_v0).clamp(max=2.0)
    assert torch.allclose(train_batch.is_weight_BT[mask], expected[mask], rtol=1e-3)
    assert (train_batch.is_weight_BT[mask] != 1).any()


def _rows(versions_B, group_B, T=3):
    B = len(versions_B)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 2] = False
    version = torch.where(mask, torch.tensor(versions_B)[:, None].expand(B, T), torch.full((B, T), -1))
    zeros = torch.zeros(B)
    return RolloutBatch(tokens_BL=torch.zeros(B, T + 1, dtype=torch.long), prompt_len_B=torch.ones(B, dtype=torch.long),
                        response_ids_BT=torch.zeros(B, T, dtype=torch.long), mask_BT=mask,
                        rollout_logp_BT=torch.zeros(B, T), truncated_B=torch.zeros(B, dtype=torch.bool),
                        group_B=torch.tensor(group_B), scores_B=zeros, correct_B=zeros.bool(), rewards_B=zeros,
                        problem_B=torch.arange(B), responses=[f"r{b}" for b in range(B)],
                        problems=[{}] * B, extras={POLICY_VERSION: version})


def test_rows_older_than_k_are_dropped_with_their_group_and_counted():
    """At step 5 with k = 2: version 2 is 3 steps old. Group 7 holds one such row, so both its rows go (a group
    is never split); group 8's rows (versions 3 and 4) stay, with staleness 2 and 1."""
    collector = AsyncCollector.__new__(AsyncCollector)
    collector.k = 2
    batch, metrics = collector._bounded(5, _rows([3, 2, 3, 4], [7, 7, 8, 8]), {})
    assert batch.responses == ["r2", "r3"] and batch.group_B.tolist() == [8, 8]
    assert batch.extras[STALENESS].tolist() == [[2, 2, 2], [1, 1, 1]]
    assert metrics["async/dropped_rows"] == 2 and metrics["async/dropped_frac"] == 0.5
    assert metrics["async/staleness_max"] == 2 and metrics["async/staleness_mean"] == 1.5


@pytest.fixture(scope="module")
def k2_run(tmp_path_factory):
    """A 5-step k = 2 run with a checkpoint every 2 steps (all kept)."""
    from tests.conftest import build_tiny_qwen3
    from literl.testbed.tokenizer import build_char_tokenizer

    root = tmp_path_factory.mktemp("k2")
    build_tiny_qwen3().save_pretrained(root / "model")
    build_char_tokenizer().save_pretrained(root / "model")
    run = train(_cfg(root / "model", root / "run", "trainer.steps=5", "rollout.max_staleness=2",
                     "trainer.save_every=2", "trainer.keep_checkpoints=0"), reward_fns=[length_reward])
    return root / "model", run


def _cut_back_to(run, step: int, out):
    """A copy of `run` as it stood after `step`'s checkpoint: the later checkpoints removed (the resume trims
    the logs)."""
    shutil.copytree(run, out)
    for later in (out / "checkpoints").glob("step_*"):
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    (out / "checkpoints/latest").write_text(f"step_{step:06d}")
    return out


def test_resume_with_batches_in_flight_is_exact(k2_run, tmp_path):
    """k = 2: the checkpoint after step 2 holds batches 2 and 3 (sampled under versions 0 and 1, which no weights
    file keeps); the resumed run trains them as they were and generates the rest under its own weights."""
    model, straight = k2_run
    state = torch.load(straight / "checkpoints/step_000002/trainer_state.pt", weights_only=True)
    assert [b["step"] for b in state["rollouts_in_flight"]["batches"]] == [2, 3]
    assert [int(b["batch"]["extras"][POLICY_VERSION].max()) for b in state["rollouts_in_flight"]["batches"]] == [0, 1]
    copy_ = _cut_back_to(straight, 2, tmp_path / "resumed")
    resumed = train(_cfg(model, copy_, "trainer.steps=5", "rollout.max_staleness=2", "trainer.save_every=2",
                         "trainer.resume=true"), reward_fns=[length_reward])
    assert _comparable(read_metrics(straight)) == _comparable(read_metrics(resumed))
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_a_smaller_k_drops_the_batches_in_flight_that_became_too_old(k2_run, tmp_path):
    """Checkpoint of a k = 2 run after two steps (batches 2, 3 in flight under versions 0, 1; steps count from 0),
    resumed with k = 1: each is 2 versions old when its step comes, beyond the new bound, so both are dropped and
    their steps train nothing; batch 4 is generated under max(2, 4 − 1) = 3, one version old at step 4."""
    model, straight = k2_run
    copy_ = _cut_back_to(straight, 2, tmp_path / "resumed")
    run = train(_cfg(model, copy_, "trainer.steps=5", "rollout.max_staleness=1", "trainer.resume=true"),
                reward_fns=[length_reward])
    batch2, batch3, batch4 = read_metrics(run)[2:]      # logged as steps 3, 4, 5
    for dropped in (batch2, batch3):
        assert dropped["async/dropped_rows"] == 16 and dropped["async/dropped_frac"] == 1
        assert dropped["optim/skipped_step"] == 1 and dropped["loss/total"] == 0
    assert batch4["async/dropped_rows"] == 0 and batch4["async/version"] == 3
    assert batch4["async/staleness_max"] == 1 and batch4["optim/skipped_step"] == 0


@time_bounded
def interrupting_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Like length_reward, and presses Ctrl-C (SIGINT to this process) once, while the producer scores a batch."""
    if os.environ.get("LITERL_TEST_INTERRUPT") == "arm":
        os.environ["LITERL_TEST_INTERRUPT"] = "sent"
        os.kill(os.getpid(), signal.SIGINT)
    return float(len(response) % 3 == 0)


def test_ctrl_c_drains_the_producer_saves_the_batches_in_flight_and_resumes_exactly(tiny_qwen3_dir, tmp_path,
                                                                                    monkeypatch):
    """Ctrl-C arrives in the producer's thread while it scores an early batch; the trainer finishes its step,
    waits for the batches in flight, saves them with the checkpoint and stops; the producer thread ends. The
    resumed run ends where the uninterrupted one does."""
    import threading

    extra = ("trainer.steps=4", "rollout.max_staleness=1")
    straight = train(_cfg(tiny_qwen3_dir, tmp_path / "a", *extra), reward_fns=[interrupting_reward])
    monkeypatch.setenv("LITERL_TEST_INTERRUPT", "arm")
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tiny_qwen3_dir, tmp_path / "b", *extra), reward_fns=[interrupting_reward])
    assert not any(t.name == "literl-rollout-producer" and t.is_alive() for t in threading.enumerate())
    done = len(read_metrics(tmp_path / "b"))
    assert 1 <= done < 4
    state = torch.load(tmp_path / f"b/checkpoints/step_{done:06d}/trainer_state.pt", weights_only=True)
    assert [b["step"] for b in state["rollouts_in_flight"]["batches"]] == [done]
    resumed = train(_cfg(tiny_qwen3_dir, tmp_path / "b", *extra, "trainer.resume=true"),
                    reward_fns=[interrupting_reward])
    assert _comparable(read_metrics(straight)) == _comparable(read_metrics(resumed))


def test_partial_rollouts_switch_a_running_response_to_the_next_version_mid_way(tiny_qwen3_dir, tmp_path):
    """k = 2, partial rollouts, 12-token responses: batch 3 starts under version 1 and samples tokens 6-11 under
    version 2, loaded between two decode steps. Tokens before the switch have exactly version 1's log-probs;
    after it, the engine's log-probs are no longer version 1's (the weights did change under the running batch)."""
    cfg = _cfg(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=4", "rollout.max_staleness=2",
               "rollout.partial_rollouts=true", "rollout.max_new_tokens=12")
    parts = build_components(cfg, reward_fns=[length_reward])
    weights, prepared = {}, []
    prepare = parts.objective.prepare

    def keep(batch, **kwargs):
        weights[len(prepared)] = copy.deepcopy(parts.learner.policy()).eval()
        prepared.append(batch)
        return prepare(batch, **kwargs)

    parts.objective.prepare = keep
    Trainer(parts).fit()
    batch = prepared[3]
    mask, version = batch.mask_BT, batch.extras[POLICY_VERSION]
    assert (version[:, :6][mask[:, :6]] == 1).all() and (version[:, 6:][mask[:, 6:]] == 2).all()
    assert mask[:, 6:].any(), "some responses must run past the switch for this test to mean anything"
    logp_v1 = PolicyForward(weights[1], temperature=1.0).batch_logprobs(batch)
    early, late = mask.clone(), mask.clone()
    early[:, 6:] = False
    late[:, :6] = False
    assert torch.allclose(batch.rollout_logp_BT[early], logp_v1[early], atol=1e-4)
    assert (batch.rollout_logp_BT[late] - logp_v1[late]).abs().max() > 1e-3
    assert read_metrics(parts.run_dir)[3]["async/staleness_frac_1"] > 0      # tokens 1 version old (v2 at step 3)


def test_bad_asynchronous_settings_fail_at_load_with_the_fix():
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(overrides=["rollout.partial_rollouts=true"])
    with pytest.raises(ConfigError, match="rollout.engine=native"):
        load_config(overrides=["rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="torch.compile"):
        load_config(overrides=["rollout.max_staleness=1", "trainer.compile=true"])
    with pytest.raises(ConfigError, match=r"rollout.max_staleness=-1 must be in \[0, 64\]"):
        load_config(overrides=["rollout.max_staleness=-1"])


class FailingEngine:
    """The producer's engine, failing on its `at`-th generation (a broken engine, out of memory, ...)."""

    def __init__(self, engine, at: int):
        self.engine, self.at, self.calls = engine, at, 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("the engine broke")
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_failing_producer_stops_the_run_with_its_cause_and_a_checkpoint_to_resume_from(tiny_qwen3_dir, tmp_path):
    """k = 1: generating batch 2 fails. Step 2 (from 0) raises the producer's own error; the checkpoint
    of the two complete steps is written (no batch in flight was finished); the resumed run generates batch 2
    under the checkpoint's weights (version 2, staleness 0) and finishes."""
    cfg = _cfg(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=4", "rollout.max_staleness=1")
    parts = build_components(cfg, reward_fns=[length_reward])
    parts.engine.engine = FailingEngine(parts.engine.engine, at=3)
    with pytest.raises(RuntimeError, match="the engine broke") as raised:
        Trainer(parts).fit()
    assert "rollout producer thread" in " ".join(raised.value.__notes__)
    state = torch.load(tmp_path / "r/checkpoints/step_000002/trainer_state.pt", weights_only=True)
    assert state["rollouts_in_flight"]["batches"] == []
    run = train(_cfg(tiny_qwen3_dir, tmp_path / "r", "trainer.steps=4", "rollout.max_staleness=1",
                     "trainer.resume=true"), reward_fns=[length_reward])
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["async/version"] for r in records] == [0, 0, 2, 2]
    assert [r["async/staleness_max"] for r in records] == [0, 1, 0, 1]


@pytest.mark.parametrize("replay", ["r2", "r3"])
def test_routing_replay_trains_a_moe_model_on_stale_batches(tiny_moe_dir, tmp_path, replay):
    """k = 1 on a tiny Qwen3-MoE: R3 replays the experts the engine chose under the batch's (older) version, R2
    those of the old-log-prob pass; both train with finite losses and report the engine–trainer route agreement."""
    run = train(_cfg(tiny_moe_dir, tmp_path / "r", "trainer.steps=3", "rollout.max_staleness=1",
                     f"algorithm.routing_replay={replay}", preset="minirl"), reward_fns=[length_reward])
    records = read_metrics(run)
    assert [r["async/staleness_max"] for r in records] == [0, 1, 1]
    assert all(r["optim/skipped_step"] == 0 and r["optim/grad_norm"] > 0 for r in records)
    assert all(0 < r["moe/route_agree_ti"] <= 1 for r in records)
    assert records[1]["moe/route_agree_ti"] < 1, "a version older than the trainer's routes some tokens elsewhere"
