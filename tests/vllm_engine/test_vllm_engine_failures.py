"""A vLLM engine that hangs or dies mid-run, on a real engine (issue 31.5 and 31.6): the run stops within the
request's deadline with a message that says what happened, quotes only what the engine logged during that request,
and keeps the last checkpoint; nothing misdirects to `./run.sh vllm-setup`.

A hung engine is simulated by SIGSTOP of its process, a dead one by SIGKILL. Deadlines here are seconds (the
default, rollout.vllm.call_timeout_s=3600, is meant for real generations)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from literl.cli import main
from literl.rewards import time_bounded
from literl.rollout.engine import SamplingParams
from literl.run.metrics_log import read_metrics
from tests.vllm_engine.conftest import EOS_IDS, PAD_ID, vllm_tiny_qwen3
from tests.vllm_engine.test_vllm_training import head32_model_dir  # noqa: F401 - a fixture


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(") ")[2][:1] == "Z"
    except FileNotFoundError:
        return True


def test_a_stopped_engine_is_killed_at_the_request_deadline(vllm_python, tmp_path):
    """Before: `kill -STOP` of the engine hung the run forever, without a message."""
    from literl.rollout.vllm_engine import VllmEngine, VllmEngineError

    log = tmp_path / "engine.log"
    engine = VllmEngine(vllm_tiny_qwen3().eval(), eos_token_ids=EOS_IDS, pad_id=PAD_ID, dtype=torch.float32,
                        python=vllm_python, kv_cache_gib=0.25, log_path=str(log), call_timeout_s=3)
    pid = engine.process.proc.pid
    try:
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(VllmEngineError) as raised:
            engine.generate([[2, 11, 12]], SamplingParams(max_new_tokens=4), rng=torch.Generator().manual_seed(0))
        elapsed = time.monotonic() - start
    finally:
        engine.close()
    message = str(raised.value)
    assert f"(pid {pid}) has been stopped" in message and "'generate'" in message and "killed" in message
    assert str(log) in message and "vllm-setup" not in message
    assert elapsed < 3 + 10
    assert _gone(pid)


def _engine_pid() -> int:
    """The pid of the run's vLLM engine: the newest child of this process running literl.rollout.vllm_server (the
    test session's shared engine is an older one)."""
    engines = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(") ")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"literl.rollout.vllm_server" in command:
            engines.append((int(fields[19]), int(entry)))       # (start time, pid)
    assert engines, "no vLLM engine process found"
    return max(engines)[1]


@time_bounded
def kills_the_engine_in_step_2(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Scores step 1 normally; in step 2 (after its generation, before the weight sync) it SIGKILLs the engine,
    as the out-of-memory killer would."""
    calls = kills_the_engine_in_step_2.calls = getattr(kills_the_engine_in_step_2, "calls", 0) + 1
    if calls == 5:              # the first response of step 2 (4 responses per step)
        os.kill(_engine_pid(), signal.SIGKILL)
    return min(1.0, len(response) / 10)


def test_an_engine_killed_before_a_weight_sync_is_reported_as_killed_with_the_last_checkpoint(
        vllm_python, head32_model_dir, tmp_path, capsys):
    """Before: `[Errno 2] No such file ... weights.safetensors` (the cleanup after the failed sync masked it), with
    an unrelated start-up traceback quoted from the log and the `./run.sh vllm-setup` hint."""
    kills_the_engine_in_step_2.calls = 0
    out = tmp_path / "run"
    code = main(["train", f"model.path={head32_model_dir}", "model.profile=testbed", f"trainer.output_dir={out}",
                 "trainer.steps=3", "trainer.save_every=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "data.size=16", "eval.before=false", "eval.limit=2", "eval.samples=1",
                 "trainer.progress=false", "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.25",
                 f"rollout.vllm.python={vllm_python}",
                 "reward.fns.0.fn=tests.vllm_engine.test_vllm_engine_failures:kills_the_engine_in_step_2"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "closed its connection" in err and "'load_weights'" in err and "was killed by SIGKILL" in err
    assert "No such file" not in err and "vllm-setup" not in err
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert (out / "checkpoints/step_000001").is_dir()
