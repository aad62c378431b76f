"""literl: reinforcement learning for language models on verifiable reasoning tasks.

Every RL trick is one switch (see `literl.algorithm.tricks` and `literl config --explain`), and the arena
(`literl ablate`) tests tricks fairly over seeds and scenarios. Python API:

    import literl
    cfg = literl.load_config(preset="lite_ppo", overrides=["trainer.steps=40"])
    run_dir = literl.train(cfg)                      # the embedded testbed
    literl.math_reward(r"... \\boxed{42}", "42")      # 1.0
"""

from literl import _moved
from literl.config.schema import Config, TrickSpec, trick
from literl.config.load import load_config, preset_names
from literl.config.errors import ConfigError

__version__ = "0.1.0"

_moved.install()        # import paths from before the package layout keep working (literl/_moved.py)


def math_reward(response: str, gold: str) -> float:
    """1.0 if the final \\boxed{} answer of `response` is equivalent to `gold`, else 0.0 (time-bounded)."""
    from literl.rewards.math_answer import math_reward as _math_reward

    return _math_reward(response, gold)


def train(config: Config | None = None, **kwargs):
    """Train and return the run directory; see `literl.assembly.api.train` for the arguments."""
    from literl.assembly.api import train as _train

    return _train(config, **kwargs)


__all__ = ["Config", "ConfigError", "TrickSpec", "trick", "load_config", "preset_names", "math_reward", "train",
           "__version__"]
