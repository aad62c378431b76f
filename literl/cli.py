"""`literl <command>`: the command-line entry point.

Each command lives in its own module exposing `add_arguments(parser)` and `run(args) -> int` (or
`add_<command>_arguments` / `run_<command>` when one module serves several commands), and is imported only
when used, so `literl --help` stays fast. Options may sit anywhere among key=value overrides.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": ("literl.commands.train_command",
              "Train with RL (default: the embedded testbed with the lite_ppo preset)."),
    "eval": ("literl.commands.eval_command", "Evaluate a model on math benchmarks: avg@k, pass@k, maj@k."),
    "difficulty": ("literl.commands.difficulty_command",
                   "Split a problem set into Easy/Medium/Hard by k-sample solve counts."),
    "ablate": ("literl.commands.ablate_command",
               "Run an ablation spec (variants × scenarios × seeds) with statistics and a report."),
    "report": ("literl.commands.report_command", "Build report.html from run or ablation directories."),
    "presets": ("literl.commands.config_command", "List the algorithm presets, one line each."),
    "config": ("literl.commands.config_command", "Print the resolved config, or explain every key (--explain)."),
}


def top_level_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: literl <command> [options] [key=value ...]", "",
             "Reinforcement learning for LLM reasoning, where every RL trick is one switch.", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "With no command, `literl train` runs. `literl <command> --help` shows a command's options."]
    return "\n".join(lines)


def command_parser(name: str):
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"literl {name}", description=help_text,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = getattr(module, f"add_{name}_arguments", None) or module.add_arguments
    add(parser)
    run = getattr(module, f"run_{name}", None) or module.run
    return parser, run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(top_level_help())
        return 0
    if not argv or argv[0] not in COMMANDS:
        argv = ["train", *argv]
    name, rest = argv[0], argv[1:]
    parser, run = command_parser(name)
    try:
        args = parser.parse_intermixed_args(rest)
    except TypeError:                       # a command whose arguments argparse cannot intermix
        args = parser.parse_args(rest)
    args.command = name
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # output piped into `head` and closed early
        return 0
    except Exception as err:
        # A bad input that a command forgot to catch still gets its message and fix, not a traceback; so does a
        # vLLM engine that died, hung or could not start (its message quotes its log and says what was saved).
        from literl.config.errors import ConfigError
        from literl.rollout.vllm_process import VllmEngineError

        if not isinstance(err, (ConfigError, VllmEngineError)):
            raise
        print(f"literl {name}: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
