"""`literl eval`: evaluate a model directory or a literl run on math benchmarks.

    literl eval --model runs/lite_ppo-20261122 --benchmarks math500,aime24 --samples 4 --data-dir ../shared/data

`--model` is a Hugging Face model directory (with config.json) or a literl run directory, in which case
`<run>/final/` is used if it holds a model, else the newest `<run>/checkpoints/step_*/model/`. Everything is
loaded from local files; nothing is downloaded. Prints a table and writes the full results as JSON.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmarks", default="math500",
                        help="comma-separated benchmark names (see below), .jsonl/.parquet files or hub dataset ids "
                             "(default: math500)")
    parser.add_argument("--samples", type=int, default=4, metavar="K",
                        help="responses sampled per problem; avg@K is the headline accuracy (default: 4)")
    parser.add_argument("--output", default=None, metavar="FILE.json",
                        help="where to write the results JSON (default: eval-<time>.json in the current directory)")
    parser.add_argument("--save-responses", action="store_true",
                        help="also store every response text in the JSON (large)")
    parser.add_argument("--cluster-address", default=None, metavar="ADDRESS",
                        help="sample on rollout workers of a Ray cluster: local (start one here) or a running "
                             "cluster's address, as cluster.address in training (needs pip install 'literl[ray]')")
    parser.add_argument("--rollout-workers", type=int, default=1, metavar="W",
                        help="rollout workers with --cluster-address (default: 1)")
    add_model_and_sampling_arguments(parser, max_new_tokens=1024, temperature=0.6, top_p=0.95)
    from literl.data.benchmarks import benchmark_names

    parser.epilog = f"Known benchmarks: {', '.join(benchmark_names())}."


def add_model_and_sampling_arguments(parser: argparse.ArgumentParser, *, max_new_tokens: int, temperature: float,
                                     top_p: float) -> None:
    """Options shared by `literl eval` and `literl difficulty` (with each command's sampling defaults)."""
    parser.add_argument("--model", required=True,
                        help="a model directory with config.json, or a literl run directory (uses <run>/final/, "
                             "else the newest <run>/checkpoints/step_*/model/)")
    parser.add_argument("--data-dir", default=None,
                        help="folder holding the benchmark files (math500/test.jsonl, ...); default: $LITERL_DATA_DIR")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use only the first N problems of each problem set (the testbed's generated "
                             "held-out splits: N problems, 200 by default, as eval.limit=N in training)")
    parser.add_argument("--template", default="auto", choices=("auto", "chat", "plain", "raw"),
                        help="prompt template: chat (the tokenizer's chat template), plain (problem + 'Please "
                             "reason step by step...'), raw (problem verbatim), auto (chat if the tokenizer has "
                             "one, else plain). Default: auto")
    parser.add_argument("--temperature", type=float, default=temperature,
                        help=f"sampling temperature (default: {temperature:g})")
    parser.add_argument("--top-p", type=float, default=top_p,
                        help=f"nucleus sampling threshold, 1 disables it (default: {top_p:g})")
    parser.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 disables it (default: 0)")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                        help=f"response length cap; longer responses count as truncated (default: {max_new_tokens})")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences generated together (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="model precision (default: float32)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where the model runs; auto picks cuda when available (default: auto)")
    parser.add_argument("--problem-field", default="problem", help="field holding the problem text (default: problem)")
    parser.add_argument("--answer-field", default="answer", help="field holding the gold answer (default: answer)")
    parser.add_argument("--id-field", default="id", help="field holding a row id; row numbers when absent "
                                                         "(default: id)")


def run(args: argparse.Namespace) -> int:
    from literl.data.prompts import resolve_template
    from literl.evaluation.evaluate import evaluate, print_results

    try:
        check_counts(args)
        sampling = sampling_params(args)
        model_dir, engine, tokenizer = load_engine(args.model, dtype=args.dtype, device=args.device)
        if getattr(args, "cluster_address", None):
            engine = cluster_engine(engine, args)
        problem_sets = {s.name: s for s in load_problem_sets(args.benchmarks, args)}
        template = resolve_template(args.template, tokenizer)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"literl eval: error: {err}", file=sys.stderr)
        return 2
    output = Path(args.output or f"eval-{datetime.now():%Y%m%d-%H%M%S}.json")
    result = evaluate(engine, tokenizer, problem_sets, sampling=sampling, samples=args.samples,
                      template=template, batch_size=args.batch_size, seed=args.seed, show_progress=True,
                      keep_responses=args.save_responses, output_path=output,
                      metadata={"model": str(model_dir), "command": "literl eval"})
    print_results(result)
    print(f"results written to {output}")
    return 0


