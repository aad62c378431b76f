"""A local Ray cluster for each distributed test module: real Ray, real torch.distributed over gloo, nothing
mocked; shut down after the module, so that the rest of the suite runs without Ray's processes.

Ray is an optional part: `./run.sh test` installs it (`literl[ray]`); without it these tests skip, saying so."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    # Logical CPUs: every actor asks for one, and several share this machine's cores.
    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()
