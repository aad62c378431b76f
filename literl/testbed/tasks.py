"""Synthetic arithmetic problems with step-by-step worked solutions: the testbed's task family.

A problem is an expression over small integers with `+`, `-` and `*` (usual precedence). The prompt the
model sees is the `problem` string verbatim (the "raw" template), which ends with a newline: the
solution starts right after it. A worked solution writes one step per line, products first (left to
right), then sums and differences left to right, and ends with the boxed answer:

    problem:   "What is 3+4*5-2?\\n"
    solution:  "4*5=20\\n3+20=23\\n23-2=21\\n\\\\boxed{21}"

Every operand and every intermediate value lies in 0–99, so each step is a one- or two-digit fact.

Tiers (operations per expression, probability of drawing a two-digit operand):
    easy 1–2 ops, 30% | medium 2–3 ops, 30% | hard 3–4 ops, 45% | mixed 1–4 ops, 30% (the default)
    long 1–12 ops, 30%: worked solutions from ~16 to ~110 characters (7× apart, ~0.45 coefficient of
         variation against ~0.3 in mixed), the length spread that token- vs sequence-level loss weighting and
         a short length budget act on (docs/testbed.md, "Regimes")
Expressions with a value outside 0–99 are redrawn (keeping the op count), which removes many two-digit
operands: the share that survives is about 20% (easy), 19% (medium), 26% (hard), 18% (mixed).

Splits: a problem belongs to the held-out split when a hash of its expression falls in a fixed 1/8 of
the hash space, so the train and held-out splits are disjoint for every seed and tier.

Slips: with `slip_rate > 0`, each step's written result is wrong with that probability (off by 1–3 or
10) and later steps compute from the wrong value, as a person who slips would. The record's `answer` is
always the true value; only the `solution` text carries slips. Slipped solutions are SFT data for the
base model, so that it stays imperfect and RL has something to fix.

Styles (how a solution is written; the problems and answers are the canonical stream's in every style, and so are the
slips, but for the checked style's checked solutions, which have none):
    canonical  as above
    varied     each line in one of its equivalent forms (`solution_text`)
    end_loop   half of the solutions write their last step line again and again before the boxed answer
               (`repeat_last_step`): a base model's "no-stop repetition", which runs past a length budget
    skewed     each line canonical 85% of the time, else in one of its other equivalent forms
               (`skewed_solution_text`): valid alternatives at a few percent each
    checked    half of the solutions check each step: the step line, then "check " and the same step again, with no
               slip (`checked_solution_text`): a solution ~2.5x longer and more often right, which a short length
               budget cuts
    direct     half of the solutions are the boxed answer alone, right, with no step written (`direct_solution_text`):
               a short way that computes in one token what the worked way computes over its lines, so that at 3-4
               operations it is right far less often whatever RL does, and a short budget cuts only the worked way

Records are dicts `{"id", "problem", "answer" (str), "solution", "tier", "num_ops", "difficulty"}`, where
`difficulty` is "<num_ops>_ops" ("<low>-<high>_ops" in a tier that buckets op counts, e.g. long's "4-6_ops").
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator

MAX_VALUE = 99
HELDOUT_SEED = 20251121
HELDOUT_BUCKETS = 8          # one bucket in eight of the expression-hash space is held out
PROMPT_PREFIX = "What is "
PROMPT_SUFFIX = "?\n"        # the newline marks where the solution starts
SLIP_OFFSETS = (-10, -3, -2, -1, 1, 2, 3, 10)
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class TierSpec:
    """How hard a tier's expressions are."""

    min_ops: int
    max_ops: int
    two_digit_rate: float
    """Probability that an operand is drawn from 10–99 rather than 1–9."""
    ops_per_label: int = 1
    """Op counts per `difficulty` label: 1 gives "3_ops"; 3 gives "1-3_ops", "4-6_ops", ... (a tier with many op
    counts keeps its per-difficulty diagnostics to a few curves)."""

    def difficulty(self, num_ops: int) -> str:
        """The `difficulty` label of a problem with `num_ops` operations."""
        if self.ops_per_label == 1:
            return f"{num_ops}_ops"
        low = self.min_ops + (num_ops - self.min_ops) // self.ops_per_label * self.ops_per_label
        return f"{low}-{min(low + self.ops_per_label - 1, self.max_ops)}_ops"


