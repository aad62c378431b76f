"""The math answer reward: extract the final `\\boxed{}` answer and check it against the gold answer.

    math_reward(response, gold) = 1.0  if is_equivalent(extract_final_answer(response), gold)
                                  0.0  otherwise (no answer, wrong answer, over a cap, timed out, error)

The {0, 1} scale is this function's output; mapping it to {−1, 1} is a reward-shaping transform.

How `is_equivalent(pred, gold)` decides, cheapest first:
1. Caps on the prediction. A predicted answer longer than `MAX_ANSWER_CHARS` (1000) or nested deeper than
   `MAX_BRACE_DEPTH` (32) braces is wrong. Gold answers are trusted data and are not capped; every gold in
   the shared benchmarks is at most 210 characters and a few levels deep, so the caps only cut off
   degenerate or hostile output.
2. Fast path, in-process, a few microseconds. Both sides are normalised as text (whitespace, `\\left`/
   `\\right`, `\\dfrac`/`\\tfrac`, spacing commands, enclosing `$`, a trailing period). Equal texts are
   equivalent. Two plain integers are decided exactly (equal iff the same number: "007" = "7" ≠ "8").
   Two plain decimals, E notation allowed, that are equal as decimals ("1.50" = "1.5", "8.7e8" =
   "870000000") are equivalent. Everything else
   goes to step 3. This covers the embedded testbed (integers) and most benchmark golds written
   verbatim.
3. Math-Verify (`parse` + `verify`, float rounding to 6 places) in an isolated worker process with a hard
   wall-clock deadline (`timeout_s`, default 5 s; `isolation.py` says why a process). Surrounding
   whitespace, enclosing `$` and a trailing period are dropped first, and an E-notation number ("8.7e8",
   which Math-Verify would read with Euler's e) is rewritten as `8.7 \\times 10^{8}`. A bare answer is
   parsed as `\\boxed{answer}` so that LaTeX is read as LaTeX; a text with its own math delimiters is
   parsed as it is. On timeout the worker is killed and the answer is wrong.
Verdicts of step 3 are cached (LRU), so a degenerate answer repeated across a group costs its deadline once.

Measured on 2 shared CPU cores: fast path 3–6 µs per check; Math-Verify path ~0.5–50 ms plus ~0.05 ms of
process overhead. Hostile answers (`9^{9^{9^{9}}}`, `10^{10^{10}}`, `(10^{10^{10}})!`, 100 KB of digits,
10 000 nested braces) score 0 either at the caps (under 25 ms, mostly well under 1 ms) or at the deadline:
timeout_s + 10–130 ms. The first Math-Verify check of a process, and the first check after the first kill,
also wait for a worker to start (~0.4 s idle, up to ~1.5 s on a loaded machine); that wait is not counted
against the deadline.

Refs: Math-Verify, https://github.com/huggingface/Math-Verify (the parser and grader used in step 3).
"""

from __future__ import annotations

import functools
import logging
import re
from decimal import Decimal, InvalidOperation

from literl.rewards.isolation import IsolatedRunner, running_in_worker, time_bounded

DEFAULT_TIMEOUT_S = 5.0
MAX_ANSWER_CHARS = 1000
MAX_BRACE_DEPTH = 32
VERDICT_CACHE_SIZE = 1 << 16
CHECK_MEMORY_LIMIT_MB = 4096    # a runaway sympy computation raises MemoryError instead of swapping

# --- extraction ---------------------------------------------------------------------------------------

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)   # an escaped character is skipped: `\{` is not a brace
_UNBRACED_ARGUMENT = re.compile(r"[^\s$]+")


