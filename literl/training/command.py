"""`literl train [--preset NAME] [--config FILE] [key=value ...]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from literl.plugins import add_import_argument, with_imports

DEFAULT_PRESET = "lite_ppo"

EPILOG = """\
examples:
  literl train                                   # the embedded testbed with the lite_ppo preset
  literl train --preset dapo trainer.steps=100
  literl train --preset grpo algorithm.policy_loss.name=cispo algorithm.policy_loss.params.ub=5.0
  literl train --model /models/qwen3-0.6b --data math_train --data-dir ../shared/data    # the real-model profile
  literl train --model /models/qwen3-0.6b --data train.jsonl data.chat_template_kwargs.enable_thinking=false
  literl train --import my_tricks algorithm.advantage.name=my_advantage    # a trick registered in my_tricks.py
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
    parser.add_argument("--model", help="a Hugging Face model directory (sets model.path; chooses the real-model "
                                        "profile: model.profile)")
    parser.add_argument("--data", help="training problems: a .jsonl/.parquet file, a benchmark name (e.g. math_train) "
                                       "or a hub dataset id (sets data.train)")
    parser.add_argument("--data-dir", help="folder holding the benchmark files, e.g. ../shared/data (sets data.dir; "
                                           "default $LITERL_DATA_DIR)")
    add_import_argument(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, applied last (e.g. trainer.steps=20 seed=1)")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """--model / --data / --data-dir as key=value overrides (JSON-quoted: any path is a YAML string). They come
    first, so a key=value given on the same line wins."""
    pairs = (("model.path", args.model), ("data.train", args.data), ("data.dir", args.data_dir))
    return [f"{key}={json.dumps(value)}" for key, value in pairs if value is not None]


def run(args: argparse.Namespace) -> int:
    from literl.config_loader import from_yaml_file, load_config, resolve, to_yaml
    from literl.plugins import import_user_modules, imports_override
    from literl.registry import ConfigError

    preset = DEFAULT_PRESET if args.preset is None else None if args.preset == "none" else args.preset
    overrides = [*flag_overrides(args), *args.overrides]
    try:
        import_user_modules(args.imports)
        if args.imports:
            # Recorded in the config (so config.yaml, a resume and `literl config` see them), after any a file names.
            base = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
            overrides.append(imports_override(with_imports(base.imports, args.imports)))
        cfg = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
        saved = Path(cfg.trainer.output_dir or "") / "config.yaml"
        if cfg.trainer.resume and cfg.trainer.output_dir and saved.is_file():
            # Continue the run as it was configured, not as today's defaults would configure it: only what the
            # command names explicitly changes.
            explicit_preset = None if args.preset in (None, "none") else args.preset
            cfg = load_config(preset=explicit_preset, config_file=args.config_file, overrides=overrides,
                              base=from_yaml_file(saved))
    except (ConfigError, FileNotFoundError) as err:
        print(f"literl train: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        notes: list[str] = []
        print(to_yaml(resolve(cfg, notes=notes)))
        for note in notes:
            print(f"[literl] {note}", file=sys.stderr)
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
