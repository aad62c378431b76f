"""Keep freed host memory in the process for reuse, instead of handing it back to the OS after every step.

Why: an RL step allocates and frees the same large CPU tensors every time (activations and gradients of tens
of MB). glibc's malloc serves blocks above its mmap threshold with fresh `mmap`s and gives them back on free,
and trims the top of its heap once more than 128 KiB there is free; the next step's blocks then come from
pages the kernel must fault in and zero again. On the step-speed benchmark's update (CPU, one pass over
6.4k tokens) that was 14k-70k page faults and 20-90 ms of system time per step. With the thresholds raised,
the update took none, and the step ran faster (results/benchmarks/2026-11-24_cpu_step-vs-trl.md).

The cost: the process keeps its peak heap (freed blocks stay mapped for the next allocation, resident set
size no longer falls between steps). Blocks above 32 MiB, glibc's largest mmap threshold, still come from
`mmap`. Other allocators (macOS, musl, a preloaded jemalloc or tcmalloc) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc caps M_MMAP_THRESHOLD at HEAP_MAX_SIZE / 2 (32 MiB on 64-bit) and rejects larger values.
MMAP_THRESHOLD_BYTES = 32 << 20
# Free memory at the heap's top given back to the OS only above this (the largest value mallopt takes).
TRIM_THRESHOLD_BYTES = (1 << 31) - 1


@functools.cache
def retain_freed_host_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once; a process-wide setting, like
    `torch.set_num_threads`). Returns whether they were set: False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()         # absent outside glibc: AttributeError
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
