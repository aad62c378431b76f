"""The configuration: a typed tree of knobs (`schema`), loaded and checked (`load`, `rules`), the profiles that
fill what a config leaves null (`profiles`), user modules imported before it is checked (`plugins`), and the one
error a bad config raises (`errors`).

    from literl.config.schema import Config, load_config
    cfg = load_config(preset="dr_grpo", overrides=["trainer.steps=50"])

The names below are read lazily, so that importing `literl.config.errors` (which every layer may do) loads nothing
else.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Config": "schema", "TrickSpec": "schema", "trick": "schema", "knob": "schema", "ModelConfig": "schema",
            "LoraSpec": "schema", "DataConfig": "schema", "RolloutConfig": "schema", "VllmConfig": "schema",
            "RewardConfig": "schema", "RewardFnSpec": "schema", "AlgorithmConfig": "schema", "OptimConfig": "schema",
            "TrainerConfig": "schema", "EvalConfig": "schema", "ClusterConfig": "schema",
            "ENGINE_CHOICE_ON_GPU": "schema", "ConfigError": "errors", "load_config": "load",
            "preset_names": "load", "validate": "rules"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
