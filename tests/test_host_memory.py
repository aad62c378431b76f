"""`literl.host_memory`: with the thresholds raised, a step's freed blocks serve the next step without page
faults. Each case runs in a fresh interpreter: the setting is process-wide and cannot be undone."""

import subprocess
import sys

import pytest

from literl.host_memory import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc's malloc only")

# Three rounds of "a step": ten 8 MiB tensors allocated, written and freed; prints the page faults per round.
_ROUNDS = """
import resource, sys, torch
if sys.argv[1] == "retain":
    from literl.host_memory import retain_freed_host_memory
    assert retain_freed_host_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    before = faults()
    blocks = [torch.ones(2 << 20) for _ in range(10)]
    del blocks
    print(faults() - before)
"""


def _faults_per_round(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True)
    return [int(line) for line in out.stdout.split()]


def test_freed_blocks_are_reused_without_page_faults():
    default, retained = _faults_per_round("default"), _faults_per_round("retain")
    # 80 MiB written per round is 20,480 pages of 4 KiB; glibc's default hands most of them back each round.
    assert default[2] > 4096, f"glibc's default no longer faults here ({default}): this test shows nothing"
    assert retained[2] < 256, f"freed blocks were not reused: page faults per round {retained}"