def cluster_engine(engine, args: argparse.Namespace):
    """The same engine's settings on `--rollout-workers` Ray actors (literl.distributed.rollout)."""
    import torch

    from literl.config.load import load_config
    from literl.distributed import connect
    from literl.distributed.rollout import RayRolloutEngine

    cfg = load_config(overrides=[f"cluster.address={args.cluster_address}", f"cluster.rollout_workers={args.rollout_workers}",
                                 f"model.dtype={args.dtype}"])
    ray = connect(cfg.cluster)
    # A worker holds float32 weights (what a trainer's sync sends); its engine keeps its own copy in --dtype.
    options = dict(eos_token_ids=engine.eos_token_ids, pad_id=engine.pad_id,
                   dtype=None if args.dtype == "float32" else getattr(torch, args.dtype))
    return RayRolloutEngine(ray, cfg, policy=engine.model.cpu(), engine_options=options)


def check_counts(args: argparse.Namespace) -> None:
    """Reject a count that cannot work before the model loads, which is the slow part."""
    for option, value in (("--samples", args.samples), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ValueError(f"{option} must be >= 1 (got {value})")


def sampling_params(args: argparse.Namespace):
    from literl.rollout.engine import SamplingParams

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          max_new_tokens=args.max_new_tokens, greedy=args.greedy)


def load_problem_sets(sources: str, args: argparse.Namespace) -> list:
    from literl.data.problems import load_problems

    names = [s.strip() for s in str(sources).split(",") if s.strip()]
    if not names:
        raise ValueError("no problem set given; pass e.g. --benchmarks math500,aime24")
    sets = [load_problems(name, data_dir=args.data_dir, limit=args.limit, problem_field=args.problem_field,
                          answer_field=args.answer_field, id_field=args.id_field,
                          field_option="--{role}-field <one of them>") for name in names]
    seen = [s.name for s in sets]
    repeated = sorted({n for n in seen if seen.count(n) > 1})
    if repeated:
        raise ValueError(f"several problem sets are named {', '.join(repeated)} (results are keyed by name); "
                         "rename the files or list each benchmark once")
    return sets


def resolve_model_dir(path: str | Path) -> Path:
    """A model directory: `path` itself, `<run>/final/`, or the newest `<run>/checkpoints/step_*/model/`."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--model {root} is not a directory; pass a model directory (with config.json) "
                                "or a literl run directory")
    if (root / "config.json").is_file():
        return root
    if (root / "final" / "config.json").is_file():
        return root / "final"
    checkpoints = [p for p in root.glob("checkpoints/step_*/model") if (p / "config.json").is_file()]
    if checkpoints:
        return max(checkpoints, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    raise FileNotFoundError(f"{root} holds no model: looked for {root}/config.json, {root}/final/config.json and "
                            f"{root}/checkpoints/step_*/model/config.json")


def load_engine(path: str | Path, *, dtype: str = "float32", device: str = "auto") -> tuple[Path, Any, Any]:
    """(model directory, NativeEngine, tokenizer) from local files only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from literl.rollout.native_engine import NativeEngine
    from literl.assembly.model_loading import eos_token_ids, pad_token_id

    model_dir = resolve_model_dir(path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is available; use --device cpu or auto")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                     local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers, safetensors and tokenizers raise many types
        from literl.model.damaged_files import load_failure_message

        damaged = load_failure_message(model_dir, err)
        if damaged:
            raise FileNotFoundError(damaged) from None
        if not isinstance(err, OSError):
            raise
        raise FileNotFoundError(f"could not load a causal LM and its tokenizer from {model_dir}: {err}") from None
    model.to(device).eval()
    engine = NativeEngine(model, eos_token_ids=eos_token_ids(model, tokenizer), pad_id=pad_token_id(tokenizer))
    return model_dir, engine, tokenizer
