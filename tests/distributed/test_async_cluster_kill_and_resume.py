"""An asynchronous run on Ray rollout workers (`rollout.max_staleness=1`, `cluster.rollout_workers=2`) killed with
SIGKILL after a checkpoint, then resumed: every step is logged once, the batches follow the staleness schedule
v(s) = max(0, s − 1) across the kill (the in-flight batch saved with the checkpoint is trained as it was), and no
Ray process of the killed run outlives it (issue 59: a combination the probe did not reach). Slow (two fresh local
clusters in child processes, ~3 min on 2 cores):
`pytest -m slow tests/distributed/test_async_cluster_kill_and_resume.py`.
"""

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


def _command(model_dir, out, *extra):
    return [sys.executable, "-m", "literl.cli", "train", f"model.path={model_dir}", f"trainer.output_dir={out}",
            "trainer.steps=4", "trainer.save_every=1", "rollout.prompts_per_step=4", "rollout.group_size=2",
            "rollout.max_new_tokens=8", "eval.before=false", "eval.every=0", "eval.limit=2", "eval.samples=1",
            "eval.greedy=false", "trainer.progress=false", "data.size=64", "cluster.address=local",
            "cluster.trainer_ranks=1", "cluster.rollout_workers=2", "rollout.max_staleness=1", *extra]


@pytest.mark.slow
def test_kill_9_of_an_async_cluster_run_resumes_on_schedule(tiny_qwen3_dir, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    out = tmp_path / "run"
    process = subprocess.Popen(_command(tiny_qwen3_dir, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_000002" / "trainer_state.pt").exists():
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the run did not checkpoint step 2"
            started.update(_descendants(process.pid))
            time.sleep(0.5)
        started.update(_descendants(process.pid))
        assert any(cmd.startswith("ray::") for cmd in started.values()), started
        os.killpg(os.getpgid(process.pid), signal.SIGKILL)
        process.communicate(timeout=60)
        time.sleep(10)
        alive = {pid: cmd for pid, cmd in started.items() if Path(f"/proc/{pid}").exists()}
        assert alive == {}, f"processes of the killed run still alive: {alive}"
    finally:
        for pid in started:         # whatever the assertions found, nothing of this test is left running
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    killed_at = [r["step"] for r in read_metrics(out)]
    assert killed_at[:2] == [1, 2]
    resumed = subprocess.run(_command(tiny_qwen3_dir, out, "trainer.resume=true"), capture_output=True, text=True,
                             timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4], "every step logged once"
    assert [r["async/version"] for r in rows] == [0, 0, 1, 2]
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1, 1]
    assert all(r["async/dropped_rows"] == 0 for r in rows)
    assert (out / "summary.json").is_file() and (out / "final").is_dir()
