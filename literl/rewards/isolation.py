"""Call functions in persistent worker processes, each call under a hard wall-clock deadline.

Why processes: a signal-based timeout (what `math_verify` uses, `signal.alarm`) only interrupts the
interpreter between bytecodes and inside the few C loops that poll for signals. Work inside C code that
does not poll runs to the end before the alarm is seen, so the caller hangs: `sum(range(10**13))` with a
1 s alarm was still running after 20 s; gmpy2 (sympy's integers when it is installed), numpy and native
libraries called by a user reward behave the same way. An alarm also only works in the main thread, and
a crash or a MemoryError in the checker would take the caller down with it. A separate process can
always be killed: when a call overruns its deadline the worker gets SIGKILL, the call reports `timeout`,
and a fresh worker replaces it. (Measured with CPython 3.11 and no gmpy2: math-verify's own alarm did
stop `9^{9^{9^{9}}}` in-process, because CPython's big-int power and multiplication poll for signals;
the worker's deadline is what makes the bound hold everywhere.)

Cost: a worker starts once (~0.4 s, it imports sympy) and then serves calls over a socket pair, about
0.1 ms of overhead per call. Functions are named by import path (`package.module:function`) so that
nothing but plain data crosses the process boundary. Workers inherit the parent's `sys.path`.

Time bound of one call: `timeout_s` plus the kill (a few ms). Waiting for a worker to start is not
counted against a call's deadline, so a machine under load does not turn start-up into timeouts; after a
kill, a warm spare worker takes over, so only the call right after the first kill waits for a start-up.
"""

from __future__ import annotations

import atexit
import importlib
import math
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Literal, Sequence

# SIGINT ignored first thing: a Ctrl-C in the terminal reaches the whole process group, and the trainer alone
# decides what it means (finish the step, or abort); a worker would otherwise print a KeyboardInterrupt traceback.
_WORKER_ENTRY = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; "
                 "from literl.rewards.isolation import worker_main; worker_main(sys.argv[1:])")
_LOAD = "__load__"                   # message kind: import a function ahead of its first timed call
WORKER_STARTUP_TIMEOUT_S = 120.0     # generous: two shared cores under load can be slow to import sympy
_IN_WORKER = False


def running_in_worker() -> bool:
    """True inside a worker process: code there is already isolated and must not start workers itself."""
    return _IN_WORKER


def time_bounded(fn: Callable | None = None, *, timeout_counter: Callable[[], int] | None = None):
    """Mark `fn` as bounding its own run time, so that `RewardSet` calls it in-process, not in a worker.

    Contract: `fn(response, example, *, timeout_s)` returns within about `timeout_s` for any input; with
    `timeout_s=0` (the step's checking budget is spent) it runs only its cheap checks and counts the ones it
    skipped as timeouts. `timeout_counter`, if given, returns a cumulative count of the function's internal
    timeouts, which `RewardSet` reports per batch.
    """
    def mark(function: Callable) -> Callable:
        function.time_bounded = True
        function.timeout_counter = timeout_counter
        return function

    return mark(fn) if fn is not None else mark


@dataclass(frozen=True)
class CallOutcome:
    status: Literal["ok", "timeout", "error"]
    value: Any = None
    error: str = ""