def extract_final_answer(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed x` without braces), else None.

    Braces are matched with a balanced scan; `\\{` and `\\}` are literal braces inside the answer. An
    unclosed last box (a truncated response) gives None: the final answer was never completed. The last
    command wins even inside another box (`\\boxed{\\boxed{5}}` gives 5). Linear time: one regex pass
    to find the last command and one scan over its argument.
    """
    last = None
    for last in _BOX_COMMAND.finditer(text):
        pass
    if last is None:
        return None
    argument = _box_argument(text, last.end())
    if argument is None:
        return None
    return argument[0].strip()


def _box_argument(text: str, start: int) -> tuple[str, int] | None:
    """(argument, end index) of the box command whose name ends at `start`; None if unclosed."""
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    if start >= len(text):
        return None
    if text[start] != "{":
        # `\boxed 5` (used in some MATH solutions): the argument runs to the next space or `$`.
        match = _UNBRACED_ARGUMENT.match(text, start)
        return (match.group().rstrip("."), match.end()) if match else None
    depth = 0
    for token in _BRACE_TOKEN.finditer(text, start):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:token.start()], token.end()
    return None


# --- normalisation and the fast path ------------------------------------------------------------------

_LAYOUT = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\displaystyle|\\[,;:! ]|\s+")
_FRAC_VARIANT = re.compile(r"\\[dt]frac(?![A-Za-z])")
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def normalize_answer_text(answer: str) -> str:
    """A canonical text form used for the fast path and for majority-vote grouping.

    Only rewrites that keep the value: drops whitespace, `\\left`/`\\right`, `\\displaystyle` and spacing
    commands, maps `\\dfrac`/`\\tfrac` to `\\frac`, and strips enclosing `$...$` and a trailing period.
    """
    text = _FRAC_VARIANT.sub(r"\\frac", _LAYOUT.sub("", answer)).rstrip(".")
    while len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text[1:-1]
    return text.rstrip(".")


def _fast_verdict(pred: str, gold: str) -> bool | None:
    """True/False when text alone decides; None when Math-Verify must look."""
    if pred == gold and pred:
        return True
    if _INTEGER.fullmatch(pred) and _INTEGER.fullmatch(gold):
        return _canonical_integer(pred) == _canonical_integer(gold)
    if _DECIMAL.fullmatch(pred) and _DECIMAL.fullmatch(gold):
        try:
            if Decimal(pred) == Decimal(gold):
                return True
        except InvalidOperation:
            pass
    return None


def _canonical_integer(digits: str) -> str:
    # String arithmetic: no int() conversion, so 100 KB of digits costs a string copy, not a bignum.
    sign = "-" if digits[0] == "-" else ""
    magnitude = digits.lstrip("+-").lstrip("0") or "0"
    return magnitude if magnitude == "0" else sign + magnitude


def _max_brace_depth(text: str) -> int:
    depth = deepest = 0
    for token in _BRACE_TOKEN.finditer(text):
        if token.group() == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token.group() == "}":
            depth = max(0, depth - 1)
    return deepest


# --- the public checks --------------------------------------------------------------------------------

def is_equivalent(pred: str, gold: str, *, float_rounding: int = 6, strict: bool = True,
                  allow_set_relation_comp: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the predicted answer means the same as the gold answer (see the module docstring).

    `float_rounding`, `strict` and `allow_set_relation_comp` are Math-Verify's `verify` options. Never
    raises for any string input and returns within `timeout_s` plus the cost of killing a worker.
    """
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    pred_text, gold_text = normalize_answer_text(pred), normalize_answer_text(gold)
    if not pred_text or not gold_text:
        return False
    verdict = _fast_verdict(pred_text, gold_text)
    if verdict is not None:
        return verdict
    if _max_brace_depth(pred) > MAX_BRACE_DEPTH:
        return False
    if timeout_s <= 0:              # no time left (a step's checking budget is spent): wrong, and counted
        _budget_skips[0] += 1
        return False
    return _cached_slow_verdict(_math_verify_text(pred), _math_verify_text(gold), float_rounding, strict,
                                allow_set_relation_comp, float(timeout_s))


def math_reward(response: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if the last `\\boxed{}` answer of `response` is equivalent to `gold`, else 0.0."""
    answer = extract_final_answer(response) if isinstance(response, str) else None
    if answer is None:
        return 0.0
    return 1.0 if is_equivalent(answer, str(gold), timeout_s=timeout_s) else 0.0


_budget_skips = [0]     # slow checks skipped for want of time, counted with the checker's timeouts


@time_bounded(timeout_counter=lambda: checker_runner().stats["timeouts"] + _budget_skips[0])
def math_accuracy(response: str, example: dict, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """The default reward function: `math_reward(response, example["answer"])`."""
    return math_reward(response, example["answer"], timeout_s=timeout_s)


# --- the Math-Verify path -----------------------------------------------------------------------------

_checker: IsolatedRunner | None = None


def checker_runner() -> IsolatedRunner:
    """The process-wide worker that runs Math-Verify checks (started on first use)."""
    global _checker
    if _checker is None:
        _checker = IsolatedRunner(1, memory_limit_mb=CHECK_MEMORY_LIMIT_MB, preload=(__name__,))
    return _checker


@functools.lru_cache(maxsize=VERDICT_CACHE_SIZE)
def _cached_slow_verdict(pred: str, gold: str, float_rounding: int, strict: bool,
                         allow_set_relation_comp: bool, timeout_s: float) -> bool:
    args = (pred, gold, float_rounding, strict, allow_set_relation_comp, timeout_s)
    if running_in_worker():
        return check_with_math_verify(*args)
    outcome = checker_runner().call(f"{__name__}:check_with_math_verify", args, timeout_s)
    return outcome.status == "ok" and bool(outcome.value)


_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_E_NOTATION = re.compile(r"([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)")


def _math_verify_text(answer: str) -> str:
    """The answer as Math-Verify should read it: without the wrapping that `normalize_answer_text` drops.

    Whitespace inside is kept (`\\pi r` is not `\\pir` to a LaTeX parser). A trailing period ends the
    sentence, not the math, yet Math-Verify fails on `12\\text{ cm}.` and misreads `1+i.`. It also reads the
    `e` of `8.7e8` as Euler's number, hence the rewrite to `8.7 \\times 10^{8}`.
    """
    text = answer.strip()
    while True:
        if text.endswith(".") and not text.endswith(".."):      # `1, 2, ...` keeps its ellipsis
            text = text[:-1].rstrip()
            continue
        for fence in ("$$", "$"):
            inner = text[len(fence):-len(fence)]
            # `$a$ or $b$` is two formulas, not one enclosed answer; `$5\$` ends with a literal dollar.
            if (len(text) >= 2 * len(fence) and text.startswith(fence) and text.endswith(fence)
                    and not inner.endswith("\\") and not _UNESCAPED_DOLLAR.search(inner)):
                text = inner.strip()
                break
        else:
            break
    scientific = _E_NOTATION.fullmatch(text)
    return f"{scientific[1]} \\times 10^{{{scientific[2]}}}" if scientific else text


def check_with_math_verify(pred: str, gold: str, float_rounding: int = 6, strict: bool = True,
                           allow_set_relation_comp: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Math-Verify's verdict. Runs unprotected: call it in a worker (as `is_equivalent` does)."""
    from math_verify import verify

    # Math-Verify's own alarm interrupts slow pure-Python work early and gracefully; the worker's hard
    # deadline covers what the alarm cannot interrupt.
    alarm_s = max(1, int(timeout_s / 2))
    gold_parsed = _parse_answer(gold, alarm_s)
    pred_parsed = _parse_answer(pred, alarm_s)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, float_rounding=float_rounding, strict=strict,
                       allow_set_relation_comp=allow_set_relation_comp, timeout_seconds=alarm_s))


def _parse_answer(answer: str, alarm_s: int) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    if _MATH_DELIMITER.search(answer):
        return parse(answer, targets, parsing_timeout=alarm_s)
    return parse("\\boxed{" + answer + "}", targets, parsing_timeout=alarm_s)


if running_in_worker():
    # Timeouts inside a worker are expected and counted by the parent; don't repeat them on stderr.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
