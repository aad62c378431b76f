"""`literl train [--preset NAME] [--config FILE] [key=value ...]`."""

from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  literl train                                   # the embedded testbed with the lite_ppo preset
  literl train --preset dapo trainer.steps=100
  literl train --preset grpo algorithm.policy_loss.name=cispo algorithm.policy_loss.params.ub=5.0
  literl train model.path=/models/qwen3-0.6b data.train=math_train data.dir=/data optim.lr=1e-6
  literl train trainer.output_dir=runs/a trainer.resume=true     # continue an interrupted run

`literl presets` lists presets; `literl config --explain` lists every key and every trick's parameters.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--preset", default="lite_ppo",
                        help="algorithm preset to start from (default: lite_ppo; 'none' for the bare defaults)")
    parser.add_argument("--config", dest="config_file", help="YAML file layered over the preset")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, applied last (e.g. trainer.steps=20 seed=1)")


def run(args: argparse.Namespace) -> int:
    from literl.config_loader import load_config, resolve, to_yaml
    from literl.registry import ConfigError

    preset = None if args.preset in (None, "none") else args.preset
    try:
        cfg = load_config(preset=preset, config_file=args.config_file, overrides=args.overrides)
    except (ConfigError, FileNotFoundError) as err:
        print(f"literl train: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_yaml(resolve(cfg)))
        return 0
    from literl.training.api import train

    try:
        train(cfg)
    except KeyboardInterrupt:
        return 130
    except (FileExistsError, FileNotFoundError, ConfigError, ValueError) as err:
        print(f"literl train: {err}", file=sys.stderr)
        return 2
    return 0
