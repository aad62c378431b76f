"""No deprecated API calls from literl's own code: a short run with every DeprecationWarning / FutureWarning
whose caller is literl collected (the nearest frame outside the installed libraries and the standard library
decides, since library warnings point their `stacklevel` at library wrappers such as torch's Module.__call__).

transformers is bounded above in pyproject.toml at the newest version tested (5.24); 5.40 removes the
`past_key_values=` keyword of model forwards, which literl no longer passes to models that take `cache=`
(`literl.model.prompt_pass.cache_keyword`)."""

from __future__ import annotations

import sysconfig
import traceback
import warnings
from pathlib import Path

import pytest

from literl.config.load import load_config
from literl.assembly.api import train
from tests.training.test_trainer import _overrides

LITERL_DIR = Path(__file__).resolve().parents[2] / "literl"
LIBRARY_DIRS = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                                      sysconfig.get_paths()["stdlib"]})


def literl_caller(stack: list[traceback.FrameSummary]) -> str | None:
    """`file:line` of the innermost frame outside the libraries, when it is literl's; else None."""
    for frame in reversed(stack):
        path = str(Path(frame.filename).resolve())
        if path.startswith(LIBRARY_DIRS) or frame.filename.startswith("<") or path == __file__:
            continue
        return f"{frame.filename}:{frame.lineno}" if path.startswith(str(LITERL_DIR)) else None
    return None


@pytest.mark.parametrize("extra", [[], ["model.lora.rank=4"]], ids=["full", "lora"])
def test_literl_calls_no_deprecated_library_api(tiny_qwen3_dir, tmp_path, extra):
    """Fails, listing each literl call site, if a run calls an API that torch or transformers deprecate: a run of the
    whole model, and a LoRA run (whose forwards go through peft's wrapper, which takes the cache keyword literl
    picks and hands it on)."""
    if extra:
        pytest.importorskip("peft")
    offenders: dict[str, str] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (DeprecationWarning, FutureWarning)):
            caller = literl_caller(traceback.extract_stack()[:-1])
            if caller is not None:
                offenders.setdefault(caller, f"{category.__name__}: {message}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        train(load_config(preset="lite_ppo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "run",
                                                                   "trainer.steps=1", "algorithm.kl_coef=0.001",
                                                                   *extra)))
    assert not offenders, "literl calls deprecated APIs:\n" + "\n".join(f"  {k}  {v}" for k, v in offenders.items())
