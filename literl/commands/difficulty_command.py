"""`literl difficulty`: split a problem set into Easy / Medium / Hard by how often a model solves it.

For each problem, sample k responses (default 8) and count the correct ones, c ∈ {0..k}. Then

    hard    c ≤ hard_max                 default hard_max   = ⌊k · 2/8⌋   (k = 8: 0–2)
    medium  hard_max < c ≤ medium_max    default medium_max = ⌊k · 5/8⌋   (k = 8: 3–5)
    easy    c > medium_max                                               (k = 8: 6–8)

The k = 8 thresholds are our proposal for a toy reproduction of the LitePPO difficulty tiers
(arXiv:2508.08221 Fig. 2 only shows the histogram; see algorithms.md §8.1); other k scale them.

Writes to the output directory (atomically): counts.jsonl (id, num_correct, samples, answer),
histogram.png (problems per correct count), easy.jsonl / medium.jsonl / hard.jsonl (the normalised
problem records plus num_correct) and summary.json.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from literl.data.files import write_atomic, write_json_atomic, write_jsonl_atomic

TIERS = ("easy", "medium", "hard")
HARD_FRACTION, MEDIUM_FRACTION = 2 / 8, 5 / 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from literl.commands.eval_command import add_model_and_sampling_arguments

    parser.add_argument("--problems", required=True,
                        help="the problem set: a benchmark name, a .jsonl/.parquet file or a hub dataset id")
    parser.add_argument("--samples", type=int, default=8, metavar="K", help="responses per problem (default: 8)")
    parser.add_argument("--hard-max", type=int, default=None, metavar="C",
                        help="most correct answers for 'hard' (default: floor(K*2/8), 2 for K=8)")
    parser.add_argument("--medium-max", type=int, default=None, metavar="C",
                        help="most correct answers for 'medium' (default: floor(K*5/8), 5 for K=8)")
    parser.add_argument("--output-dir", default=None,
                        help="where the counts, histogram and splits go (default: difficulty-<problem set>)")
    # The policy's own distribution (what RL samples from), not a tuned evaluation setting.
    add_model_and_sampling_arguments(parser, max_new_tokens=1024, temperature=1.0, top_p=1.0)


def default_thresholds(samples: int) -> tuple[int, int]:
    """(hard_max, medium_max) for k samples: ⌊k·2/8⌋ and ⌊k·5/8⌋."""
    return int(samples * HARD_FRACTION), int(samples * MEDIUM_FRACTION)


def tier_of(num_correct: int, hard_max: int, medium_max: int) -> str:
    if num_correct <= hard_max:
        return "hard"
    return "medium" if num_correct <= medium_max else "easy"


def split_by_difficulty(records: Sequence[dict], counts: Sequence[int], *, hard_max: int, medium_max: int
                        ) -> dict[str, list[dict]]:
    """Records grouped by tier, each with its `num_correct` added."""
    if not 0 <= hard_max <= medium_max:
        raise ValueError(f"thresholds must satisfy 0 <= hard_max <= medium_max (got {hard_max}, {medium_max})")
    tiers: dict[str, list[dict]] = {tier: [] for tier in TIERS}
    for record, count in zip(records, counts, strict=True):
        tiers[tier_of(count, hard_max, medium_max)].append({**record, "num_correct": count})
    return tiers


def plot_histogram(counts: Sequence[int], samples: int, path: Path, *, title: str, hard_max: int,
                   medium_max: int) -> Path:
    """Bar chart of problems per correct count, coloured by tier, saved as PNG."""
    # The Agg canvas directly, not pyplot: no global backend switch in a process that may have its own.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    frequency = Counter(counts)
    xs = list(range(samples + 1))
    colours = {"hard": "#c0392b", "medium": "#e6a23c", "easy": "#27ae60"}
    fig = Figure(figsize=(6, 3.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar(xs, [frequency.get(x, 0) for x in xs], color=[colours[tier_of(x, hard_max, medium_max)] for x in xs])
    ax.set_xticks(xs)
    ax.set_xlabel(f"correct responses out of {samples}")
    ax.set_ylabel("problems")
    ax.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return write_atomic(path, lambda f: f.write(buffer.getvalue()), binary=True)


def write_difficulty_outputs(output_dir: Path, name: str, records: Sequence[dict], counts: Sequence[int],
                             samples: int, hard_max: int, medium_max: int,
                             metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write counts, histogram, splits and summary; return the summary."""
    output_dir = Path(output_dir)
    tiers = split_by_difficulty(records, counts, hard_max=hard_max, medium_max=medium_max)
    write_jsonl_atomic(output_dir / "counts.jsonl",
                       ({"id": r["id"], "num_correct": c, "samples": samples, "answer": r["answer"]}
                        for r, c in zip(records, counts)))
    plot_histogram(counts, samples, output_dir / "histogram.png", title=f"{name}: correct of {samples} samples",
                   hard_max=hard_max, medium_max=medium_max)
    for tier, rows in tiers.items():
        write_jsonl_atomic(output_dir / f"{tier}.jsonl", rows)
    summary = {
        "problem_set": name, "samples": samples, "num_problems": len(records),
        "thresholds": {"hard": [0, hard_max], "medium": [hard_max + 1, medium_max], "easy": [medium_max + 1, samples]},
        "tier_sizes": {tier: len(rows) for tier, rows in tiers.items()},
        "histogram": {str(c): n for c, n in sorted(Counter(counts).items())},
        "mean_accuracy": sum(counts) / max(1, len(records) * samples),
        **(metadata or {}),
    }
    write_json_atomic(output_dir / "summary.json", summary)
    return summary


