"""`literl ablate SPEC [key=value ...]`: run every (variant, scenario, seed) of a spec, then statistics and a
report. Rerunning the same command after an interruption finishes only the missing runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
examples:
  literl ablate --list                               # the shipped specs
  literl ablate advantage_norm                       # a shipped spec, into runs/ablations/advantage_norm
  literl ablate my_spec.yaml --jobs 2 --out runs/abl  # 2 runs at a time, threads split between them
  literl ablate clip_higher trainer.steps=10 --out /tmp/quick    # extra overrides for every run
  literl ablate advantage_norm --dry-run             # validate and print the runs without starting them
  literl ablate finding_c --seeds 12-23              # the same spec on other seeds, into finding_c-seeds_12-23
  literl ablate finding_e --variants lite_ppo,grpo   # leave an arm out (the baseline stays)
  literl ablate clip_higher --gpus-per-run 2         # each run on 2 of this machine's GPUs, the rest queued
  literl ablate clip_higher --cluster ray://head:10001 --gpus-per-run 1   # each run a Ray task on the cluster
  literl ablate positive_control --sequential 2,2,8  # seeds in waves, stopping when the answer is known
  literl ablate clip_higher --plan --pilot runs/ablations/clip_higher --effect 0.02   # seeds before spending

Ctrl-C stops launching and lets running runs save a checkpoint; run the same command again to continue.
The spec format is in docs/arena.md; `literl report OUT` rebuilds summary.json and report.html. GPUs, Ray
clusters and sequential seeds: docs/arena-at-scale.md.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("spec", nargs="?", help="spec file, or the name of a shipped spec (see --list)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides added to the spec's base (every run), e.g. trainer.steps=10")
    parser.add_argument("--out", help="output folder (default: runs/ablations/<spec name>)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs at a time (default 1; with --gpus-per-run, as many as the GPUs hold)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads shared by the jobs (default: the CPUs this process may use); each run "
                             "gets threads // jobs")
    parser.add_argument("--seeds", help="run these seeds instead of the spec's: '8-15', '0,1,2' or '0-3,8' ('7' is "
                                        "seed 7 alone, not a count; the default --out then names them)")
    parser.add_argument("--variants", help="run only these variants, comma-separated (the baseline must be one; the "
                                           "default --out then names them)")
    parser.add_argument("--dry-run", action="store_true", help="validate the spec and print the runs, run nothing")
    parser.add_argument("--no-report", action="store_true", help="write summary.json but not report.html")
    parser.add_argument("--list", action="store_true", help="list the shipped specs and exit")
    from literl.commands.ablate_options import add_scale_arguments

    add_scale_arguments(parser)
    from literl.plugins import add_import_argument

    add_import_argument(parser)


def run(args: argparse.Namespace) -> int:
    from literl.arena import ablation
    from literl.arena.runner import threads_per_run
    from literl.arena.spec import check_configs, load_spec
    from literl.config.errors import ConfigError
    from literl.run.lock import DirectoryBusy, DirectoryLock
    from rich.console import Console

    if args.list:
        return _list_specs()
    if not args.spec:
        print("literl ablate: name a spec file or a shipped spec (`literl ablate --list` shows them)", file=sys.stderr)
        return 2
    if (args.jobs is not None and args.jobs < 1) or (args.threads is not None and args.threads < 1):
        print("literl ablate: --jobs and --threads must be >= 1", file=sys.stderr)
        return 2
    from literl.commands import ablate_options as scale_options

    console = Console(stderr=True)
    try:
        spec = scale_options.with_sequential(_narrowed(load_spec(args.spec, extra_base=_with_import_flags(args)),
                                                       args), args)
        out_dir = Path(args.out) if args.out else scale_options.out_dir_suffix(_default_out_dir(spec, args), args)
        if args.plan:
            return scale_options.print_seed_plan(spec, args, Console())
        runs = spec.plan(out_dir)
        steps = check_configs(spec, out_dir)
        args.jobs = scale_options.resolve_jobs(args)        # device groups are checked here, before anything runs
        if args.dry_run:
            return _print_plan(runs, threads_per_run(args.jobs, args.threads))
        # One ablation per folder: a second one would relaunch the same runs, each clearing the other's.
        lock = DirectoryLock(out_dir, what="ablation folder").acquire()
    except (ConfigError, DirectoryBusy, FileExistsError) as err:     # FileExistsError: a link in place of .lock
        print(f"literl ablate: {err}", file=sys.stderr)
        return 2
    try:
        return _run_locked(args, spec, out_dir, runs, steps, console)
    finally:
        lock.release()


def _run_locked(args, spec, out_dir: Path, runs, steps, console) -> int:
    from literl.arena import ablation
    from literl.arena.runner import threads_per_run
    from literl.arena.summary import print_summary
    from literl.config.errors import ConfigError
    from rich.console import Console
    from rich.markup import escape

    try:
        if spec.sequential is None:      # a sequential spec records each wave's plan as it starts it
            ablation.record_plan(out_dir, spec, runs)
    except ConfigError as err:
        print(f"literl ablate: {err}", file=sys.stderr)
        return 2
    console.print(f"\\[arena] {spec.name}: {_count(spec.variants, 'variant')} × {_count(spec.scenarios, 'scenario')}"
                  f" × {_count(spec.seeds, 'seed')} = {_count(runs, 'run')} into {escape(str(out_dir))}, {args.jobs} "
                  f"at a time with {_count(threads_per_run(args.jobs, args.threads), 'thread')} each", highlight=False)
    from literl.commands import ablate_options as scale_options

    dispatch = scale_options.dispatcher(args, {r.directory: steps[(r.variant, r.scenario)] for r in runs}, console)
    try:
        outcome = dispatch(runs) if spec.sequential is None else scale_options.run_waves(spec, out_dir, dispatch,
                                                                                        console)
    except ConfigError as err:        # a cluster that cannot take the runs (unreachable, too small, blind nodes)
        print(f"literl ablate: {err}", file=sys.stderr)
        return 2
    summary = ablation.summarize_ablation(out_dir, report=not args.no_report)
    print_summary(summary, Console())
    if "sequential" in summary:
        from literl.arena.summary import print_sequential

        print_sequential(summary["sequential"], Console())
    console.print(f"\\[arena] summary: {escape(str(out_dir / ablation.SUMMARY_FILE))}"
                  + ("" if args.no_report else f"; report: {escape(str(out_dir / ablation.REPORT_FILE))}"),
                  highlight=False)
    if outcome.failed:
        console.print(f"\\[arena] [red]{len(outcome.failed)} runs failed[/]: "
                      + ", ".join(f"{r.variant}/{r.scenario}/seed_{r.seed} (exit {code})" for r, code in outcome.failed)
                      + ". Fix the cause (see each train.log) and rerun the same command to retry them.",
                      highlight=False)
    if outcome.interrupted:
        console.print("\\[arena] interrupted; rerun the same command to finish the missing runs.", highlight=False)
    return outcome.exit_code


def _listed_variants(args: argparse.Namespace) -> list[str] | None:
    return None if args.variants is None else [v.strip() for v in args.variants.split(",") if v.strip()]


def _narrowed(spec, args: argparse.Namespace):
    from literl.arena.spec import parse_seed_list

    if args.seeds is None and args.variants is None:
        return spec
    return spec.narrowed(seeds=None if args.seeds is None else parse_seed_list(args.seeds),
                         variants=_listed_variants(args))


def _default_out_dir(spec, args: argparse.Namespace) -> Path:
    """runs/ablations/<name>, and with --seeds/--variants a folder of its own (`<name>-seeds_8-15`), so that the
    spec's own runs, summary and report are never replaced by a narrowed rerun's."""
    from literl.arena import ablation

    parts = [] if args.seeds is None else [f"seeds_{''.join(args.seeds.split()).replace(',', '+')}"]
    if args.variants is not None:
        parts.append("variants_" + "+".join(_listed_variants(args)))
    suffix = "".join(f"-{part}" for part in parts)
    out = ablation.default_out_dir(spec)
    return out.with_name(out.name + suffix) if suffix else out


def _count(items, noun: str) -> str:
    n = items if isinstance(items, int) else len(items)
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _with_import_flags(args: argparse.Namespace) -> list[str]:
    """The command's overrides, plus `imports=[...]` listing the spec's own imports and the --import modules, so
    every run (a `literl train` subprocess) imports them before its config is checked."""
    from literl.arena.spec import load_spec
    from literl.config.load import load_config
    from literl.config.plugins import import_user_modules, imports_override, with_imports

    if not args.imports:
        return list(args.overrides)
    import_user_modules(args.imports)
    spec = load_spec(args.spec, extra_base=args.overrides)
    existing = load_config(overrides=[o for o in spec.base if o.split("=", 1)[0].strip() == "imports"]).imports
    return [*args.overrides, imports_override(with_imports(existing, args.imports))]


def _list_specs() -> int:
    from literl.arena.spec import load_spec, shipped_spec_names

    names = shipped_spec_names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        spec = load_spec(name)
        gist = spec.description.split(": ", 1)[0].split(". ", 1)[0]
        runs = f"{len(spec.variants)}×{len(spec.scenarios)}×{len(spec.seeds)} runs"
        print(f"{name:<{width}}  {runs:<13} {gist[:90]}{'…' if len(gist) > 90 else ''}")
    return 0


def _print_plan(runs, threads: int) -> int:
    import shlex

    for run in runs:
        print(f"{run.variant}/{run.scenario}/seed_{run.seed}: {shlex.join(run.command('python', threads)[1:])}")
    print(f"{len(runs)} runs; the configs of every (variant, scenario) load.")
    return 0
