"""One local Ray cluster for the distributed tests (real Ray, real torch.distributed over gloo; nothing mocked).

Ray is an optional part: `./run.sh test` installs it (`literl[ray]`); without it these tests skip, saying so."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'literl[ray]' (./run.sh test does)")
    # Logical CPUs: every actor asks for one, and several share this machine's cores.
    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()
