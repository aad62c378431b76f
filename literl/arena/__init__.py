"""The arena: change one trick, hold everything else fixed, repeat over seeds and scenarios.

    spec.py            the ablation spec (YAML): preset, base, baseline, variants, scenarios, seeds → planned runs
    runner.py          runs the plan as `literl train` subprocesses (--jobs, resume, Ctrl-C, progress)
    runs.py            reads run directories back (metrics.jsonl, eval.jsonl, summary.json, diagnostics.json)
    stats.py           pure statistics: final/best/AUC, t intervals, paired bootstrap, verdict, minimum
                       detectable effect
    summary.py         runs → summary.json and the terminal tables
    plots.py, report.py  the self-contained report.html (figures sized for print)
    export.py          `literl report --export`: tables as CSV and LaTeX (figures: plots.save_figure)
    ablation.py        an ablation's output folder (plan.json, summary.json, report.html)
    (the commands `literl ablate` and `literl report` are literl/commands/ablate_command.py, report_command.py)
    sequential.py      seeds in waves: alpha spending, boundaries, decisions, simulation (pure numbers)
    waves.py           running a sequential spec wave by wave
    devices.py         disjoint GPU groups for the runs of one machine (--gpus-per-run)
    (`literl ablate`'s --gpus-per-run, --cluster, --sequential and --plan: literl/commands/ablate_options.py; the
     Ray dispatcher is literl.distributed.arena_dispatch: only that package imports ray)

The arena never imports `literl.algorithm.tricks`: an ablation is config only (style.md §3.6). docs/arena.md has the
spec format, the statistics and the shipped specs; docs/arena-at-scale.md the GPUs, clusters and sequential seeds.
"""