TIERS: dict[str, TierSpec] = {
    "easy": TierSpec(min_ops=1, max_ops=2, two_digit_rate=0.30),
    "medium": TierSpec(min_ops=2, max_ops=3, two_digit_rate=0.30),
    "hard": TierSpec(min_ops=3, max_ops=4, two_digit_rate=0.45),
    "mixed": TierSpec(min_ops=1, max_ops=4, two_digit_rate=0.30),
    "long": TierSpec(min_ops=1, max_ops=12, two_digit_rate=0.30, ops_per_label=3),
}


def expression_text(numbers: list[int], ops: list[str]) -> str:
    """Render `numbers[0] ops[0] numbers[1] ...` without spaces, e.g. "3+4*5-2"."""
    parts = [str(numbers[0])]
    for op, number in zip(ops, numbers[1:]):
        parts.append(op + str(number))
    return "".join(parts)


def _apply(left: int, op: str, right: int) -> int:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    raise ValueError(f"unknown operator {op!r}; expected one of + - *")


def solution_steps(numbers: list[int], ops: list[str], *, slip_rate: float = 0.0,
                   rng: random.Random | None = None) -> tuple[list[tuple[int, str, int, int]], int] | None:
    """Work the expression step by step; return ([(left, op, right, written_result)], true_answer).

    The order is: leftmost product first until none is left, then left to right. A slipped step
    writes a wrong result and the wrong value is what later steps use. Returns None when some true
    intermediate value (or, with slips, some written value) leaves 0–MAX_VALUE.
    """
    if slip_rate > 0 and rng is None:
        raise ValueError("slip_rate > 0 needs an rng so that slips are reproducible")
    values, pending_ops = list(numbers), list(ops)
    true_values, true_ops = list(numbers), list(ops)
    steps = []
    while pending_ops:
        i = pending_ops.index("*") if "*" in pending_ops else 0
        left, op, right = values[i], pending_ops[i], values[i + 1]
        true_result = _apply(true_values[i], true_ops[i], true_values[i + 1])
        result = _apply(left, op, right)
        if not 0 <= true_result <= MAX_VALUE or not 0 <= result <= MAX_VALUE:
            return None
        if slip_rate > 0 and rng.random() < slip_rate:
            slipped = [result + d for d in SLIP_OFFSETS if 0 <= result + d <= MAX_VALUE]
            result = rng.choice(slipped)
        steps.append((left, op, right, result))
        values[i:i + 2] = [result]
        del pending_ops[i]
        true_values[i:i + 2] = [true_result]
        del true_ops[i]
    return steps, true_values[0]


def _line_text(left: int, op: str, right: int, result: int, *, swapped: bool, spaced: bool) -> str:
    """One step line in one of its equivalent forms: operands in the written or the swapped order, with or without
    spaces ("4*5=20", "5 * 4 = 20"). Only + and * may swap."""
    if swapped:
        left, right = right, left
    return f"{left} {op} {right} = {result}" if spaced else f"{left}{op}{right}={result}"


def solution_text(steps: list[tuple[int, str, int, int]], *, style_rng: random.Random | None = None) -> str:
    """One "a op b=c" line per step, then `\\boxed{}` around the last written value.

    With `style_rng` (the "varied" style) each line is written in one of the equally valid forms a person might
    use: the operands of + and * in either order, with or without spaces ("4*5=20", "5 * 4 = 20"), each chosen
    with probability 1/2 — so a policy trained on them has many tokens with valid alternatives."""
    lines = []
    for left, op, right, result in steps:
        swapped = style_rng is not None and op in "+*" and style_rng.random() < 0.5
        spaced = style_rng is not None and style_rng.random() < 0.5
        lines.append(_line_text(left, op, right, result, swapped=swapped, spaced=spaced))
    return "\n".join(lines + [f"\\boxed{{{steps[-1][3]}}}"])


