"""The `python` tool: the model's code run in an isolated, resource-limited subprocess.

Each call gets a fresh process and a fresh, empty working directory, and returns the code's stdout and
stderr (interleaved, as a terminal shows them) as the observation. Whatever the code does, the call returns
a `ToolOutput` text within about `wall_s`; timeouts, crashes, tracebacks and broken limits are described in
that text (status "timeout" or "error"), never raised.

Limits (`SandboxLimits`): wall-clock time (the parent kills the sandbox), CPU time, address space, size of any
file written, number of processes, bytes of output read back.

Isolation, "namespaced" (used when the process is root and `unshare` works, as on literl's CI and
containers; probed once, `sandbox_isolation()`):
- no network: a fresh network namespace with only a loopback that is down;
- its own PID namespace: no process outside is visible or can be signalled, and when the sandbox ends every
  process the code started ends with it (fork bombs included);
- an unprivileged user id of its own per call (RLIMIT_NPROC then bounds its processes);
- every mount read-only, private tmpfs over /tmp, /var/tmp, /dev/shm and /run/lock (the working directory is
  /tmp/work inside it); a folder closed to other users on the interpreter's path (/root) is hidden behind an
  empty tmpfs, and only the interpreter's own folders (its venv, its installation) are bound back, read-only;
- a clean environment (PATH, HOME, LANG only): nothing of the trainer's environment (tokens, keys) is passed.

"basic" (not root, or no `unshare`): the limits, the clean environment and a fresh temporary working directory
only. The code then runs as the trainer's user: it can reach the network, write where that user can, and
signal that user's processes. Use basic mode only for code you trust, or run literl inside a container as
root (then namespaced mode applies). `PythonSandbox(isolation="namespaced")` refuses to start where
namespaced mode is unavailable instead of falling back.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from literl.tools.calls import ToolOutput

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
UNSHARE = ("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc")
FIRST_SANDBOX_UID = 200_000           # user ids no account uses: one per call, so limits and files don't mix
_uids = itertools.count()
_SIGNAL_MEANING = {signal.SIGXCPU: "its CPU time limit", signal.SIGKILL: "SIGKILL (e.g. its CPU time limit)",
                   signal.SIGXFSZ: "its file size limit", signal.SIGSEGV: "a segmentation fault"}


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024          # address space (RLIMIT_AS): numpy/sympy imports need a few hundred MB
    file_size_mb: int = 16
    max_processes: int = 32
    max_output_bytes: int = 16_384
    tmpfs_mb: int = 64             # namespaced mode: size of the private /tmp (the working directory's room)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0 (got {value})")


@functools.lru_cache(maxsize=1)
def sandbox_isolation() -> str:
    """"namespaced" where this process may use namespaces (root and a working `unshare`), else "basic"."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("unshare") is None:
        return "basic"
    try:
        probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "basic"
    return "namespaced" if probe.returncode == 0 else "basic"