def resolve_function(path: str) -> Callable:
    """Import `package.module:function` and return the function; errors say what is wrong and how to fix it."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"function path {path!r} must look like 'package.module:function' "
                         "(a colon between the module and the function name)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} named in {path!r}: {exc}. Check the spelling, "
                         "and that the module is on PYTHONPATH (or installed)") from exc
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ValueError(f"module {module_name!r} has no function {attr!r} (named in {path!r}); "
                             f"its public callables: {', '.join(public) or '(none)'}")
    if not callable(fn):
        raise ValueError(f"{path!r} names a {type(fn).__name__}, not a function")
    return fn


class _Worker:
    """One child process and the parent's end of its socket."""

    def __init__(self, memory_limit_mb: int | None, preload: Sequence[str]):
        parent_end, child_end = socket.socketpair()
        command = [sys.executable, "-c", _WORKER_ENTRY, str(child_end.fileno()), str(memory_limit_mb or 0),
                   ",".join(preload)]
        self.process = subprocess.Popen(command, pass_fds=[child_end.fileno()], env=_child_environment(),
                                        stdin=subprocess.DEVNULL)
        child_end.close()
        self.conn = Connection(parent_end.detach())
        self.ready = False
        self.loaded: set[str] = set()

    def wait_ready(self, within: float = math.inf) -> bool:
        """Wait for the worker to start; False if it is still starting after `within` seconds (when that is
        shorter than the start-up limit, past which the worker is killed and this raises)."""
        if self.ready:
            return True
        if within < WORKER_STARTUP_TIMEOUT_S:
            if not self.conn.poll(max(0.0, within)):
                return False
        elif not self.conn.poll(WORKER_STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"an isolated worker did not start within {WORKER_STARTUP_TIMEOUT_S:.0f} s")
        message = self.conn.recv()
        if message[0] != "ready":
            raise RuntimeError(f"an isolated worker failed to start: {message}")
        self.ready = True
        return True

    def ensure_loaded(self, fn_path: str) -> None:
        """Import the function before its first timed call: importing a user's module (which may pull in
        torch or transformers) is start-up work, not part of any response's time budget."""
        if fn_path in self.loaded:
            return
        self.conn.send((_LOAD, fn_path))
        if not self.conn.poll(WORKER_STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"an isolated worker could not import {fn_path} within {WORKER_STARTUP_TIMEOUT_S:.0f} s")
        status, payload = self.conn.recv()
        if status != "ok":
            raise ValueError(f"the reward worker cannot load {fn_path}: {payload}")
        self.loaded.add(fn_path)

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.conn.close()


def _child_environment() -> dict[str, str]:
    env = os.environ.copy()
    # Whatever the parent can import (its sys.path, cwd included), the worker can import too.
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"      # a checker needs one core; don't compete with the trainer's threads
    return env


