"""`literl ablate --cluster`: the planned runs as Ray tasks on a real local cluster with logical GPUs declared,
on the runner tests' stand-in trainer (tests/arena/fake_trainer.py). Faults are real: a task's worker killed
with SIGKILL mid-run, and the runner itself killed and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from literl.arena.runner import AblationRunner, steps_logged
from literl.arena.spec import parse_spec
from literl.distributed.cluster import ClusterError

FAKE_TRAINER = Path(__file__).parents[1] / "arena" / "fake_trainer.py"
STEPS = 6
REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def gpu_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    # 4 logical CPUs and 4 logical GPUs: Ray schedules and assigns them (CUDA_VISIBLE_DEVICES) without hardware.
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def fake_python(tmp_path) -> str:
    path = tmp_path / "fake-python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_TRAINER}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def plan(out: Path, seeds=2, variants=None):
    spec = parse_spec({"preset": "lite_ppo", "baseline": "a", "seeds": seeds, "base": {"trainer.steps": STEPS},
                       "variants": variants or {"a": {}, "b": {}}}, source="t.yaml")
    return spec.plan(out)


def quiet() -> Console:
    return Console(record=True, width=200, file=open(os.devnull, "w"))


def on_cluster(runs, python, **kwargs):
    """The Ray workers started with the cluster, before a test set its FAKE_* variables: they are passed on."""
    from literl.distributed.arena_dispatch import run_on_cluster

    console = quiet()
    fake = {k: v for k, v in os.environ.items() if k.startswith("FAKE_")}
    outcome = run_on_cluster(runs, {r.directory: STEPS for r in runs}, python=python, console=console,
                             poll_seconds=0.1, env_vars=fake, **kwargs)
    return outcome, console.export_text()


def final_accuracy(run) -> float:
    return [json.loads(line) for line in (run.directory / "eval.jsonl").read_text().splitlines()][-1][
        "testbed/accuracy"]


def test_runs_get_disjoint_gpus_and_the_same_metrics_as_the_local_runner(gpu_cluster, tmp_path, fake_python,
                                                                          monkeypatch):
    """4 runs, 2 logical GPUs each, on 4 GPUs: two at a time; any two that overlapped saw different GPU pairs;
    each run's final accuracy (the fake trainer's 0.5 + 0.01·seed + the FAKE_EFFECT noise) equals the local
    runner's on the same plan. The live table ends with every run finished and its node."""
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.1")
    monkeypatch.setenv("FAKE_EFFECT", "b:-0.1")
    runs = plan(tmp_path / "cluster")
    outcome, text = on_cluster(runs, fake_python, gpus_per_run=2, cpus_per_run=1)
    assert outcome.exit_code == 0 and len(outcome.finished) == 4
    spans = [json.loads((r.directory / "devices.jsonl").read_text().splitlines()[-1]) for r in runs]
    assert all(len(s["devices"].split(",")) == 2 for s in spans)
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if b["start"] < a["end"] and a["start"] < b["end"]:
                assert set(a["devices"].split(",")).isdisjoint(b["devices"].split(","))
    node = json.loads((runs[0].directory / "placement.json").read_text())["node"]
    assert "finished" in text and node in text and f"{STEPS}/{STEPS}" in text
    local = plan(tmp_path / "local")
    local_runner = AblationRunner(local, {r.directory: STEPS for r in local}, jobs=2, threads=2, console=quiet(),
                                  python=fake_python)
    assert local_runner.run().exit_code == 0
    assert [final_accuracy(r) for r in runs] == [final_accuracy(r) for r in local]
    assert len({final_accuracy(r) for r in runs}) == 4


def test_a_node_that_cannot_see_the_folder_is_refused_by_name(gpu_cluster, tmp_path):
    """The probe file is not written (as if the folder were local to this machine): every node is blind to it."""
    from literl.distributed.arena_dispatch import check_shared_storage

    with pytest.raises(ClusterError, match=r"not visible from node\(s\) .*storage every node mounts"):
        check_shared_storage(gpu_cluster, tmp_path / "abl", write_token=lambda path, token: None)
    check_shared_storage(gpu_cluster, tmp_path / "abl")          # written: the one node sees it
    assert not list((tmp_path / "abl").glob(".storage-probe-*"))


def test_a_run_larger_than_any_node_is_refused_before_it_runs(gpu_cluster, tmp_path, fake_python):
    with pytest.raises(ClusterError, match="asks for 1 CPUs and 8 GPUs.*no node"):
        on_cluster(plan(tmp_path / "o", seeds=1), fake_python, gpus_per_run=8)