def run(args: argparse.Namespace) -> int:
    from literl.data.prompts import resolve_template
    from literl.commands.eval_command import check_counts, load_engine, load_problem_sets, sampling_params
    from literl.evaluation.evaluate import evaluate

    try:
        check_counts(args)
        default_hard, default_medium = default_thresholds(args.samples)
        hard_max = default_hard if args.hard_max is None else args.hard_max
        medium_max = default_medium if args.medium_max is None else args.medium_max
        if not 0 <= hard_max <= medium_max <= args.samples:
            raise ValueError(f"need 0 <= --hard-max <= --medium-max <= --samples (got {hard_max}, {medium_max}, "
                             f"{args.samples})")
        sampling = sampling_params(args)
        if args.output_dir and Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
            # checked before sampling: the counts of every problem would be lost at the first write
            raise ValueError(f"--output-dir {args.output_dir} is a file, not a folder; name a folder (it is "
                             "created when missing)")
        model_dir, engine, tokenizer = load_engine(args.model, dtype=args.dtype, device=args.device)
        (problems,) = load_problem_sets(args.problems, args)
        if len(problems) == 0:
            raise ValueError(f"--problems {args.problems} has no usable problem (every row was skipped: see the "
                             "warning above); fix its answers or choose another set")
        template = resolve_template(args.template, tokenizer)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"literl difficulty: error: {err}", file=sys.stderr)
        return 2
    result = evaluate(engine, tokenizer, {problems.name: problems}, sampling=sampling, samples=args.samples,
                      template=template, batch_size=args.batch_size, seed=args.seed, show_progress=True)
    counts = [p["num_correct"] for p in result["benchmarks"][problems.name]["problems"]]
    output_dir = Path(args.output_dir or f"difficulty-{problems.name}")
    summary = write_difficulty_outputs(output_dir, problems.name, list(problems), counts, args.samples,
                                       hard_max, medium_max, metadata={"model": str(model_dir)})
    _print_summary(summary, output_dir)
    return 0


def _print_summary(summary: dict, output_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"difficulty of {summary['problem_set']} ({summary['samples']} samples per problem)")
    for column in ("tier", "correct", "problems", "share"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    total = max(1, summary["num_problems"])
    for tier in TIERS:
        low, high = summary["thresholds"][tier]
        size = summary["tier_sizes"][tier]
        table.add_row(tier, f"{low}–{high}", str(size), f"{100 * size / total:.1f}%")
    console = Console()
    console.print(table)
    console.print(f"mean accuracy {100 * summary['mean_accuracy']:.1f}%; counts, histogram.png and "
                  f"easy/medium/hard.jsonl written to {output_dir}")
