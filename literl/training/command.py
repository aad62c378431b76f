"""`literl train [--preset NAME] [--config FILE] [key=value ...]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_PRESET = "lite_ppo"

EPILOG = """\
examples:
  literl train                                   # the embedded testbed with the lite_ppo preset
  literl train --preset dapo trainer.steps=100
  literl train --preset grpo algorithm.policy_loss.name=cispo algorithm.policy_loss.params.ub=5.0
  literl train model.path=/models/qwen3-0.6b data.train=math_train data.dir=/data optim.lr=1e-6
  literl train trainer.output_dir=runs/a trainer.resume=true     # continue an interrupted run from its own
                                                               # config.yaml (overrides given apply on top)

`literl presets` lists presets; `literl config --explain` lists every key and every trick's parameters.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--preset", default=None,
                        help=f"algorithm preset to start from (default: {DEFAULT_PRESET}; 'none' for the bare "
                             "defaults). With trainer.resume=true the run's saved config.yaml is the base instead, "
                             "and a preset given here is layered over it")
    parser.add_argument("--config", dest="config_file", help="YAML file layered over the preset")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, applied last (e.g. trainer.steps=20 seed=1)")


def run(args: argparse.Namespace) -> int:
    from literl.config_loader import from_yaml_file, load_config, resolve, to_yaml
    from literl.registry import ConfigError

    preset = DEFAULT_PRESET if args.preset is None else None if args.preset == "none" else args.preset
    try:
        cfg = load_config(preset=preset, config_file=args.config_file, overrides=args.overrides)
        saved = Path(cfg.trainer.output_dir or "") / "config.yaml"
        if cfg.trainer.resume and cfg.trainer.output_dir and saved.is_file():
            # Continue the run as it was configured, not as today's defaults would configure it: only what the
            # command names explicitly changes.
            explicit_preset = None if args.preset in (None, "none") else args.preset
            cfg = load_config(preset=explicit_preset, config_file=args.config_file, overrides=args.overrides,
                              base=from_yaml_file(saved))
    except (ConfigError, FileNotFoundError) as err:
        print(f"literl train: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        from literl.objective import Objective

        try:
            Objective.from_config(cfg)      # the check a run makes before its model loads
        except (ConfigError, ValueError) as err:
            print(f"literl train: config error: {err}", file=sys.stderr)
            return 2
        print(to_yaml(resolve(cfg)))
        return 0
    from literl.distributed import ClusterError
    from literl.training.api import run as run_training

    try:
        run_training(cfg)
    except KeyboardInterrupt:
        return 130
    except (FileExistsError, FileNotFoundError, ConfigError, ValueError, ClusterError) as err:
        print(f"literl train: {err}", file=sys.stderr)
        return 2
    return 0
