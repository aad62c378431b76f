"""`literl <command>`: the command-line entry point.

Each command lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`, and is
imported only when used, so `literl --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": ("literl.training.command", "Train with RL (default: the embedded testbed with the lite_ppo preset)."),
    "eval": ("literl.evaluation.command", "Evaluate a model on math benchmarks: avg@k, pass@k, maj@k."),
    "difficulty": ("literl.evaluation.difficulty", "Split a problem set into Easy/Medium/Hard by k-sample solve counts."),
    "ablate": ("literl.arena.command", "Run an ablation spec (variants × scenarios × seeds) with statistics and a report."),
    "report": ("literl.arena.report_command", "Build report.html from run or ablation directories."),
    "presets": ("literl.config_command", "List the algorithm presets, one line each."),
    "config": ("literl.config_command", "Print the resolved config, or explain every key (--explain)."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="literl",
        description="Reinforcement learning for LLM reasoning, where every RL trick is one switch.",
        epilog="Run `literl <command> --help` for a command's options. With no command, `literl train` runs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(_module=module_name)
        _lazy_arguments(p, module_name, name)
    return parser


def _lazy_arguments(parser: argparse.ArgumentParser, module_name: str, name: str) -> None:
    # Importing every command module would import torch for `literl --help`; only the chosen one is loaded.
    if name in _requested_command():
        module = importlib.import_module(module_name)
        add = getattr(module, f"add_{name}_arguments", None) or module.add_arguments
        add(parser)


def _requested_command() -> set[str]:
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    return {args[0]} if args else {"train"}


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    argv = sys.argv[1:]
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        sys.argv = [sys.argv[0], "train", *argv]
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:])
    module = importlib.import_module(args._module)
    run = getattr(module, f"run_{args.command}", None) or module.run
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # output piped into `head` and closed early
        return 0


if __name__ == "__main__":
    sys.exit(main())
