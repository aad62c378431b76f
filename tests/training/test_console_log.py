"""What a log file of a run looks like (the console on a non-terminal stream), and the oversubscription
warning's rules on injected numbers (literl/run/console.py, literl/run/load_watch.py)."""

from __future__ import annotations

import io

import pytest

from literl.training import load_watch
from literl.run.console import Console, format_duration, plain_step_line
from literl.run.load_watch import LoadWatch, oversubscription, step_slowdown

METRICS = {"accuracy": 0.5123, "reward/mean": 0.5123, "loss/total": 0.00123, "entropy/mean": 0.11,
           "response_length/mean": 31.25, "time/step": 0.61}


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_log_file_gets_one_unwrapped_line_per_step_with_an_eta():
    """10 s per step: after step 3 of 10, 30 s elapsed and 7 steps left → eta 70 s = 1m10s."""
    stream, clock = io.StringIO(), FakeClock()
    console = Console(stream=stream, clock=clock)
    assert not console.interactive
    console.start(total=10)
    long_note = "run directory " + "x" * 150
    console.note(long_note)
    for step in (1, 2, 3):
        clock.now += 10
        console.update(step, METRICS)
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"[literl] {long_note}"            # not wrapped at 80 columns
    assert [line.split()[1] for line in lines[1:]] == ["1/10", "2/10", "3/10"]
    assert lines[3] == ("step 3/10  acc 0.512  reward 0.512  loss +0.0012  entropy 0.110  len 31.2  s/step 0.61  "
                        "[30s, eta 1m10s]")


def test_log_every_sets_the_period_and_the_first_and_last_steps_always_print():
    stream, clock = io.StringIO(), FakeClock()
    console = Console(stream=stream, clock=clock, plain_every=4)
    console.start(total=10, done=2)               # resumed at step 2: its first step is 3
    for step in range(3, 11):
        clock.now += 1
        console.update(step, METRICS)
    assert [line.split()[1] for line in stream.getvalue().splitlines()] == ["3/10", "4/10", "8/10", "10/10"]
    assert stream.getvalue().splitlines()[-1].endswith("[8s]")    # no eta at the last step


def test_durations_and_the_eta_of_a_resumed_run():
    assert [format_duration(s) for s in (0, 7.4, 65, 3599, 3725)] == ["0s", "7s", "1m05s", "59m59s", "1h02m"]
    # resumed at step 40 of 100, 2 steps done this session in 20 s: 10 s per step, 58 left → 9m40s
    assert plain_step_line(42, 100, {}, 20.0, 2).endswith("[20s, eta 9m40s]")


# ---------------------------------------------------------------------------------------------- oversubscription
def quiet(**changes):
    """A run that is fine: 2 threads on 2 free CPUs, load 2.0 after two minutes, steady steps."""
    args = dict(threads=2, cpus_available=2, machine_cpus=2, load_1min=2.0, elapsed_s=120.0, costs=[1.0] * 10)
    return oversubscription(**{**args, **changes})


def test_a_quiet_machine_gets_no_warning():
    assert quiet() is None
    assert quiet(load_1min=2.9) is None                     # below 2 CPUs + a margin of 1
    assert quiet(costs=[5.0, 3.0] + [1.0] * 5 + [1.9] * 3) is None   # slow warm-up steps; 1.9× is under 2×


def test_load_above_the_cores_is_oversubscription_after_the_first_minute():
    """Load 3.0 on 2 CPUs: a whole extra runnable thread. In the first minute the 1-minute average still
    describes what ran before, so it is not trusted yet."""
    message = quiet(load_1min=3.0)
    assert "load average is 3.0 on 2 CPUs" in message and "trainer.threads=1" in message
    assert quiet(load_1min=3.0, elapsed_s=59.0) is None
    assert load_watch.load_margin(64) == pytest.approx(6.4)
    assert oversubscription(threads=64, cpus_available=64, machine_cpus=64, load_1min=70.0, elapsed_s=120,
                            costs=[]) is None
    assert oversubscription(threads=64, cpus_available=64, machine_cpus=64, load_1min=70.4, elapsed_s=120,
                            costs=[]) is not None


def test_a_step_time_jump_against_the_runs_own_steps_is_oversubscription():
    """Steps 1-2 are warm-up (left out); reference: median of steps 3-7 = 1.0; last three median 2.5."""
    costs = [9.0, 4.0, 1.0, 1.1, 0.9, 1.0, 1.0, 2.4, 2.5, 2.6]
    assert step_slowdown(costs) == pytest.approx(2.5)
    message = quiet(costs=costs)
    assert "2.5× as long per generated token" in message
    assert step_slowdown([1.0] * 7) is None                 # 2 warm-up + 2 reference + 3 recent: too few


def test_more_threads_than_allowed_cpus_is_oversubscription_at_once():
    message = quiet(threads=8, elapsed_s=0.0)
    assert "trainer.threads=8 exceeds the 2 CPUs this process may use" in message


def test_a_single_threaded_run_is_not_told_to_use_fewer_threads():
    message = quiet(threads=1, load_1min=3.5)
    assert "trainer.threads=" not in message and "already uses one thread" in message


def test_the_watch_warns_once_on_the_console():
    """The load rises to 5 after two minutes: one warning, not one per step."""
    loads = iter([2.0, 2.0, 5.0, 5.0, 5.0])
    stream, clock = io.StringIO(), FakeClock()
    watch = LoadWatch(threads=2, cpus_available=2, machine_cpus=2, read_load=lambda: next(loads))
    console = Console(stream=stream, clock=clock, watch=watch, plain_every=100)
    console.start(total=100)
    for step in range(1, 6):
        clock.now += 40
        console.update(step, {"throughput/generated_tokens_per_s": 100.0})
    warnings = [line for line in stream.getvalue().splitlines() if "warning" in line]
    assert len(warnings) == 1 and "load average is 5.0 on 2 CPUs" in warnings[0]
    assert watch.costs == [0.01] * 5


def test_a_step_that_generated_nothing_is_not_a_cost():
    from literl.run.load_watch import step_cost

    assert step_cost({"throughput/generated_tokens_per_s": 200.0, "time/step": 3.0}) == 0.005
    assert step_cost({"throughput/generated_tokens_per_s": 0.0, "time/step": 3.0}) is None
    assert step_cost({"time/step": 3.0}) == 3.0
