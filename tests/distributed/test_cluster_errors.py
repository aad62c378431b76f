"""What a user sees when the cluster cannot be had: Ray not installed, or nothing at cluster.address. Both fail
within seconds, before the model loads, with the fix in the message."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from literl.config.load import load_config


def test_without_ray_the_error_names_the_install_command(monkeypatch):
    from literl.distributed import ClusterError, connect

    monkeypatch.setitem(sys.modules, "ray", None)       # `import ray` raises ImportError, as when not installed
    cfg = load_config(overrides=["cluster.address=local"])
    with pytest.raises(ClusterError, match=r"Ray is not installed: pip install 'literl\[ray\]'"):
        connect(cfg.cluster)


def test_an_unreachable_cluster_address_fails_fast_naming_the_address(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "literl.cli", "train", "model.testbed=micro",
                             f"trainer.output_dir={tmp_path / 'run'}", f"cluster.address=127.0.0.1:{port}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"no Ray cluster answers at cluster.address='127.0.0.1:{port}'" in result.stderr
    assert "ray start --head" in result.stderr and "cluster.address=local" in result.stderr
    assert not (tmp_path / "run" / "config.yaml").exists(), "a start that failed leaves no run behind"
    assert time.monotonic() - start < 120


class _RecordingRay:
    """Stands in for the `ray` module: records ray.init's arguments, starts nothing."""

    def __init__(self):
        self.inits = []

    def is_initialized(self):
        return False

    def init(self, **kwargs):
        self.inits.append(kwargs)


def test_a_local_cluster_far_larger_than_the_machine_is_warned_about(monkeypatch):
    """Issue 31.18: 64 trainer ranks + 64 rollout workers on a 2-core machine started 88+ processes without a word
    (and no step came in 200 s). A local cluster asking for more CPUs than this machine may use warns, with the
    numbers and the keys; one that fits does not."""
    import warnings

    import literl.distributed.cluster as cluster_module

    fake = _RecordingRay()
    monkeypatch.setattr(cluster_module, "import_ray", lambda: fake)
    monkeypatch.setattr(cluster_module, "available_cpus", lambda: 2)
    monkeypatch.setattr(cluster_module.atexit, "register", lambda *args: None)
    big = load_config(overrides=["cluster.address=local", "cluster.trainer_ranks=64", "cluster.rollout_workers=64"])
    with pytest.warns(cluster_module.ClusterWarning,
                      match=r"64 trainer ranks \+ 64 rollout workers.*128 CPUs.*2 CPUs.*cluster.trainer_ranks"):
        cluster_module.connect(big.cluster)
    fitting = load_config(overrides=["cluster.address=local", "cluster.trainer_ranks=1", "cluster.rollout_workers=1"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", cluster_module.ClusterWarning)
        cluster_module.connect(fitting.cluster)
    assert len(fake.inits) == 2
