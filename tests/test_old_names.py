"""Names from before the package layout keep working: every old import path gives the module of today (the same
object, so no registry is built twice) with a DeprecationWarning naming the new path, and `rollout.engine=hf` is
read as `native` with a warning, from the command line and from a saved run config."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from literl._moved import MOVED, new_name
from literl.config.load import from_yaml_file, load_config, to_yaml


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_import_path_gives_todays_module(old):
    imported_before = old in sys.modules       # then the warning was given at that first import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert imported_before or any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message)
                                  for w in caught)


def test_a_submodule_of_a_moved_package_is_not_loaded_a_second_time():
    """`literl.tricks.advantages` is `literl.algorithm.tricks.advantages` itself: a second copy would register every
    advantage again (and fail on the duplicate names)."""
    old = importlib.import_module("literl.tricks.advantages")
    assert old is importlib.import_module("literl.algorithm.tricks.advantages")
    assert new_name("literl.tricks.advantages") == "literl.algorithm.tricks.advantages"
    assert new_name("literl.algorithm.tricks") is None and new_name("json") is None


def test_old_names_work_in_a_fresh_process_as_a_user_plugin_would_use_them():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from literl.registry import Registry\nexcept DeprecationWarning as w:\n    print(w)\n"
            "warnings.simplefilter('ignore')\n"
            "from literl.tricks import ADVANTAGES\nfrom literl.config_loader import load_config\n"
            "from literl.rollout.hf_engine import HFEngine\nfrom literl.rollout.native_engine import NativeEngine\n"
            "print(HFEngine is NativeEngine, 'grpo' in ADVANTAGES.names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["literl.registry is now literl.algorithm.registry; import it from there",
                                "True True"]


def test_the_old_engine_name_is_read_as_native_with_a_warning(tmp_path):
    with pytest.warns(FutureWarning, match="rollout.engine=hf is now rollout.engine=native"):
        cfg = load_config(overrides=["rollout.engine=hf"])
    assert cfg.rollout.engine == "native"
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config()).replace("engine: native", "engine: hf"))
    with pytest.warns(FutureWarning):
        assert from_yaml_file(saved).rollout.engine == "native"
