"""`literl presets` and `literl config`: what can be configured, and what a config resolves to."""

from __future__ import annotations

import argparse
import sys


def add_presets_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="show this preset's full file (header and deltas)")


def run_presets(args: argparse.Namespace) -> int:
    from literl.config.load import preset_names, preset_summary, preset_text
    from literl.config.errors import ConfigError

    if args.name:
        try:
            text = preset_text(args.name)
        except ConfigError as err:
            print(f"literl presets: {err}", file=sys.stderr)
            return 2
        print(text)
        return 0
    width = max(len(n) for n in preset_names())
    for name in preset_names():
        print(f"{name:<{width}}  {preset_summary(name)}")
    print("\n`literl presets NAME` shows a preset's changes; `literl train --preset NAME` uses it.")
    return 0


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--explain", action="store_true", help="list every key with its help and every trick")
    parser.add_argument("--markdown", action="store_true",
                        help="print --explain as the Markdown page docs/config-reference.md")
    parser.add_argument("--preset", default="lite_ppo", help="preset to resolve (default: lite_ppo)")
    parser.add_argument("--config", dest="config_file", help="YAML file layered over the preset")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    from literl.config.plugins import add_import_argument

    add_import_argument(parser)


def run_config(args: argparse.Namespace) -> int:
    from literl.config.load import explain, load_config, resolve, to_yaml
    from literl.config.plugins import import_user_modules, imports_override, load_entry_points, with_imports
    from literl.config.errors import ConfigError

    from literl.algorithm.objective import Objective

    try:
        load_entry_points()
        import_user_modules(args.imports)
        if args.explain:
            print(explain())
            return 0
        if args.markdown:
            from literl.config.reference import markdown

            print(markdown(), end="")
            return 0
        preset = None if args.preset == "none" else args.preset
        overrides = list(args.overrides)
        if args.imports:
            base = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
            overrides.append(imports_override(with_imports(base.imports, args.imports)))
        cfg = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
        Objective.from_config(cfg)      # values a trick rejects only when it runs
    except (ConfigError, ValueError) as err:
        print(f"literl config: {err}", file=sys.stderr)
        return 2
    print(to_yaml(resolve(cfg)))
    return 0
