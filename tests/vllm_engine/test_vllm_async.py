"""Asynchronous rollouts (`rollout.max_staleness=1`) with the real vLLM engine in its own process: the producer
thread drives the engine while the trainer updates, the engine loads each scheduled policy version between
requests, and an engine process killed with a request in flight is restarted from the snapshot of the version it
was serving: the run goes on and the lost generation is sampled again (docs/async.md)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from literl.assembly.builder import build_components
from literl.config.load import load_config
from literl.model import PolicyForward
from literl.rollout.async_rollout import VersionedEngine
from literl.run.metrics_log import read_metrics
from literl.training.trainer import Trainer
from tests.rollout.test_async_rollout import length_reward
from tests.vllm_engine.conftest import vllm_tiny_qwen3

NOT_COMPARED = ("time/", "throughput/", "sync/", "async/engine_restarts")


@pytest.fixture
def head32_model_dir(tmp_path, char_tokenizer):
    path = tmp_path / "tiny-qwen3-h32"
    vllm_tiny_qwen3().save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


def _parts(model_dir, out, vllm_python, *extra):
    cfg = load_config(preset="lite_ppo", overrides=[
        f"model.path={model_dir}", "model.profile=testbed", f"trainer.output_dir={out}", "trainer.steps=4",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12", "data.size=64",
        "optim.lr=1e-2", "eval.before=false", "eval.every=2", "eval.limit=4", "eval.samples=1", "eval.greedy=false",
        "trainer.progress=false", "trainer.threads=1", "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.25",
        f"rollout.vllm.python={vllm_python}", "rollout.max_staleness=1", "trainer.recompute_old_logp=always",
        *extra])
    return build_components(cfg, reward_fns=[length_reward])


class KillOnce:
    """The vLLM engine, whose process is killed during the `at`-th generation: stopped (SIGSTOP) before the request
    goes out, so the request is certainly in flight, then killed (SIGKILL) while the trainer waits for the reply."""

    def __init__(self, engine, at: int):
        self.engine, self.at, self.calls, self.killed = engine, at, 0, None

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            pid = self.engine.process.proc.pid
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
            self.killed = pid
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_vllm_engine_killed_mid_flight_is_restarted_and_the_run_completes(vllm_python, head32_model_dir, tmp_path):
    """The engine's process dies with batch 2's request in flight. The producer restarts it on the snapshot of the
    version it was serving (version 1) and samples the batch again with the same seeds; the run finishes every
    step, each batch one version old, and μ (the engine's log-probs) is that version's: the float32 engine's
    log-probs agree with the trainer's recompute under the version's weights."""
    parts = _parts(head32_model_dir, tmp_path / "run", vllm_python)
    versioned = parts.engine
    assert isinstance(versioned, VersionedEngine)
    killer = KillOnce(versioned.engine, at=3)        # 1: batch 0, 2: batch 1, 3: batch 2 (the evaluation locks)
    versioned.engine = killer
    weights, batches = {}, []
    prepare = parts.objective.prepare

    def keep(batch, **kwargs):
        weights[len(batches)] = {k: v.clone() for k, v in parts.learner.policy().state_dict().items()}
        batches.append(batch)
        return prepare(batch, **kwargs)

    parts.objective.prepare = keep
    Trainer(parts).fit()
    assert killer.killed is not None and killer.engine.process.proc.pid != killer.killed
    rows = read_metrics(parts.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r.get("async/engine_restarts", 0) for r in rows) == 1
    assert [r["async/version"] for r in rows] == [0, 0, 1, 2]
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1, 1]
    # μ of batch 2 is version 1's: the weights at the start of step 1 (steps count from 0).
    model = vllm_tiny_qwen3()
    model.load_state_dict(weights[1])
    batch = batches[2]
    expected = PolicyForward(model.eval(), temperature=1.0).batch_logprobs(batch)
    assert torch.allclose(batch.rollout_logp_BT[batch.mask_BT], expected[batch.mask_BT], atol=1e-4)


@pytest.mark.slow
def test_the_restarted_engine_samples_what_the_killed_one_would_have(vllm_python, head32_model_dir, tmp_path):
    """The same run without the kill: every number but timings and the restart count is the same (vLLM seeds each
    request from the batch's generator, which the retry rewinds). Slow: a third engine start (~15 s here);
    run with `pytest -m slow tests/vllm_engine/test_vllm_async.py`."""
    runs = []
    for name, kill in (("plain", False), ("killed", True)):
        parts = _parts(head32_model_dir, tmp_path / name, vllm_python)
        if kill:
            parts.engine.engine = KillOnce(parts.engine.engine, at=3)
        runs.append(read_metrics(Trainer(parts).fit()))
    plain, killed = ([{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in run] for run in runs)
    assert plain == killed