class IsolatedRunner:
    """A small pool of worker processes; `map` calls one function on many argument tuples in parallel.

    `stats` counts calls, timeouts and errors since creation (a crashed worker counts as an error).
    Thread-safe: calls from several threads are served one `map` at a time.
    """

    def __init__(self, n_workers: int = 1, *, memory_limit_mb: int | None = None,
                 preload: Sequence[str] = ()):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1 (got {n_workers})")
        self.n_workers = n_workers
        self.memory_limit_mb = memory_limit_mb
        self.preload = tuple(preload)
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0}
        self._workers: list[_Worker] = []
        self._spare: _Worker | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def call(self, fn_path: str, args: tuple, timeout_s: float) -> CallOutcome:
        return self.map(fn_path, [args], timeout_s)[0]

    def map(self, fn_path: str, args_list: Sequence[tuple], timeout_s: float, *,
            deadline: float = math.inf) -> list[CallOutcome]:
        """One outcome per argument tuple; each call gets `timeout_s`, and none runs past `deadline` (a
        `time.monotonic()` value bounding the whole map: calls not finished by then report `timeout`)."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 (got {timeout_s})")
        with self._lock:
            return self._map_locked(fn_path, list(args_list), timeout_s, deadline)

    def _map_locked(self, fn_path: str, args_list: list[tuple], timeout_s: float,
                    overall: float = math.inf) -> list[CallOutcome]:
        outcomes: list[CallOutcome | None] = [None] * len(args_list)
        pending = list(range(len(args_list)))[::-1]            # pop() takes the lowest index first
        busy: dict[int, tuple[_Worker, int, float]] = {}       # id(worker) -> (worker, call index, deadline)
        spent = CallOutcome("timeout", error="not run: the step's checking budget was spent")
        while pending or busy:
            for worker in self._idle_workers(busy, want=len(pending)):
                index = pending.pop()
                # Start-up and importing the function's module are not part of a call's deadline, but the
                # step's budget (`overall`) counts everything.
                if not worker.wait_ready(within=overall - time.monotonic()):
                    outcomes[index] = spent
                    continue
                worker.ensure_loaded(fn_path)
                if time.monotonic() >= overall:
                    outcomes[index] = spent
                    continue
                worker.conn.send((fn_path, args_list[index]))
                busy[id(worker)] = (worker, index, min(time.monotonic() + timeout_s, overall))
            if not busy:
                continue
            nearest = min(deadline for _, _, deadline in busy.values())
            ready = wait([w.conn for w, _, _ in busy.values()], timeout=max(0.0, nearest - time.monotonic()))
            for key, (worker, index, deadline) in list(busy.items()):
                if worker.conn in ready:
                    outcomes[index] = self._receive(worker)
                    del busy[key]
                elif time.monotonic() >= deadline:
                    outcomes[index] = CallOutcome("timeout", error=f"no result within {timeout_s:g} s")
                    self._replace(worker)
                    del busy[key]
        self.stats["calls"] += len(outcomes)
        self.stats["timeouts"] += sum(o.status == "timeout" for o in outcomes)
        self.stats["errors"] += sum(o.status == "error" for o in outcomes)
        return outcomes

    def _idle_workers(self, busy: dict, want: int) -> list[_Worker]:
        for worker in list(self._workers):
            # A worker also dies with the *thread* that started it (PR_SET_PDEATHSIG); replace it quietly.
            if id(worker) not in busy and worker.process.poll() is not None:
                self._replace(worker)
        while len(self._workers) < min(self.n_workers, len(busy) + want):
            self._workers.append(_Worker(self.memory_limit_mb, self.preload))
        idle = [w for w in self._workers if id(w) not in busy]
        return idle[:want]

    def _receive(self, worker: _Worker) -> CallOutcome:
        try:
            status, payload = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.process.poll()
            self._replace(worker)
            return CallOutcome("error", error=f"the worker process died (exit code {code})")
        except Exception as exc:  # noqa: BLE001 - unpickling a user's object runs its code (e.g. an exception's
            # __init__ with other arguments); the whole message was read, so the worker can go on serving
            return CallOutcome("error", error=f"its result could not be read back in the trainer's process "
                                              f"({type(exc).__name__}: {exc})")
        if status == "ok":
            return CallOutcome("ok", value=payload)
        return CallOutcome("error", error=payload)

    def _replace(self, worker: _Worker) -> None:
        # After the first kill a warm spare is kept, so that the next call after a kill does not wait
        # for a worker to import sympy (~0.4 s): a run of hostile inputs then costs timeout_s each.
        worker.kill()
        position = self._workers.index(worker)
        self._workers[position] = self._spare or _Worker(self.memory_limit_mb, self.preload)
        self._spare = _Worker(self.memory_limit_mb, self.preload)

    def close(self) -> None:
        for worker in self._workers + ([self._spare] if self._spare else []):
            worker.kill()
        self._workers.clear()
        self._spare = None


def _limit_memory(memory_limit_mb: int) -> None:
    import resource

    limit = memory_limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent() -> None:
    # Best effort (Linux): a worker busy in C code would otherwise outlive a parent that was killed. The
    # signal comes when the thread that started the worker ends; `_idle_workers` replaces such workers.
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(conn: Connection) -> None:
    functions: dict[str, Callable] = {}
    while True:
        try:
            fn_path, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if fn_path == _LOAD:
                functions.setdefault(args, resolve_function(args))
                reply = ("ok", None)
            else:
                fn = functions.get(fn_path) or functions.setdefault(fn_path, resolve_function(fn_path))
                reply = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - any failure of user code is reported, never fatal
            reply = ("error", f"{type(exc).__name__}: {exc}"[:2000])
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
            conn.send(("error", f"result could not be sent back: {type(exc).__name__}: {exc}"[:2000]))


def worker_main(argv: list[str]) -> None:
    """Entry point of a worker process: `fd memory_limit_mb preload,modules`."""
    global _IN_WORKER
    _IN_WORKER = True
    fd, memory_limit_mb, preload = int(argv[0]), int(argv[1]), argv[2]
    _die_with_parent()
    if memory_limit_mb > 0:
        _limit_memory(memory_limit_mb)
    for module in filter(None, preload.split(",")):
        importlib.import_module(module)
    conn = Connection(fd)
    conn.send(("ready", os.getpid()))
    _serve(conn)

