"""Reward functions for the RewardSet tests, importable by path from worker processes."""

from __future__ import annotations

import os
import time


def length_bonus(response: str, example: dict) -> float:
    return min(1.0, len(response) / 100)


def always_raises(response: str, example: dict) -> float:
    raise RuntimeError("this reward function is broken")


def sleeps_forever(response: str, example: dict) -> float:
    time.sleep(600)
    return 1.0


def busy_in_c(response: str, example: dict) -> float:
    # One C call that never polls for signals: a signal-based timeout cannot stop it, a kill can.
    return float(sum(range(10 ** 13)))


def sleeps_if_asked(response: str, example: dict) -> float:
    if "slow" in response:
        time.sleep(600)
    return 1.0


def kills_its_process(response: str, example: dict) -> float:
    os._exit(3)


def returns_nan(response: str, example: dict) -> float:
    return float("nan")


def returns_text(response: str, example: dict) -> str:
    return "yes"


def takes_one_argument(response: str) -> float:
    return 1.0


NOT_A_FUNCTION = 3


def math_in_worker(response: str, example: dict) -> float:
    # Runs in a worker process, where math_reward must check in-process instead of starting workers.
    from literl.rewards.math_answer import math_reward

    return math_reward(response, example["answer"])
