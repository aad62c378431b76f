"""An asynchronous run on the real vLLM engine (`rollout.max_staleness=1`, `rollout.engine=vllm`) whose trainer is
killed with SIGKILL after a checkpoint, then resumed: the engine process of the killed run does not outlive it,
every step is logged once, the batches follow v(s) = max(0, s − 1) across the kill, and the resumed run's metrics
equal those of a run that was never stopped (issue 59: a combination the probe did not reach). Slow (three vLLM
engine starts, ~4 min on 2 cores): `pytest -m slow tests/vllm_engine/test_vllm_async_kill_and_resume.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from literl.run.metrics_log import read_metrics
from tests.distributed.test_interrupt import _descendants
from tests.vllm_engine.test_vllm_async import NOT_COMPARED, head32_model_dir  # noqa: F401 - a fixture


def _command(model_dir, out, vllm_python, *extra):
    return [sys.executable, "-m", "literl.cli", "train", f"model.path={model_dir}", "model.profile=testbed",
            f"trainer.output_dir={out}", "trainer.steps=4", "trainer.save_every=1", "rollout.prompts_per_step=4",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "data.size=64", "optim.lr=1e-2",
            "eval.before=false", "eval.every=0", "eval.limit=4", "eval.samples=1", "eval.greedy=false",
            "trainer.progress=false", "trainer.threads=1", "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.25",
            f"rollout.vllm.python={vllm_python}", "rollout.max_staleness=1", "trainer.recompute_old_logp=always",
            "reward.fns.0.fn=tests.rollout.test_async_rollout:length_reward", *extra]


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in rows]


@pytest.mark.slow
def test_kill_9_of_an_async_vllm_run_resumes_as_if_never_stopped(vllm_python, head32_model_dir, tmp_path):
    straight = subprocess.run(_command(head32_model_dir, tmp_path / "straight", vllm_python), capture_output=True,
                              text=True, timeout=500)
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "run"
    process = subprocess.Popen(_command(head32_model_dir, out, vllm_python), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 400
        while not (out / "checkpoints" / "step_000002" / "trainer_state.pt").exists():
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the run did not checkpoint step 2"
            started.update(_descendants(process.pid))
            time.sleep(0.5)
        started.update(_descendants(process.pid))
        assert any("vllm_server" in cmd for cmd in started.values()), started
        os.kill(process.pid, signal.SIGKILL)        # the trainer alone: the engine must notice its parent died
        process.communicate(timeout=60)
        time.sleep(10)
        alive = {pid: cmd for pid, cmd in started.items() if Path(f"/proc/{pid}").exists()}
        assert alive == {}, f"processes of the killed run still alive: {alive}"
    finally:
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    resumed = subprocess.run(_command(head32_model_dir, out, vllm_python, "trainer.resume=true"),
                             capture_output=True, text=True, timeout=500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4], "every step logged once"
    assert [r["async/version"] for r in rows] == [0, 0, 1, 2]
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1, 1]
    assert _comparable(rows) == _comparable(read_metrics(tmp_path / "straight"))
