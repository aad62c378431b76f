"""Code of the user's own that registers tricks (or reward functions) by name, imported before a config is checked,
so that `literl train`, `literl ablate` and `literl config --explain` know the names it registers.

Three ways in, all of which end in `import_user_modules`:

    literl train --import my_tricks algorithm.advantage.name=centered_only     # the flag, repeatable
    imports: [my_tricks]                                                      # the config key (YAML, key=value)
    [project.entry-points."literl.plugins"]  my_tricks = "my_tricks"          # an installed package's entry point

A name is a module (`my_tricks`, `pkg.tricks`) or a Python file (`path/to/my_tricks.py`). The current directory
is searched as `python -m` does, so a module next to where the command runs is found. A config lists its
imports in the run's config.yaml, so a resumed run and every run of an ablation import them too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable

from literl.config.errors import ConfigError

ENTRY_POINT_GROUP = "literl.plugins"  # the entry-point group name (not a module path)
_entry_points_loaded = False


def import_user_modules(names: Iterable[str]) -> None:
    """Import each module or .py file once; errors name the module and the fix."""
    for name in names:
        if str(name).endswith(".py"):
            _import_file(Path(name))
            continue
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())    # as `python -m` would: a module beside the command is found
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"cannot import '{name}' (named by --import or the imports key): {err}. Give a module "
                              "importable from the current directory or PYTHONPATH, or a path to a .py file") from None


def _import_file(path: Path) -> None:
    path = path.expanduser().resolve()
    module_name = f"literl_user_{path.stem}"
    existing = sys.modules.get(module_name)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        return      # imported already: registering its tricks twice would fail
    if not path.is_file():
        raise ConfigError(f"cannot import {path} (named by --import or the imports key): no such file")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise


def load_entry_points() -> None:
    """Import every installed `literl.plugins` entry point, once per process."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:  # noqa: BLE001 - a broken plugin names itself instead of a bare traceback
            raise ConfigError(f"the installed literl plugin '{entry.name}' ({entry.value}, entry point group "
                              f"{ENTRY_POINT_GROUP}) failed to import: {type(err).__name__}: {err}") from None


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import a module (or a .py file) that registers tricks or reward functions before the "
                             "config is checked; repeatable; recorded in the config's `imports` key")


def with_imports(existing: Iterable[str], added: Iterable[str]) -> list[str]:
    """`existing` then `added`, each name once."""
    return list(dict.fromkeys([*existing, *added]))


def imports_override(names: Iterable[str]) -> str:
    """The key=value override that sets the `imports` list."""
    import json

    return f"imports={json.dumps(list(names))}"
