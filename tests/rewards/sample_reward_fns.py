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


# TRL convention: the whole batch by keyword; the records' fields arrive as columns.
def trl_boxed_answer(prompts, completions, answer, **kwargs) -> list[float]:
    return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer)]


def trl_prompt_length(prompts, completions, **kwargs) -> list[float]:
    return [float(len(p)) for p in prompts]


def trl_wrong_length(prompts, completions, **kwargs) -> list[float]:
    return [1.0]


def trl_needs_solution(completions, solution, **kwargs) -> list[float]:
    return [1.0 for _ in completions]


def trl_not_applicable(completions, **kwargs) -> list:
    return [None if "no answer" in c else 1.0 for c in completions]


# verl convention: compute_score by keyword, one response per call; a dict gives its "score".
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(f"\\boxed{{{ground_truth}}}" in solution_str) + (0.5 if data_source == "bonus" else 0.0),
            "id": extra_info["id"]}


class NeedsTwoArguments(Exception):
    """An exception whose pickle cannot be read back: unpickling calls NeedsTwoArguments(*args) with one."""

    def __init__(self, first, second):
        super().__init__(first)


def returns_an_unreadable_exception(response: str, example: dict):
    return NeedsTwoArguments("a", "b")


class NoFloat:
    def __float__(self):
        raise RuntimeError("no float for you")


def returns_hostile_values(response: str, example: dict):
    """What a reward can return that float() cannot take, or that float32 cannot hold."""
    return {"huge": 10 ** 400, "no_float": NoFloat(), "float32_inf": 1e39, "ok": 0.5}[response]


def trl_hangs(prompts, completions, **kwargs) -> list[float]:
    """A TRL-style (batched) reward stuck for good, e.g. on a remote judge that never answers."""
    time.sleep(600)
    return [1.0] * len(completions)
