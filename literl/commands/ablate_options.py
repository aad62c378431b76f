"""`literl ablate`'s options for running at scale: GPUs per run (`--gpus-per-run`, `--devices`), a Ray cluster
(`--cluster`, `--cpus-per-run`), seeds in waves (`--sequential`) and planning before spending (`--plan`,
`--pilot`, `--effect`). docs/arena-at-scale.md is the guide.

Without these options `literl ablate` is what it was: the local runner, `--jobs` at a time, a fixed seed list.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Callable

from literl.config.errors import ConfigError


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus-per-run", type=int, default=None, metavar="K",
                        help="give each run K GPUs of its own (disjoint CUDA_VISIBLE_DEVICES); as many runs at once "
                             "as the GPUs hold, the rest queued. With --cluster: each Ray task asks for K GPUs")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="the GPU ids --gpus-per-run shares out, e.g. 0,1,2,3 (default: $CUDA_VISIBLE_DEVICES, "
                             "else every CUDA device)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS|local",
                        help="run each planned run as a Ray task on this cluster (an address such as "
                             "ray://head:10001 or auto, or 'local' for a cluster on this machine); the --out folder "
                             "must be on storage every node sees")
    parser.add_argument("--cpus-per-run", type=int, default=None, metavar="N",
                        help="with --cluster: CPUs each Ray task asks for, and its torch threads (default: this "
                             "machine's CPUs // --jobs)")
    parser.add_argument("--sequential", default=None, metavar="FIRST,STEP,MAX",
                        help="seeds in waves: FIRST seeds, then STEP more per wave until every comparison is decided "
                             "or MAX seeds ran (e.g. 4,4,16); replaces the spec's seeds with 0..MAX-1")
    parser.add_argument("--plan", action="store_true",
                        help="estimate the seeds needed from a pilot (--pilot) and print them; runs nothing")
    parser.add_argument("--pilot", default=None, metavar="DIR",
                        help="with --plan: an ablation folder of this spec with a summary.json (default: --out's)")
    parser.add_argument("--effect", type=float, default=None,
                        help="with --plan: the true difference to detect, on the score's scale (0.02 = 2 points); "
                             "default: each comparison's observed difference")


def with_sequential(spec, args: argparse.Namespace):
    """The spec with `--sequential` as its design and 0..MAX-1 as its seed pool (or `--seeds`, at least MAX)."""
    from literl.arena.sequential import parse_design

    if args.sequential is None:
        return spec
    design = parse_design(args.sequential, "--sequential")
    seeds = spec.seeds if args.seeds is not None else list(range(design.max))
    if len(seeds) < design.max:
        raise ConfigError(f"--sequential max is {design.max} seeds but --seeds gives {len(seeds)}; give at least "
                          f"{design.max} seeds, or leave --seeds out (0..{design.max - 1})")
    keep = {} if spec.sequential is None else {"margin": spec.sequential.margin, "alpha": spec.sequential.alpha,
                                               "score": spec.sequential.score}
    return replace(spec, sequential=replace(design, **keep), seeds=list(seeds[:design.max]))


def out_dir_suffix(out: Path, args: argparse.Namespace) -> Path:
    """A `--sequential` ablation in a folder of its own (`<name>-sequential_2_2_8`): its summary has other seeds."""
    if args.sequential is None:
        return out
    return out.with_name(out.name + "-sequential_" + "_".join(p.strip() for p in args.sequential.split(",")))


def resolve_jobs(args: argparse.Namespace) -> int:
    """Runs at a time: --jobs, else the number of GPU groups with --gpus-per-run (checked against the devices
    here, before anything runs), else 1."""
    args.device_groups = None
    if args.gpus_per_run is not None and args.cluster is None:
        from literl.arena.devices import device_groups, visible_devices

        args.device_groups = device_groups(visible_devices(args.devices), args.gpus_per_run)
        return min(args.jobs or len(args.device_groups), len(args.device_groups))
    if args.gpus_per_run is not None and args.gpus_per_run < 1:
        raise ConfigError(f"--gpus-per-run must be >= 1, got {args.gpus_per_run}")
    if args.cpus_per_run is not None and args.cpus_per_run < 1:
        raise ConfigError(f"--cpus-per-run must be >= 1, got {args.cpus_per_run}")
    return args.jobs or 1


def dispatcher(args: argparse.Namespace, total_steps: dict, console) -> Callable:
    """runs -> Outcome: the local runner (jobs, device groups) or the Ray dispatcher (--cluster)."""
    from literl.arena.runner import run_ablation, threads_per_run

    if args.cluster is None:
        return lambda runs: run_ablation(runs, total_steps, jobs=args.jobs, threads=args.threads, console=console,
                                         device_groups=args.device_groups)
    from literl.distributed.arena_dispatch import run_on_cluster
    from literl.distributed.cluster import ClusterError

    cpus = args.cpus_per_run or threads_per_run(args.jobs, args.threads)

    def on_cluster(runs):
        try:
            return run_on_cluster(runs, total_steps, address=args.cluster, cpus_per_run=cpus,
                                  gpus_per_run=args.gpus_per_run or 0, console=console)
        except ClusterError as err:     # the command reports it as bad input, with the fix the message names
            raise ConfigError(str(err)) from err
    return on_cluster


def run_waves(spec, out_dir: Path, dispatch: Callable, console):
    from rich.console import Console

    from literl.arena.summary import print_sequential
    from literl.arena.waves import run_in_waves

    def report_wave(wave: int, section: dict) -> None:
        console.print(f"\\[arena] wave {wave} of {section['waves_planned']} done ({section['seeds_used']} seeds)",
                      highlight=False)
        print_sequential(section, Console(stderr=True))

    _, outcome = run_in_waves(spec, out_dir, dispatch, on_wave=report_wave)
    return outcome


# ---------------------------------------------------------------------------------------------- --plan
def print_seed_plan(spec, args: argparse.Namespace, console) -> int:
    """Seeds needed per comparison (paired t, α 0.05, power 80%) for the stated or observed effect at the pilot's
    spread, and, for a sequential spec, the expected seeds and runs under its design (simulated)."""
    import json

    from literl.arena import ablation, stats
    from literl.arena.sequential import simulate

    pilot = Path(args.pilot) if args.pilot else (Path(args.out) if args.out else ablation.default_out_dir(spec))
    path = pilot / ablation.SUMMARY_FILE
    if not path.is_file():
        raise ConfigError(f"--plan needs a pilot: {path} does not exist. Run a few seeds first (e.g. `literl ablate "
                          f"{spec.name} --seeds 0-2 --out {pilot}`) or point --pilot at an earlier ablation folder "
                          "of this spec")
    summary = json.loads(path.read_text())
    score = spec.sequential.score if spec.sequential else "final"
    pilot_base = summary.get("spec", {}).get("base")
    if pilot_base is not None and list(pilot_base) != list(spec.base):
        console.print(f"[yellow]the pilot ran with base {pilot_base}, this spec with {list(spec.base)}: its spread "
                      "holds only if the evaluation size (eval.limit, eval.samples) and the budget are the same[/]")
    runs_per_seed = len(spec.variants) * len(spec.scenarios)
    console.print(f"plan for {spec.name} from the pilot {pilot} ({score}; paired t, α {stats.DETECT_ALPHA}, power "
                  f"{stats.DETECT_POWER:.0%}):", highlight=False)
    stops = []
    for comp in summary.get("comparisons", []):
        entry = comp[score]
        sd, effect = entry.get("sd_diff"), args.effect if args.effect is not None else entry.get("mean_diff")
        name = f"  {comp['variant']} vs {comp['baseline']} / {comp['scenario']}"
        if sd is None or effect is None:
            console.print(f"{name}: the pilot has fewer than 2 pairs; no spread to plan from", highlight=False)
            continue
        needed = stats.seeds_needed(effect, sd)
        line = (f"{name}: s_d {sd:.4f} over {entry['n_pairs']} pairs, effect {effect:+.4f}: "
                f"{needed if needed is not None else 'more than ' + str(stats.MAX_SEEDS_NEEDED)} seeds fixed")
        if spec.sequential is not None and sd > 0:
            sim = simulate(spec.sequential, effect=abs(effect), sd=sd)
            stops.append(sim.seeds_used)
            line += (f"; sequential {spec.sequential.first},{spec.sequential.step},{spec.sequential.max}: "
                     f"{sim.expected_seeds:.1f} seeds expected, resolved in {sim.resolved:.0%}")
        console.print(line, highlight=False)
    if stops:
        import numpy as np

        expected = float(np.mean(np.max(np.vstack(stops), axis=0)))
        console.print(f"expected runs under the sequential design: {expected * runs_per_seed:.1f} of "
                      f"{spec.sequential.max * runs_per_seed} at the ceiling (the ablation runs until its slowest "
                      "comparison; comparisons simulated as independent)", highlight=False)
    return 0
