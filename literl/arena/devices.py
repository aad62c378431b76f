"""Giving each run of an ablation its own GPUs on one machine (`literl ablate --gpus-per-run K`).

The machine's visible devices (`--devices`, else $CUDA_VISIBLE_DEVICES, else every CUDA device torch counts) are
cut into disjoint groups of K, in order: 8 devices and K = 2 give (0,1) (2,3) (4,5) (6,7), so four runs train at
once and the others wait for a group to free up. A run sees only its group, as `CUDA_VISIBLE_DEVICES`, and calls
it cuda:0..K-1. Devices left over (8 devices, K = 3: 6 and 7) stay idle rather than be shared: two runs on one
device would fight over its memory and time each other's steps.
"""

from __future__ import annotations

import os

from literl.config.errors import ConfigError

DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def visible_devices(listed: str | None = None) -> list[str]:
    """The device ids runs may be given: `listed` ('0,1,2,3'), else $CUDA_VISIBLE_DEVICES, else 0..n-1 for the n
    CUDA devices torch sees (none on a CPU machine)."""
    text = listed if listed is not None else os.environ.get(DEVICES_ENV)
    if text is not None:
        ids = [part.strip() for part in text.split(",") if part.strip()]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"the device list '{text}' names a device twice; list each once (e.g. 0,1,2,3)")
        return ids
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def device_groups(devices: list[str], gpus_per_run: int) -> list[tuple[str, ...]]:
    """Disjoint groups of `gpus_per_run` devices, in order; refused when one run needs more than there are."""
    if gpus_per_run < 1:
        raise ConfigError(f"--gpus-per-run must be >= 1, got {gpus_per_run}")
    if gpus_per_run > len(devices):
        seen = f"{len(devices)} ({', '.join(devices)})" if devices else "none"
        raise ConfigError(
            f"each run needs {gpus_per_run} GPUs but this machine shows {seen}. Lower --gpus-per-run to at most "
            f"{len(devices)}, make more devices visible (--devices 0,1,... or {DEVICES_ENV}), or send the runs to "
            "a cluster with more GPUs per node (--cluster ADDRESS)" if devices else
            f"each run needs {gpus_per_run} GPUs but no CUDA device is visible here. Run on a GPU machine, list "
            f"the devices (--devices 0,1,... or {DEVICES_ENV}), or leave --gpus-per-run out to train on the CPU")
    count = len(devices) // gpus_per_run
    return [tuple(devices[i * gpus_per_run:(i + 1) * gpus_per_run]) for i in range(count)]
