"""Ctrl-C on a cluster run: the terminal's SIGINT reaches the whole foreground process group (the driver and the
Ray processes it started); the run finishes its step, saves a checkpoint, says how to continue, exits 130, and
leaves no Ray process behind. Slow (a fresh local cluster in a child process): `pytest -m slow`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_stops_every_actor(tiny_qwen3_dir, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "literl.cli", "train", f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}",
         "trainer.steps=500", "rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=8",
         "eval.before=false", "eval.every=0", "eval.limit=2", "eval.samples=1", "eval.greedy=false",
         "trainer.progress=false", "data.size=64", "cluster.address=local", "cluster.trainer_ranks=2",
         "cluster.rollout_workers=2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().count("\n") >= 2:
        assert process.poll() is None and time.monotonic() < deadline, "the run did not reach step 2"
        time.sleep(1)
    started = _descendants(process.pid)          # Ray's servers and its actors' worker processes among them
    assert any(cmd.startswith("ray::TrainerRank") for cmd in started.values()), started
    os.killpg(os.getpgid(process.pid), signal.SIGINT)              # what Ctrl-C in a terminal does
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 130, output[-3000:]
    assert "checkpoint saved at" in output and "trainer.resume=true" in output
    assert list((out / "checkpoints").glob("step_*/trainer_state.pt"))
    time.sleep(5)
    alive = {pid: cmd for pid, cmd in started.items() if Path(f"/proc/{pid}").exists()}
    assert alive == {}, alive


def _descendants(root: int) -> dict[int, str]:
    """Every process below `root` (children, their children, ...), by pid, with its command line."""
    parent, cmd = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parent[int(entry.name)] = int(fields[1])
            cmd[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = {}, [root]
    while frontier:
        current = frontier.pop()
        for pid, ppid in parent.items():
            if ppid == current and pid not in found:
                found[pid] = cmd[pid]
                frontier.append(pid)
    return found
