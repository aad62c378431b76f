"""Noticing that other work competes for the CPUs, and saying what to do — once per run.

torch's intra-op threads wait for each other at every parallel operation, so one busy core slows every
thread: with another busy process on a 2-core machine, a run at the default thread count took 5-8× longer
per step than at one thread, without a word. Three signs, each checked by `oversubscription` on numbers
the caller passes in (so the rules are tested on injected numbers, not on timing):

* threads: `trainer.threads` above the CPUs this process may use (its affinity mask);
* load: the 1-minute load average (runnable threads, ours included) at least LOAD_MARGIN(cpus) above the
  machine's CPU count, read only after the run's first minute (before that, the average still describes
  whatever ran before the run started);
* slowdown: the median cost of the last RECENT_STEPS steps at least SLOWDOWN × the median of the up to
  REFERENCE_STEPS steps before them (the first WARMUP_STEPS steps, which pay one-off costs, left out). The
  cost of a step is its seconds per generated token (1 / throughput/generated_tokens_per_s), so shorter or
  longer responses do not look like a slowdown.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from literl.run.provenance import available_cpus, load_average

WARMUP_STEPS = 2
RECENT_STEPS = 3
REFERENCE_STEPS = 20
MIN_REFERENCE_STEPS = 3
SLOWDOWN = 2.0
LOAD_SETTLE_S = 60.0


def load_margin(cpus: int) -> float:
    """How far above the core count the load average must be: one whole extra runnable thread on a small
    machine, a tenth of the cores on a large one (whose load average is noisier)."""
    return max(1.0, 0.1 * cpus)


def step_slowdown(costs: Sequence[float]) -> float | None:
    """median(last RECENT_STEPS) / median(the up to REFERENCE_STEPS before them, warm-up excluded), or None
    while there are too few steps to compare."""
    reference = list(costs[WARMUP_STEPS:len(costs) - RECENT_STEPS])[-REFERENCE_STEPS:]
    recent = list(costs[-RECENT_STEPS:])
    if len(reference) < MIN_REFERENCE_STEPS or len(recent) < RECENT_STEPS:
        return None
    base = statistics.median(reference)
    return statistics.median(recent) / base if base > 0 else None


def oversubscription(*, threads: int, cpus_available: int, machine_cpus: int, load_1min: float | None,
                     elapsed_s: float, costs: Sequence[float]) -> str | None:
    """What to tell the user when the run competes for its CPUs, or None. See the module docstring."""
    signs = []
    if threads > cpus_available:
        signs.append(f"trainer.threads={threads} exceeds the {cpus_available} CPUs this process may use")
    if load_1min is not None and elapsed_s >= LOAD_SETTLE_S and load_1min >= machine_cpus + load_margin(machine_cpus):
        signs.append(f"the load average is {load_1min:.1f} on {machine_cpus} CPUs (this run's own {threads} "
                     f"thread{'s' if threads != 1 else ''} included)")
    slowdown = step_slowdown(costs)
    if slowdown is not None and slowdown >= SLOWDOWN:
        signs.append(f"the last {RECENT_STEPS} steps took {slowdown:.1f}× as long per generated token as this "
                     f"run's earlier steps")
    if not signs:
        return None
    if threads > 1:
        advice = (f"Stop the other work, or give this run fewer threads than the free cores (trainer.threads="
                  f"{max(1, min(threads, cpus_available) // 2)}; ablations: --jobs × threads per run at most the "
                  "cores)")
    else:
        advice = "This run already uses one thread: stop the other work, or run fewer jobs at once"
    return ("the CPUs look oversubscribed: " + "; ".join(signs) + ". torch's threads wait for each other at "
            "every parallel operation, so competing work slows every step (5-8× has been seen). " + advice
            + ". This warning is shown once per run.")


def step_cost(metrics: dict) -> float | None:
    """Seconds per generated token of one step (None for a step that generated nothing); time/step for
    metrics without a throughput at all (then every step is measured alike)."""
    rate = metrics.get("throughput/generated_tokens_per_s")
    if rate is not None:
        return 1.0 / rate if isinstance(rate, (int, float)) and rate > 0 else None
    seconds = metrics.get("time/step")
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None


@dataclass
class LoadWatch:
    """Feeds each step's cost and the load average to `oversubscription`; returns its message once."""

    threads: int
    cpus_available: int = field(default_factory=available_cpus)
    machine_cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    read_load: Callable[[], float | None] = load_average
    costs: list[float] = field(default_factory=list)
    warned: bool = False

    def observe(self, metrics: dict, *, elapsed_s: float) -> str | None:
        cost = step_cost(metrics)
        if cost is not None:
            self.costs.append(cost)
        if self.warned:
            return None
        message = oversubscription(threads=self.threads, cpus_available=self.cpus_available,
                                   machine_cpus=self.machine_cpus, load_1min=self.read_load(),
                                   elapsed_s=elapsed_s, costs=self.costs)
        self.warned = message is not None
        return message
