"""The Python entry point's example (literl/assembly/api.py) names only what exists: every `literl.<name>` it
uses is an attribute of the package, and every reward import path 'package.module:function' imports, so the
example a user copies cannot go stale again (it once showed `literl.math_reward_fn`, which never existed)."""

from __future__ import annotations

import importlib
import re

import literl
from literl.assembly import api


def test_every_name_the_api_example_uses_exists():
    example = api.__doc__
    names = set(re.findall(r"\bliterl\.([A-Za-z_]\w*)\b(?![.:\w])", example))
    paths = set(re.findall(r"[\"']([\w.]+:\w+)[\"']", example))
    assert names >= {"load_config", "train"}, "the scan found nothing: has the example's form changed?"
    assert sorted(n for n in names if not hasattr(literl, n)) == []
    for path in paths:
        module, _, function = path.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), path
