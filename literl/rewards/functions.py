"""Pluggable reward functions and their weighted combination.

A reward function is importable by path (`package.module:function`) or passed as a callable, in any of three
conventions told apart by its signature (`conventions.py`):

    literl  f(response: str, example: dict) -> float            example: the problem record (id, problem, answer, ...)
    trl     f(prompts, completions, **columns) -> list[float]   TRL's GRPOTrainer reward functions, batched
    verl    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

The default is `literl.rewards.math_answer:math_accuracy`.

    score_b   = Σ_i w_i · f_i(response_b, example_b)
    correct_b = f_1(response_b, example_b) ≥ 0.5          (the FIRST function decides accuracy)

Robustness: a function that raises, returns a non-number (a string is not a number, even "1"; nor is 10**400 or
1e39, which float32 cannot hold), or runs past `timeout_s` scores 0 for that response; the event is counted in the
metrics and warned about once per function and kind, and training goes on. All the checks of one `score` call (a
step's responses) share a budget of `step_timeout_s`: once it is spent, the remaining slow checks are not run and
score 0 as timeouts, so a collapsed policy repeating hostile answers cannot stall a step for minutes. To bound its
time, an ordinary function runs in isolated worker processes that are killed at the deadline (`isolation.py`), at
~0.05 ms of overhead per call (a TRL-style function scores the batch in one worker call, bounded by `timeout_s` per
response and by the step's budget). A function that bounds its own time (marked with `@time_bounded`, like
`math_accuracy`) is called in-process, takes the deadline as keyword `timeout_s`, and costs nothing extra: the
testbed's integer answers are scored in microseconds.

Metrics per function `<name>` (the function's name): `reward/<name>/mean`, `reward/<name>/timeouts`,
`reward/<name>/errors` (counts in this batch).

A reward that cannot work at all (every call of every function failing or timing out, `max_failed_batches`
scored batches in a row: `reward.max_failed_batches`) raises `RewardsFailing` rather than train on zeros.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from literl.rewards.conventions import (call_literl, call_trl, call_verl, check_trl_columns, detect_convention,
                                       trl_columns)
from literl.rewards.isolation import CallOutcome, IsolatedRunner, resolve_function
from literl.data.terminal_text import printable

DEFAULT_REWARD_FN = "literl.rewards.math_answer:math_accuracy"
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_WORKER_CALLS = {"verl": "literl.rewards.conventions:call_verl_by_path",
                 "trl": "literl.rewards.conventions:call_trl_by_path"}


class RewardWarning(UserWarning):
    """A reward function failed or timed out on some responses (they scored 0)."""


class RewardsFailing(RuntimeError):
    """Batch after batch, every reward call failed or timed out: training would go on without any signal."""


def load_reward_fn(path: str, convention: str = "auto") -> Callable:
    """Import the reward function named `package.module:function` and check that its signature follows one
    convention (`convention`, or the one its signature shows when "auto")."""
    if str(path).startswith("__main__:"):
        raise ValueError(f"reward function {path!r} lives in __main__, which worker processes cannot import; "
                         "move it into a module and name it as 'package.module:function'")
    fn = resolve_function(path)
    detect_convention(fn, convention, name=path)
    return fn


@dataclass
class _Entry:
    name: str
    path: str
    weight: float
    fn: Callable
    in_process: bool
    convention: str = "literl"


class RewardSet:
    """Weighted reward functions: `score(responses, examples) -> (scores_B, correct_B, metrics)`.

    fns: (function or path, weight) pairs, or (function or path, weight, convention) triples where the
    convention is auto | literl | trl | verl. chat_messages: when prompts are rendered with a chat template,
    maps a problem record to its prompt messages, and TRL-style functions then get TRL's conversational format
    (prompts as message lists, completions as [{"role": "assistant", "content": text}]).
    """

    def __init__(self, fns: Sequence[tuple], *, timeout_s: float = 5.0, n_workers: int | None = None,
                 step_timeout_s: float | None = None, chat_messages: Callable[[dict], list[dict]] | None = None,
                 max_failed_batches: int = 0):
        if not fns:
            raise ValueError(f"RewardSet needs at least one (function path, weight) pair, e.g. "
                             f"[({DEFAULT_REWARD_FN!r}, 1.0)]")
        if timeout_s <= 0:
            raise ValueError(f"reward timeout_s must be > 0 (got {timeout_s})")
        self.timeout_s = float(timeout_s)
        if step_timeout_s is not None and step_timeout_s <= 0:
            raise ValueError(f"reward step_timeout_s must be > 0 or None (got {step_timeout_s})")
        self.step_timeout_s = step_timeout_s
        self.entries = [self._entry(*spec) for spec in fns]
        self.chat_messages = chat_messages
        names = [e.name for e in self.entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward functions must have distinct names for their metrics; repeated: "
                             f"{', '.join(duplicates)}. Wrap one under another name")
        self.n_workers = n_workers or min(2, os.cpu_count() or 1)
        self._runner: IsolatedRunner | None = None
        self._warned: set[tuple[str, str]] = set()
        if max_failed_batches < 0:
            raise ValueError(f"max_failed_batches must be >= 0 (0: never stop; got {max_failed_batches})")
        self.max_failed_batches = max_failed_batches
        self._failed_in_a_row = 0

    @staticmethod
    def _entry(fn_or_path: str | Callable, weight: float, convention: str = "auto") -> _Entry:
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"weight of reward function {fn_or_path!r} must be a finite number (got {weight!r})")
        if isinstance(fn_or_path, str):
            fn, path = load_reward_fn(fn_or_path, convention), fn_or_path
        elif callable(fn_or_path):
            fn, path = fn_or_path, importable_path(fn_or_path)
        else:
            raise ValueError(f"a reward function must be a 'package.module:function' path or a callable, "
                             f"got {type(fn_or_path).__name__}")
        name = getattr(fn, "__name__", None) or str(path).rpartition(":")[2].rpartition(".")[2]
        bounded = bool(getattr(fn, "time_bounded", False))
        if path is None and not bounded:
            warnings.warn(f"reward function {name!r} is not importable by path (a lambda, a closure or defined in "
                          "__main__), so it cannot run in a worker process: it runs in-process WITHOUT a time "
                          "limit. Define it at module level in an importable module to bound its time.",
                          RewardWarning, stacklevel=3)
        convention = detect_convention(fn, convention, name=path or name)
        return _Entry(name, path or name, float(weight), fn, bounded or path is None, convention)

    def score(self, responses: Sequence[str], examples: Sequence[dict]
              ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        if len(responses) != len(examples):
            raise ValueError(f"score() got {len(responses)} responses but {len(examples)} examples; "
                             "pass one example per response (repeat it for each sample of a group)")
        scores_B = torch.zeros(len(responses), dtype=torch.float32)
        correct_B = torch.zeros(len(responses), dtype=torch.bool)
        metrics: dict[str, float] = {}
        deadline = time.monotonic() + self.step_timeout_s if self.step_timeout_s else math.inf
        usable = False
        for position, entry in enumerate(self.entries):
            values, timeouts, errors = self._values(entry, responses, examples, deadline)
            usable = usable or timeouts + errors < len(values)
            values_B = torch.tensor(values, dtype=torch.float32)
            scores_B += entry.weight * values_B
            if position == 0:
                correct_B = values_B >= 0.5
            metrics[f"reward/{entry.name}/mean"] = float(values_B.mean()) if len(values) else 0.0
            metrics[f"reward/{entry.name}/timeouts"] = float(timeouts)
            metrics[f"reward/{entry.name}/errors"] = float(errors)
        self._count_failed_batch(failed=bool(responses) and not usable)
        return scores_B, correct_B, metrics

    def _count_failed_batch(self, *, failed: bool) -> None:
        """Stop after `max_failed_batches` scored batches in a row without one usable reward: a reward that cannot
        work (a judge that never answers, a function that always raises) would otherwise cost every step its
        checking budget, for zero signal, forever."""
        self._failed_in_a_row = self._failed_in_a_row + 1 if failed else 0
        limit = self.max_failed_batches
        if limit and self._failed_in_a_row >= limit:
            names = ", ".join(e.path for e in self.entries)
            raise RewardsFailing(
                f"{self._failed_in_a_row} scored batches in a row in which every reward call failed or timed out "
                f"({names}; the warnings above show the first case of each), so training had no signal: stopping "
                f"(reward.max_failed_batches={limit}). Fix the reward function (or the service it calls), or raise "
                "reward.timeout_s / reward.step_timeout_s if the checks are just slow")
    def _values(self, entry: _Entry, responses: Sequence[str], examples: Sequence[dict], deadline: float
                ) -> tuple[list[float], int, int]:
        if entry.convention == "trl":
            return self._values_batched(entry, responses, examples, deadline)
        if entry.in_process:
            return self._values_in_process(entry, responses, examples, deadline)
        if entry.convention == "literl":
            outcomes = self._workers().map(entry.path, list(zip(responses, examples)), self.timeout_s,
                                           deadline=deadline)
        else:
            outcomes = self._workers().map(_WORKER_CALLS[entry.convention],
                                           [(entry.path, r, ex) for r, ex in zip(responses, examples)], self.timeout_s,
                                           deadline=deadline)
        return self._tally(entry, outcomes)

    def _workers(self) -> IsolatedRunner:
        if self._runner is None:
            # A function called through an adapter is imported when the worker starts (not timed), as
            # `IsolatedRunner` does for functions it calls directly.
            adapted = [e.path.partition(":")[0] for e in self.entries
                       if e.convention != "literl" and not e.in_process]
            self._runner = IsolatedRunner(self.n_workers, preload=list(dict.fromkeys(adapted)))
        return self._runner

    def _values_batched(self, entry: _Entry, responses: Sequence[str], examples: Sequence[dict], deadline: float
                        ) -> tuple[list[float], int, int]:
        """A TRL-style function scores the whole batch in one call, bounded by timeout_s per response and by
        the step's budget (`deadline`)."""
        if not responses:
            return [], 0, 0
        columns = trl_columns(examples)
        check_trl_columns(entry.fn, columns, name=entry.path)
        if self.chat_messages is None:
            prompts, completions = [ex["problem"] for ex in examples], list(responses)
        else:
            prompts = [self.chat_messages(ex) for ex in examples]
            completions = [[{"role": "assistant", "content": r}] for r in responses]
        if entry.in_process:
            try:
                outcome = CallOutcome("ok", call_trl(entry.fn, prompts, completions, columns))
            except Exception as exc:  # noqa: BLE001 - a failing reward must not stop training
                outcome = CallOutcome("error", error=f"{type(exc).__name__}: {exc}")
        else:
            outcome = self._workers().map(_WORKER_CALLS["trl"], [(entry.path, prompts, completions, columns)],
                                          self.timeout_s * len(responses), deadline=deadline)[0]
        if outcome.status != "ok":
            return self._tally(entry, [outcome] * len(responses))
        return self._tally(entry, [CallOutcome("ok", v) for v in outcome.value])

    def _tally(self, entry: _Entry, outcomes: Sequence[CallOutcome]) -> tuple[list[float], int, int]:
        values, timeouts, errors = [], 0, 0
        for outcome in outcomes:
            value, problem = _as_reward(outcome)
            values.append(value)
            timeouts += outcome.status == "timeout"
            errors += problem is not None and outcome.status != "timeout"
            if problem:
                self._warn_once(entry, outcome.status if outcome.status == "timeout" else "error", problem)
        return values, timeouts, errors

    def _values_in_process(self, entry: _Entry, responses, examples, deadline: float
                           ) -> tuple[list[float], int, int]:
        counter = getattr(entry.fn, "timeout_counter", None)
        timeouts_before = counter() if counter else 0
        bounded = getattr(entry.fn, "time_bounded", False)
        values, errors = [], 0
        for response, example in zip(responses, examples):
            # The per-check bound, or what is left of the step's budget (0: only the function's cheap checks).
            kwargs = {"timeout_s": max(0.0, min(self.timeout_s, deadline - time.monotonic()))} if bounded else {}
            try:
                result = (call_literl(entry.fn, response, example, **kwargs) if entry.convention == "literl"
                          else call_verl(entry.fn, response, example))
                value, problem = _as_reward(CallOutcome("ok", result))
            except Exception as exc:  # noqa: BLE001 - a failing reward must not stop training
                value, problem = 0.0, f"{type(exc).__name__}: {exc}"
            values.append(value)
            if problem:
                errors += 1
                self._warn_once(entry, "error", problem)
        timeouts = (counter() - timeouts_before) if counter else 0
        if timeouts:
            self._warn_once(entry, "timeout", f"{timeouts} checks ran past {self.timeout_s:g} s")
        return values, timeouts, errors

    def _warn_once(self, entry: _Entry, kind: str, detail: str) -> None:
        if (entry.name, kind) in self._warned:
            return
        self._warned.add((entry.name, kind))
        what = "ran past its time limit" if kind == "timeout" else "failed"
        # The detail can quote the response (a parse error), so a model's output could drive the terminal.
        warnings.warn(f"reward function {entry.path} {what} on a response, which scored 0 "
                      f"(first case: {printable(detail)}). Further cases are counted in reward/{entry.name}/{kind}s "
                      "without more warnings.", RewardWarning, stacklevel=4)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def importable_path(fn: Callable) -> str | None:
    """`module:qualname` when importing that path gives back `fn` itself (so a worker process, or a rerun from
    config.yaml, can import it), else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if resolve_function(f"{module}:{qualname}") is fn else None
    except ValueError:
        return None


def _as_reward(outcome: CallOutcome) -> tuple[float, str | None]:
    """(value, None) for a number that float32 holds finite (rewards become a float32 tensor); (0.0, reason) for
    anything else, whatever converting it raises (10**400: OverflowError; a __float__ that fails)."""
    if outcome.status != "ok":
        return 0.0, outcome.error
    value: Any = outcome.value
    if isinstance(value, (str, bytes)):     # float("1") would pass: an answer string is not a reward
        return 0.0, f"returned {type(value).__name__} {_shown(value)}, not a number"
    try:
        number = float(value)
    except Exception as exc:  # noqa: BLE001 - a user's object may raise anything from __float__
        return 0.0, f"returned {type(value).__name__} {_shown(value)}, not a number ({type(exc).__name__}: {exc})"
    if not math.isfinite(number):
        return 0.0, f"returned {number}"
    if abs(number) > FLOAT32_MAX:
        return 0.0, f"returned {number:g}, beyond float32's range (±{FLOAT32_MAX:.4g}), where rewards are kept"
    return number, None


def _shown(value: Any) -> str:
    """The start of a value's repr, for a message; a repr that raises is not the caller's problem."""
    try:
        return f"{value!r:.80}"
    except Exception:  # noqa: BLE001
        return "(unprintable)"
