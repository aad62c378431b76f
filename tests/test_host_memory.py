"""`literl.run.host_memory`: with the thresholds raised, a step's freed blocks serve the next step without page
faults. Each case runs in a fresh interpreter: the setting is process-wide and cannot be undone."""

import subprocess
import sys

import pytest

from literl.run.host_memory import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc's malloc only")

# Nine "steps" whose tensors change size from step to step (ten blocks of 4, 8 or 12 MiB, allocated, written and
# freed), as a training step's activations do; prints the page faults of each step.
_STEPS = """
import resource, sys, torch
if sys.argv[1] == "retain":
    from literl.run.host_memory import retain_freed_host_memory
    assert retain_freed_host_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(9):
    before = faults()
    blocks = [torch.ones((1 + step % 3) << 20) for _ in range(10)]
    del blocks
    print(faults() - before)
"""


def _faults_per_step(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, check=True)
    return [int(line) for line in out.stdout.split()]


def test_freed_blocks_are_reused_without_page_faults():
    default, retained = _faults_per_step("default"), _faults_per_step("retain")
    # After the first steps have reached the largest size: glibc's default still maps and unmaps blocks as the
    # sizes change (seen: ~54k faults over these six steps, 4 KiB pages), the retained heap serves them.
    late_default, late_retained = sum(default[3:]), sum(retained[3:])
    if late_default < 20_000:
        pytest.skip(f"this glibc's default does not fault on these steps ({default}): nothing to compare")
    assert late_retained < late_default / 4, f"freed blocks were not reused: faults per step {retained}"
