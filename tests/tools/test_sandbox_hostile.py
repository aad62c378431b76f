"""The `python` tool's sandbox against hostile code: each attack ends in a clear observation, the caller goes
on, and the next call gets a clean sandbox. Namespaced isolation (root + `unshare`) is what CI has; the tests
that need it say so when skipped."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from literl.tools import PythonSandbox, SandboxLimits, python, sandbox_isolation
from literl.tools.sandbox import FIRST_SANDBOX_UID

namespaced = pytest.mark.skipif(sandbox_isolation() != "namespaced",
                                reason="needs namespaced isolation: root and a working `unshare`")
FAST = SandboxLimits(wall_s=30, cpu_s=2, memory_mb=256, max_output_bytes=2000)


@pytest.fixture(scope="module")
def sandbox():
    return PythonSandbox(FAST)


def still_works(sandbox):
    assert sandbox.run("print(6*7)") == "42\n"


def test_ordinary_code_prints_and_tracebacks_come_back_as_text(sandbox):
    assert python("print(sum(range(10)))") == "45\n"          # 0+1+...+9 = 45
    out = sandbox.run("def f():\n    return 1/0\nf()")
    assert out.status == "error"
    assert "ZeroDivisionError: division by zero" in out and "line 2, in f" in out and out.endswith("(exit code 1)")
    assert sandbox.run("x = 1").status == "ok" and sandbox.run("x = 1") == "(no output)"


def test_an_infinite_loop_is_stopped_by_the_cpu_limit(sandbox):
    # a generous wall clock: on a loaded machine 1 s of CPU can take many seconds to accumulate
    out = PythonSandbox(SandboxLimits(wall_s=120, cpu_s=1)).run("while True:\n    pass")
    assert out.status == "timeout" and "CPU time limit" in out
    still_works(sandbox)


def test_sleeping_forever_is_stopped_at_the_wall_clock_limit():
    sandbox = PythonSandbox(SandboxLimits(wall_s=3.0, cpu_s=5))      # 3 s: room to start on a loaded machine
    started = time.monotonic()
    out = sandbox.run("import time\nprint('before', flush=True)\ntime.sleep(60)")
    assert time.monotonic() - started < 10
    assert out.status == "timeout"
    assert out == "before\nError: the code ran past its 3 s wall-clock limit and was stopped"


def test_a_memory_bomb_gets_a_memory_error(sandbox):
    out = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert out.status == "error" and "MemoryError" in out
    still_works(sandbox)


def test_an_output_flood_is_cut_at_the_cap(sandbox):
    out = sandbox.run("while True:\n    print('x' * 100)")
    assert out.status == "error" and "output passed 2000 bytes" in out
    assert len(out) < 2000 + 200
    still_works(sandbox)


def test_a_file_past_the_size_cap_is_refused(sandbox):
    out = sandbox.run("open('big.bin', 'wb').write(b'0' * (17 * 1024 * 1024))")    # cap: 16 MB
    assert out.status == "error" and "File too large" in out


def test_the_environment_is_clean_and_the_parents_cannot_be_read(sandbox, monkeypatch):
    monkeypatch.setenv("LITERL_TEST_SECRET", "hunter2-token")
    out = sandbox.run("import os\nprint(sorted(os.environ))\n"
                      f"for path in ['/proc/{os.getpid()}/environ', '/proc/1/environ', '/proc/self/environ']:\n"
                      "    try:\n        print(path, open(path, 'rb').read())\n"
                      "    except OSError as exc:\n        print(path, type(exc).__name__)")
    assert "hunter2" not in out
    assert "['HOME', 'LANG', 'OMP_NUM_THREADS', 'PATH']" in out


def test_each_call_gets_a_fresh_empty_working_directory(sandbox):
    assert sandbox.run("open('state.txt', 'w').write('x')\nimport os\nprint(sorted(os.listdir('.')))") == \
        "['snippet.py', 'state.txt']\n"
    assert sandbox.run("import os\nprint(os.listdir('.'))") == "['snippet.py']\n"


@namespaced
def test_a_fork_bomb_is_bounded_and_leaves_no_process_behind(sandbox):
    out = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert out.status in ("error", "timeout")
    assert "Resource temporarily unavailable" in out or "limit" in out
    time.sleep(0.2)
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) >= FIRST_SANDBOX_UID]
    assert leftovers == []
    still_works(sandbox)


@namespaced
def test_there_is_no_network_not_even_to_a_service_on_localhost(sandbox):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        out = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('in')")
    assert "Network is unreachable" in out or "Connection refused" in out
    assert "in\n" not in out
    out = sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)")
    assert "Network is unreachable" in out


@namespaced
def test_writes_outside_the_working_directory_fail_and_leave_nothing(sandbox, tmp_path):
    targets = [os.path.abspath("ESCAPED_FROM_SANDBOX"), str(tmp_path / "escaped"), "/etc/escaped"]
    code = "\n".join(f"try:\n    open({t!r}, 'w').write('x')\n    print('wrote', {t!r})\n"
                     f"except OSError as exc:\n    print('refused', type(exc).__name__)" for t in targets)
    out = sandbox.run(code + "\nopen('/tmp/scratch', 'w').write('ok')\nprint('tmp ok')")
    assert "wrote" not in out and out.count("refused") == 3
    assert "tmp ok" in out                               # its private /tmp works ...
    assert not any(os.path.exists(t) for t in targets)
    assert not os.path.exists("/tmp/scratch")            # ... and is not the machine's /tmp


@namespaced
def test_signals_to_the_parent_and_everyone_reach_no_one_outside(sandbox):
    me = os.getpid()
    out = sandbox.run("import os, signal\n"
                      f"for target in (os.getppid(), {me}, -1):\n"
                      "    try:\n        os.kill(target, signal.SIGKILL)\n        print('sent', target)\n"
                      "    except OSError as exc:\n        print('refused', target, type(exc).__name__)\n"
                      "print('alive')")
    os.kill(me, 0)                                       # this process is alive
    # Its parent is the namespace's root-owned PID 1 (the launcher); this process's PID names nothing in its PID
    # namespace; -1 ("every process it may signal") finds none but itself, which kill(-1) skips.
    assert out == f"refused 1 PermissionError\nrefused {me} ProcessLookupError\nrefused -1 ProcessLookupError\nalive\n"
    still_works(sandbox)


def test_the_sandbox_hides_the_interpreters_private_folder_and_home():
    if sandbox_isolation() != "namespaced":
        pytest.skip("needs namespaced isolation: root and a working `unshare`")
    out = PythonSandbox(FAST).run("import os\nprint(os.path.expanduser('~'))\n"
                                  "print(os.listdir('/root') if os.path.isdir('/root') else 'none')")
    assert out.splitlines()[0] == "/tmp/work"
    assert out.splitlines()[1] in ("[]", "['.pyenv']", "none")


def test_namespaced_isolation_refuses_to_fall_back_silently(monkeypatch):
    import literl.tools.sandbox as sandbox_module
    monkeypatch.setattr(sandbox_module, "sandbox_isolation", lambda: "basic")
    with pytest.raises(ValueError, match=r"namespaced isolation needs root.*isolation='basic'"):
        PythonSandbox(isolation="namespaced")


def test_basic_mode_still_applies_limits_clean_environment_and_fresh_folder(monkeypatch):
    monkeypatch.setenv("LITERL_TEST_SECRET", "hunter2-token")
    sandbox = PythonSandbox(SandboxLimits(wall_s=120, cpu_s=1, memory_mb=256), isolation="basic")
    assert "hunter2" not in sandbox.run("import os\nprint(dict(os.environ))")
    assert "CPU time limit" in sandbox.run("while True:\n    pass")
    assert "MemoryError" in sandbox.run("x = bytearray(2 * 1024**3)")
    assert sandbox.run("import os\nprint(os.listdir('.'))") == "['snippet.py']\n"


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


@namespaced
def test_sandboxes_run_side_by_side_each_as_its_own_user():
    """Four calls through the runner at once: each sees only its own processes and runs as its own uid."""
    from literl.tools import ToolCall, ToolRunner

    runner = ToolRunner({"python": python}, timeout_s=60, max_workers=4)
    code = "import os\nprint(os.getuid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    results = runner.run([ToolCall("python", {"code": code})] * 4)
    uids = [r.text.split()[0] for r in results]
    assert [r.status for r in results] == ["ok"] * 4
    assert len(set(uids)) == 4 and all(int(u) >= FIRST_SANDBOX_UID for u in uids)
    assert all(r.text.split(" ", 1)[1] == "['1', '2']\n" for r in results)   # the launcher and the code itself
    runner.close()


@namespaced
def test_an_interpreter_in_a_closed_folder_under_tmp_runs_and_its_neighbours_stay_hidden(tmp_path):
    """A venv in a 0700 folder under /tmp (the private tmpfs covers /tmp): the sandbox binds the venv back, runs
    its python as an unprivileged user, and a secret file beside the venv is not there."""
    import subprocess
    import sys

    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "secret.txt").write_text("hunter2")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(closed / "venv")], check=True)
    sandbox = PythonSandbox(FAST, python=str(closed / "venv" / "bin" / "python"))
    out = sandbox.run("import sys, os\nprint(sys.prefix)\n"
                      f"print(os.path.exists({str(closed / 'secret.txt')!r}))")
    assert out == f"{closed / 'venv'}\nFalse\n"


@namespaced
def test_a_daemon_left_behind_by_the_code_ends_with_the_sandbox():
    """The code forks a child that leaves its session and sleeps for 1000 s, then exits: the call returns as soon
    as the code exits (not at the 30 s wall clock) and no process of the sandbox's user is left."""
    started = time.monotonic()
    out = PythonSandbox(FAST).run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"
                                  "print('parent done')")
    assert out == "parent done\n" and out.status == "ok"
    assert time.monotonic() - started < 15
    time.sleep(0.2)
    assert [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) >= FIRST_SANDBOX_UID] == []
