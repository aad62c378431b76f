"""GPUs for the runs of one machine (`--gpus-per-run`): disjoint groups, as many runs at once as the groups, a run
that needs more devices than exist refused at planning. The device list is declared, so this runs on a CPU."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

from literl.arena.devices import device_groups, visible_devices
from literl.arena.runner import AblationRunner
from literl.config.errors import ConfigError
from tests.arena.test_runner import STEPS, fake_python, plan  # noqa: F401  (fake_python is a fixture)


def test_eight_devices_in_pairs_are_four_disjoint_groups_in_order():
    """8 devices, 2 per run: (0,1) (2,3) (4,5) (6,7); 3 per run: (0,1,2) (3,4,5), devices 6 and 7 idle."""
    devices = [str(i) for i in range(8)]
    assert device_groups(devices, 2) == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert device_groups(devices, 3) == [("0", "1", "2"), ("3", "4", "5")]
    assert device_groups(["4", "7"], 1) == [("4",), ("7",)]


def test_a_run_needing_more_devices_than_exist_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"needs 3 GPUs but this machine shows 2 \(0, 1\).*at most 2"):
        device_groups(["0", "1"], 3)
    with pytest.raises(ConfigError, match="no CUDA device is visible"):
        device_groups([], 1)
    with pytest.raises(ConfigError, match="must be >= 1"):
        device_groups(["0"], 0)


def test_the_device_list_comes_from_the_option_then_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert visible_devices() == ["2", "3", "5"]
    assert visible_devices("0, 1") == ["0", "1"]
    with pytest.raises(ConfigError, match="names a device twice"):
        visible_devices("0,0")


def test_runs_train_on_disjoint_groups_and_the_rest_wait(tmp_path, fake_python, monkeypatch):
    """6 runs on 4 declared devices, 2 per run: 2 groups, so 2 runs at a time. Every run sees exactly one group;
    any two runs that overlapped in time saw different groups; no more than 2 ran at once."""
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.15")
    runs = plan(tmp_path / "out", variants={"a": {}, "b": {}, "c": {}}, seeds=2)
    groups = device_groups(["0", "1", "2", "3"], 2)
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    runner = AblationRunner(runs, {r.directory: STEPS for r in runs}, jobs=8, threads=2, console=console,
                            python=fake_python, device_groups=groups)
    assert runner.jobs == 2 and runner.threads == 1
    outcome = runner.run()
    assert outcome.exit_code == 0 and len(outcome.finished) == 6
    spans = [json.loads((r.directory / "devices.jsonl").read_text().splitlines()[-1]) for r in runs]
    assert {s["devices"] for s in spans} <= {"0,1", "2,3"}
    for i, a in enumerate(spans):
        overlapping = [b for b in spans[i + 1:] if b["start"] < a["end"] and a["start"] < b["end"]]
        assert all(b["devices"] != a["devices"] for b in overlapping)
        assert len(overlapping) <= 1 or all(b["devices"] == overlapping[0]["devices"] for b in overlapping)
    assert "on GPU 0,1" in console.export_text()