SKEWED_CANONICAL_RATE = 0.85
"""Share of "skewed" lines written in the canonical form; the rest take one of the line's other forms."""


def skewed_solution_text(steps: list[tuple[int, str, int, int]], rng: random.Random) -> str:
    """The "skewed" style: each line is canonical with probability `SKEWED_CANONICAL_RATE`, else written in one of
    its other equivalent forms drawn uniformly (for + and *: swapped, spaced, or both, ~5% each; for -: spaced,
    15%). A policy trained on these puts ~0.85 on the canonical choice and a few percent on each valid
    alternative: low-probability tokens that a correct response can carry, the "exploration" tokens that PPO's
    upper clip bound caps (DAPO §3.1; LitePPO §4.2). The `varied` style's 50/50 choices leave alternatives near
    p = 0.5, whose ratio rarely passes 1.2 (results/testbed/regimes.md, rejected probes)."""
    lines = []
    for left, op, right, result in steps:
        swapped = spaced = False
        if rng.random() >= SKEWED_CANONICAL_RATE:
            others = [(True, False), (False, True), (True, True)] if op in "+*" else [(False, True)]
            swapped, spaced = rng.choice(others)
        lines.append(_line_text(left, op, right, result, swapped=swapped, spaced=spaced))
    return "\n".join(lines + [f"\\boxed{{{steps[-1][3]}}}"])


CHECKED_SOLUTION_RATE = 0.5
"""Share of "checked" solutions that check every step (the rest are the canonical text)."""
CHECK_PREFIX = "check "


def checked_solution_text(numbers: list[int], ops: list[str]) -> str:
    """A careful solver's solution: each step line, then "check " and the same step worked again, every value right:

        "4*5=20\ncheck 4*5=20\n3+20=23\ncheck 3+20=23\n\\boxed{23}"

    ~2.5x as long as the canonical text (a step costs ~8 + 14 characters against ~8) and, in the SFT data, never
    slipped: careful reasoning that is longer and more accurate, as a reasoning model's self-verification is, and that
    a short length budget cuts before its answer (finding_d's regime: docs/testbed.md, "Regimes").

    Why no slips at all: a first build slipped the step lines at the canonical rate and wrote only the check lines
    right; the policy it gave got its check lines right 81.5% of the time against 70% for its unchecked lines, and
    its checked responses at 3-4 operations only 10 points more often right than its unchecked ones (the bar was 15;
    results/testbed/regimes.md, rejected probes)."""
    worked = solution_steps(numbers, ops)
    if worked is None:
        raise ValueError(f"expression {expression_text(numbers, ops)!r} leaves 0-{MAX_VALUE}; no checked solution")
    steps, answer = worked
    lines = []
    for left, op, right, result in steps:
        line = _line_text(left, op, right, result, swapped=False, spaced=False)
        lines += [line, CHECK_PREFIX + line]
    return "\n".join(lines + [f"\\boxed{{{answer}}}"])


DIRECT_SOLUTION_RATE = 0.5
"""Share of "direct" solutions that write the answer alone (the rest are the canonical text)."""


def direct_solution_text(answer: int) -> str:
    """An answer without its working: "\\boxed{23}". In the SFT data it is always right, so a policy taught it learns
    to answer at once what it cannot compute at once: a 1-operation answer is one fact, as a step line's result is,
    but a 3-4-operation one chains facts no line writes down, so the tiny model mostly guesses (docs/testbed.md,
    `direct`). The worked way's edge there is computation that needs its tokens, which RL cannot hand to the short
    way within a run — the edge the `checked` regime lacked (its careful form's only edge was slip-free lines, which
    RL gave every form: results/findings/finding_d.md)."""
    if not 0 <= answer <= MAX_VALUE:
        raise ValueError(f"answer {answer} leaves 0-{MAX_VALUE}; no direct solution")
    return f"\\boxed{{{answer}}}"


