"""The Python entry point, for notebooks and scripts (the shape TRL users know).

    import literl
    cfg = literl.load_config(preset="dr_grpo", overrides=["trainer.steps=50", "rollout.max_new_tokens=512"])
    run_dir = literl.train(cfg, model="path/to/hf-model", problems="train.jsonl",
                           reward_fns=["literl.rewards.math_answer:math_accuracy", (my_format_bonus, 0.1)])
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from literl.config.schema import Config
from literl.config.load import load_config
from literl.config.rules import validate


def train(config: Config | None = None, *, model: torch.nn.Module | str | None = None, tokenizer=None,
          problems: Sequence[dict] | str | None = None,
          reward_fns: Sequence[Callable | str | tuple] | None = None,
          overrides: Sequence[str] = ()) -> Path:
    """Train a policy with RL and return its run directory.

    config      a Config (default: the lite_ppo preset); `overrides` are applied on top as key=value
    model       a causal LM module (then pass its tokenizer), a model directory, or None (the testbed)
    problems    a list of {"problem", "answer", ...} dicts, a file, a benchmark name, or None (config)
    reward_fns  functions f(response, example) -> float, import paths 'pkg.mod:fn', or (fn, weight) pairs;
                None: the config's reward.fns. The first one decides accuracy.
    """
    if config is None:
        config = load_config(preset="lite_ppo", overrides=list(overrides))
    elif overrides:
        config = load_config(overrides=list(overrides), base=config)
    else:
        validate(config)
    return run(config, model=model, tokenizer=tokenizer, problems=problems, reward_fns=reward_fns)


def run(config: Config, **objects) -> Path:
    """Train from a config that `load_config` (or `train`) already validated: resolve it, build the run's
    components (the objective among them), loop. `objects` are `train`'s model, tokenizer, problems, reward_fns."""
    from literl.assembly.builder import build_components
    from literl.training.trainer import Trainer

    return Trainer(build_components(config, **objects)).fit()
