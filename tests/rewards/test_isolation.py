"""Isolated worker processes: results, errors, hard timeouts, crashed workers."""

from __future__ import annotations

import time

import pytest

from literl.rewards.isolation import IsolatedRunner, resolve_function


@pytest.fixture
def runner():
    r = IsolatedRunner(2)
    yield r
    r.close()


def test_results_errors_and_stats(runner):
    outcomes = runner.map("math:sqrt", [(4.0,), (-1.0,), (9.0,)], timeout_s=30)
    assert [o.status for o in outcomes] == ["ok", "error", "ok"]
    assert outcomes[0].value == 2.0 and outcomes[2].value == 3.0
    assert "math domain error" in outcomes[1].error
    assert runner.stats == {"calls": 3, "timeouts": 0, "errors": 1}


def test_a_call_stuck_in_c_code_is_killed_at_its_deadline_and_the_pool_recovers(runner):
    start = time.perf_counter()
    outcomes = runner.map("sample_reward_fns:busy_in_c", [("r", {}), ("r", {})], timeout_s=0.5)
    elapsed = time.perf_counter() - start
    assert [o.status for o in outcomes] == ["timeout", "timeout"]
    assert elapsed < 0.5 + 10          # both in parallel; the margin covers two worker start-ups under load
    assert runner.call("math:sqrt", (16.0,), timeout_s=30).value == 4.0


def test_a_crashed_worker_is_an_error_not_a_crash(runner):
    outcome = runner.call("sample_reward_fns:kills_its_process", ("r", {}), timeout_s=30)
    assert outcome.status == "error" and "died" in outcome.error
    assert runner.call("math:sqrt", (1.0,), timeout_s=30).status == "ok"


@pytest.mark.parametrize("path,message", [
    ("no_colon_here", "must look like 'package.module:function'"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("sample_reward_fns:missing", "has no function 'missing'"),
    ("sample_reward_fns:NOT_A_FUNCTION", "not a function"),
])
def test_resolve_function_errors_name_the_problem(path, message):
    with pytest.raises(ValueError, match=message):
        resolve_function(path)


def test_workers_started_by_a_finished_thread_are_replaced(runner):
    import threading

    thread = threading.Thread(target=lambda: runner.call("math:sqrt", (4.0,), timeout_s=30))
    thread.start()
    thread.join()
    time.sleep(0.2)
    assert runner._workers[0].process.poll() is not None    # SIGKILL when its starting thread ended
    outcome = runner.call("math:sqrt", (9.0,), timeout_s=30)
    assert outcome.status == "ok" and outcome.value == 3.0 and runner.stats["errors"] == 0


def test_a_worker_ignores_ctrl_c_so_only_the_trainer_decides_what_it_means(runner):
    """Issue 59, R1: a Ctrl-C in the terminal reaches every process of the group; a second one printed a worker's
    KeyboardInterrupt traceback and killed it. SIGINT sent to both workers: they live on and answer the next call
    (sqrt(16) = 4)."""
    import os
    import signal

    assert runner.call("math:sqrt", (4.0,), timeout_s=30).value == 2.0
    for worker in runner._workers:
        os.kill(worker.process.pid, signal.SIGINT)
    time.sleep(0.5)
    assert all(worker.process.poll() is None for worker in runner._workers)
    assert runner.call("math:sqrt", (16.0,), timeout_s=30).value == 4.0
    assert runner.stats["errors"] == 0