def split_of(expression: str) -> str:
    """The split an expression belongs to, fixed by a hash of its text (independent of any seed)."""
    digest = hashlib.sha256(expression.encode()).digest()
    return "heldout" if digest[0] % HELDOUT_BUCKETS == 0 else "train"


def _draw_expression(rng: random.Random, spec: TierSpec) -> tuple[list[int], list[str]]:
    num_ops = rng.randint(spec.min_ops, spec.max_ops)
    # Redraw operators and operands but keep num_ops, so the tier's op-count mix stays uniform.
    while True:
        ops = [rng.choice("+-*") for _ in range(num_ops)]
        numbers = [rng.randint(10, 99) if rng.random() < spec.two_digit_rate else rng.randint(1, 9)
                   for _ in range(num_ops + 1)]
        if solution_steps(numbers, ops) is not None:
            return numbers, ops


SOLUTION_STYLES = ("canonical", "varied", "end_loop", "skewed", "checked", "direct")

LOOP_SOLUTION_RATE = 0.5
"""Share of "end_loop" solutions that repeat their last step line."""
LOOP_CONTINUE = 0.9
"""After each repeat the line is written once more with this probability: the count of repeats is geometric (mean
1 / (1 - 0.9) = 10), memoryless as a base model's no-stop repetition is (whether it stops does not depend on how
long it has run). With long-tier lines of ~8 characters, a loop of 12 or more repeats (probability 0.9^11 = 0.31)
carries a ~60-character solution past a 160-token budget: ~16% of the solutions, cut where the policy imitates them."""
LOOP_MAX_REPEATS = 36
"""A cap that keeps every looping example (a prompt of <= ~50 characters, a solution of <= ~110 and 36 repeats of
<= 9) within the model's 512 positions."""


def repeat_last_step(solution: str, rng: random.Random) -> str:
    """The "end_loop" style: with probability `LOOP_SOLUTION_RATE`, the last step line of `solution` (the one before
    the boxed answer) is written again `r` times right after itself, `r` >= 1 geometric with continuation
    `LOOP_CONTINUE` (capped at `LOOP_MAX_REPEATS`), and the solution then boxes its answer as before. The repeats
    change no value, so a looping solution is as right or wrong as its canonical text: repetition costs a response
    only where a length budget cuts it (no boxed answer, reward 0), which is how it costs a base model in RL.

    Why the last step: a first build repeated a step chosen anywhere, and the tiny model, which finds the next
    operand by where it is in the chain, lost its place after a loop (held-out sampled accuracy 40% -> 13.5%, with
    only 4.4% of responses cut by the budget: docs/testbed.md). A loop at the end leaves every step before it where
    it was."""
    if rng.random() >= LOOP_SOLUTION_RATE:
        return solution
    lines = solution.split("\n")
    repeats = 1
    while repeats < LOOP_MAX_REPEATS and rng.random() < LOOP_CONTINUE:
        repeats += 1
    return "\n".join(lines[:-1] + [lines[-2]] * repeats + lines[-1:])