def test_a_killed_worker_is_retried_and_its_run_resumes_from_its_checkpoint(gpu_cluster, tmp_path, fake_python,
                                                                            monkeypatch):
    """SIGKILL to the Ray worker running a/default/seed_0 after its second step: the trainer child gets SIGTERM
    (parent death), checkpoints and exits; Ray retries the task (attempt 2), which resumes from that step. Every
    step 1..6 is logged exactly once and the run finishes."""
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.4")
    runs = plan(tmp_path / "out", seeds=1)
    victim = runs[0].directory
    killed = []

    def kill_when_training():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            placement = victim / "placement.json"
            if placement.is_file() and steps_logged(victim) >= 2:
                pid = json.loads(placement.read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_training)
    killer.start()
    outcome, _ = on_cluster(runs, fake_python, cpus_per_run=1)
    killer.join()
    assert killed and outcome.exit_code == 0 and len(outcome.finished) == 2
    placement = json.loads((victim / "placement.json").read_text())
    assert placement["attempt"] == 2 and placement["pid"] != killed[0] and placement["start_step"] >= 2
    steps = [json.loads(line)["step"] for line in (victim / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    assert len((victim / "launches.txt").read_text().splitlines()) == 2


def wait_until_quiet(runs, quiet_s: float = 5.0, limit_s: float = 90.0) -> None:
    """Until no run's metrics.jsonl has grown for `quiet_s` seconds."""
    def sizes():
        return [(r.directory / "metrics.jsonl").stat().st_size if (r.directory / "metrics.jsonl").exists() else 0
                for r in runs]
    last, since, start = sizes(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - start < limit_s:
        time.sleep(0.5)
        now = sizes()
        if now != last:
            last, since = now, time.monotonic()


def _checkpointed_step(run_dir: Path) -> int:
    latest = run_dir / "checkpoints" / "latest"
    return int(latest.read_text().split("_")[1]) if latest.is_file() else 0


DRIVER = """
import sys, ray
from pathlib import Path
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from test_arena_dispatch import plan, STEPS
from literl.distributed.arena_dispatch import run_on_cluster
ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
runs = plan(Path({out!r}))
outcome = run_on_cluster(runs, {{r.directory: STEPS for r in runs}}, python={python!r}, cpus_per_run=1,
                         poll_seconds=0.1)
print("FINISHED", len(outcome.finished), "SKIPPED", len(outcome.skipped), flush=True)
"""


def test_a_killed_runner_restarted_skips_finished_runs_and_resumes_the_others(tmp_path, fake_python):
    """The runner (a driver with its own local cluster) is SIGKILLed with its process group once 2 runs finished and
    another has logged a step; its cluster and workers go with it (the trainers checkpoint every step). Started
    again, it skips the finished runs, resumes the interrupted ones from their checkpoints, and every run ends
    with steps 1..6 logged once."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(repo=str(REPO), tests=str(Path(__file__).parent), out=str(out),
                                    python=fake_python))
    env = {**os.environ, "FAKE_STEP_SECONDS": "2.0", "FAKE_CHECKPOINT_EVERY": "1", "PYTHONPATH": str(REPO)}
    runs = plan(out)
    first = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        done = [r for r in runs if (r.directory / "summary.json").is_file()]
        started = [r for r in runs if r not in done and steps_logged(r.directory) >= 1]
        if len(done) >= 2 and started:
            break
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)      # the runner and the cluster it started, at once
    first.wait()
    wait_until_quiet(runs)     # the trainers stop when their workers die (SIGTERM), saving or not
    interrupted = [r for r in runs if not (r.directory / "summary.json").is_file()]
    # A run that had checkpointed a step when the runner died resumes from it; one that had not (possible on a
    # loaded machine: the kill comes as soon as one unfinished run logged a step) starts again from step 0.
    checkpointed = [r for r in interrupted if _checkpointed_step(r.directory) > 0]
    assert checkpointed, "the kill came after an unfinished run had logged (and checkpointed) a step"
    assert 1 <= len(interrupted) <= 2
    second = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert "FINISHED" in second.stdout, second.stdout + second.stderr
    assert f"SKIPPED {4 - len(interrupted)}" in second.stdout
    for run in runs:
        steps = [json.loads(line)["step"] for line in (run.directory / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, STEPS + 1)) and (run.directory / "summary.json").is_file()
    resumed = [r for r in interrupted if "from step 0" not in (r.directory / "train.log").read_text().splitlines()[-1]]
    assert resumed == checkpointed, "every run that had checkpointed a step resumes from it"
    try:
        os.killpg(first.pid, signal.SIGKILL)    # what of the first cluster outlived its driver
    except ProcessLookupError:
        pass


def test_a_run_that_starts_its_own_actors_joins_this_cluster_and_leaves_it_the_resources(gpu_cluster, tmp_path,
                                                                                          fake_python):
    """Variant `ray` sets cluster.address=local: its task asks for 1 CPU and no GPU (not --gpus-per-run 4, which
    would leave its own actors nothing), and its command line ends with cluster.address=<this cluster's GCS>, so
    its actors are scheduled here. Variant `a` gets the 4 GPUs it asks for."""
    from literl.distributed.arena_dispatch import cluster_address

    runs = plan(tmp_path / "o", seeds=1, variants={"a": {}, "ray": {"cluster.address": "local"}})
    outcome, _ = on_cluster(runs, fake_python, gpus_per_run=4, cpus_per_run=1)
    assert outcome.exit_code == 0
    plain, driver = (json.loads((r.directory / "placement.json").read_text()) for r in runs)
    assert len(plain["gpus"]) == 4 and driver["gpus"] == []
    launched = (runs[1].directory / "launches.txt").read_text().split()
    assert launched[-1] == f"cluster.address={cluster_address(gpu_cluster)}" and "cluster.address=local" in launched
    assert "cluster.address" not in (runs[0].directory / "launches.txt").read_text()