class PythonSandbox:
    """Runs code under `limits`; `isolation` is "auto" (namespaced where available), "namespaced" or "basic"."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, isolation: str = "auto",
                 python: str = sys.executable):
        if isolation not in ("auto", "namespaced", "basic"):
            raise ValueError(f"isolation must be 'auto', 'namespaced' or 'basic' (got {isolation!r})")
        available = sandbox_isolation()
        if isolation == "namespaced" and available != "namespaced":
            raise ValueError("namespaced isolation needs root and a working `unshare` (util-linux); this process "
                             f"has uid {os.geteuid()}. Run inside a container as root, or pass isolation='basic' "
                             "for trusted code (literl.tools.sandbox explains what basic mode leaves open)")
        self.limits = limits
        self.isolation = available if isolation == "auto" else isolation
        self.python = python

    def run(self, code: str) -> ToolOutput:
        """The observation for `code`: its output, and what stopped it when it did not end normally."""
        limits = self.limits
        status_read, status_write = os.pipe()
        workdir = None
        config = {"mode": self.isolation, "status_fd": status_write, "python": self.python,
                  "interpreter_dirs": _interpreter_dirs(self.python), "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
                  "file_size_mb": limits.file_size_mb, "tmpfs_mb": limits.tmpfs_mb,
                  "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}}
        if self.isolation == "namespaced":
            config.update(uid=FIRST_SANDBOX_UID + (os.getpid() * 1000 + next(_uids)) % 100_000,
                          max_processes=limits.max_processes)
            config["env"]["HOME"] = "/tmp/work"
            command = [*UNSHARE, self.python, "-I", "-S", str(LAUNCHER), json.dumps(config)]
        else:
            workdir = tempfile.mkdtemp(prefix="literl-python-")
            # RLIMIT_NPROC counts all of the user's processes: in basic mode the code runs as the trainer's user,
            # so the cap is the user's current count plus the sandbox's allowance.
            config.update(workdir=workdir, max_processes=0 if os.geteuid() == 0 else
                          _user_process_count() + limits.max_processes)
            config["env"]["HOME"] = workdir
            command = [self.python, "-I", "-S", str(LAUNCHER), json.dumps(config)]
        try:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, pass_fds=[status_write], start_new_session=True,
                                       env={"PATH": config["env"]["PATH"], "LANG": "C.UTF-8"})
        except OSError as exc:
            os.close(status_read)
            os.close(status_write)
            return ToolOutput(f"Error: the sandbox could not start ({exc})", "error")
        os.close(status_write)
        try:
            return self._collect(process, code, status_read)
        finally:
            os.close(status_read)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _collect(self, process: subprocess.Popen, code: str, status_read: int) -> ToolOutput:
        limits = self.limits
        deadline = time.monotonic() + limits.wall_s
        try:
            process.stdin.write(code.encode("utf-8", "replace"))
            process.stdin.close()
        except BrokenPipeError:
            pass
        output, stopped = bytearray(), None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    stopped = f"Error: the code ran past its {limits.wall_s:g} s wall-clock limit and was stopped"
                    break
                if not selector.select(timeout=remaining):
                    continue
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                output += chunk
                if len(output) > limits.max_output_bytes:
                    stopped = (f"Error: the output passed {limits.max_output_bytes} bytes; the code was stopped "
                               "and its output cut there")
                    break
        if stopped is not None:
            _kill_group(process)
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
        process.stdout.close()
        text = output[:limits.max_output_bytes].decode("utf-8", "replace")
        if stopped is not None:
            return ToolOutput(_join(text, stopped), "timeout" if "wall-clock" in stopped else "error")
        status = _read_status(status_read)
        if status is None:
            return ToolOutput(_join(text, "Error: the sandbox ended before the code finished (exit code "
                                          f"{process.returncode})"), "error")
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            meaning = _SIGNAL_MEANING.get(number, "a signal")
            return ToolOutput(_join(text, f"Error: the code was killed by {name} ({meaning})"),
                              "timeout" if number in (signal.SIGXCPU, signal.SIGKILL) else "error")
        exit_code = os.WEXITSTATUS(status)
        if exit_code != 0:
            return ToolOutput(_join(text, f"(exit code {exit_code})"), "error")
        return ToolOutput(text if text.strip() else "(no output)", "ok")


def _interpreter_dirs(python: str) -> list[str]:
    """The folders the interpreter needs: its environment (a venv: the folder holding bin/python and
    pyvenv.cfg) and the installation the executable resolves to, outermost first, without nesting."""
    candidates = {os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(python)))),
                  os.path.realpath(os.path.dirname(os.path.dirname(os.path.realpath(python))))}
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        candidates |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    ordered = sorted(candidates, key=len)
    return [d for i, d in enumerate(ordered) if not any(d.startswith(o + "/") for o in ordered[:i])]


def _join(text: str, note: str) -> str:
    return f"{text.rstrip()}\n{note}" if text.strip() else note


def _kill_group(process: subprocess.Popen) -> None:
    # Namespaced: killing `unshare` kills the launcher (--kill-child), PID 1 of the namespace, and with it every
    # process inside. Basic: the launcher and the code share the session's process group.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_status(fd: int) -> int | None:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return None
    if not data:
        return None
    return int(json.loads(data)["status"])


def _user_process_count() -> int:
    uid = os.geteuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


@functools.lru_cache(maxsize=1)
def _default_sandbox() -> PythonSandbox:
    return PythonSandbox()


def python(code: str) -> str:
    """Run Python code in a sandbox and return what it prints (stdout and stderr).

    Args:
        code: a complete Python program; print the values you want to see
    """
    return _default_sandbox().run(code)