def problem_stream(*, split: str, tier: str = "mixed", seed: int,
                   slip_rate: float = 0.0, style: str = "canonical") -> Iterator[dict]:
    """An endless, seed-determined stream of records from one split and tier (repeats are possible). `style`
    "varied" writes the solutions in randomly chosen equivalent forms (`solution_text`), "skewed" mostly in the
    canonical one (`skewed_solution_text`), "end_loop" repeats the last step line in half of them
    (`repeat_last_step`), "checked" checks every step, slip-free, in half of them (`checked_solution_text`),
    "direct" writes the right answer alone in half of them (`direct_solution_text`); the problems, answers and the
    other solutions' slips are those of the canonical stream."""
    if style not in SOLUTION_STYLES:
        raise ValueError(f"unknown solution style {style!r}; expected one of {SOLUTION_STYLES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {sorted(TIERS)}")
    if not 0.0 <= slip_rate < 1.0:
        raise ValueError(f"slip_rate must be in [0, 1) (got {slip_rate})")
    spec = TIERS[tier]
    rng = random.Random(f"literl-testbed:{split}:{tier}:{seed}")
    slip_rng = random.Random(f"literl-testbed-slips:{split}:{tier}:{seed}")
    style_rng = random.Random(f"literl-testbed-style:{split}:{tier}:{seed}") if style == "varied" else None
    loop_rng = random.Random(f"literl-testbed-loops:{split}:{tier}:{seed}") if style == "end_loop" else None
    skew_rng = random.Random(f"literl-testbed-skew:{split}:{tier}:{seed}") if style == "skewed" else None
    check_rng = random.Random(f"literl-testbed-check:{split}:{tier}:{seed}") if style == "checked" else None
    direct_rng = random.Random(f"literl-testbed-direct:{split}:{tier}:{seed}") if style == "direct" else None
    index = 0
    while True:
        numbers, ops = _draw_expression(rng, spec)
        expression = expression_text(numbers, ops)
        if split_of(expression) != split:
            continue
        # Slips are drawn for every record, a checked one too, so the other solutions keep the canonical stream's.
        worked = None
        while worked is None:   # a slip can push a later value out of range: draw the slips again
            worked = solution_steps(numbers, ops, slip_rate=slip_rate, rng=slip_rng)
        steps, answer = worked
        solution = (skewed_solution_text(steps, skew_rng) if skew_rng is not None
                    else solution_text(steps, style_rng=style_rng))
        if loop_rng is not None:
            solution = repeat_last_step(solution, loop_rng)
        if check_rng is not None and check_rng.random() < CHECKED_SOLUTION_RATE:
            solution = checked_solution_text(numbers, ops)
        if direct_rng is not None and direct_rng.random() < DIRECT_SOLUTION_RATE:
            solution = direct_solution_text(answer)
        yield {
            "id": f"{split}-{tier}-{seed}-{index}",
            "problem": f"{PROMPT_PREFIX}{expression}{PROMPT_SUFFIX}",
            "answer": str(answer),
            "solution": solution,
            "tier": tier,
            "num_ops": len(ops),
            # per-problem hardness for the per-difficulty reward-std diagnostic (the tier is one label
            # for the whole mixed set)
            "difficulty": spec.difficulty(len(ops)),
        }
        index += 1


def make_problems(n: int, *, split: str, tier: str = "mixed", seed: int, slip_rate: float = 0.0,
                  unique: bool = False) -> list[dict]:
    """The first `n` records of `problem_stream`; with `unique`, repeated problems are skipped."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    records, seen = [], set()
    max_draws = 200 * n + 1000   # only reached when the tier has fewer than n distinct problems
    for draws, record in enumerate(problem_stream(split=split, tier=tier, seed=seed, slip_rate=slip_rate)):
        if len(records) == n:
            break
        if draws >= max_draws:
            raise ValueError(f"could not find {n} distinct {tier!r} problems in the {split} split")
        if unique and record["problem"] in seen:
            continue
        seen.add(record["problem"])
        records.append(record)
    return records


def train_problems(n: int, *, tier: str = "mixed", seed: int = 0, slip_rate: float = 0.0) -> list[dict]:
    """Training records (repeats allowed, as in an endless stream)."""
    return make_problems(n, split="train", tier=tier, seed=seed, slip_rate=slip_rate)


def heldout_problems(n: int = 200, tier: str = "mixed", seed: int = HELDOUT_SEED) -> list[dict]:
    """Distinct held-out records with clean solutions; the default seed gives everyone the same set."""
    return make_problems(n, split="heldout", tier=tier, seed=seed, unique=True)


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"[+-]?\d+")


def extract_boxed_integer(response: str) -> int | None:
    """The integer inside the last `\\boxed{...}`, or None if there is none or it is not an integer."""
    boxed = _BOXED.findall(response)
    if not boxed:
        return None
    content = boxed[-1].strip()
    return int(content) if _INTEGER.fullmatch(content) else None


def is_correct(response: str, answer: str | int) -> bool:
    """Exact integer match of the last `\\boxed{}` in `response` with `answer`."""
    predicted = extract_boxed_integer(response)
    return predicted is not None and predicted == int(answer)
