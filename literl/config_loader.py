"""Loading, checking, resolving and explaining configs; the preset catalogue.

`load_config` merges: dataclass defaults ← preset YAML ← user YAML ← dotted overrides, then `validate`
checks every trick against its registry and every cross-key rule in one place. Compatibility rules about
trick names live here and nowhere else outside the registries (style.md §3.5).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from literl.config import Config, TrickSpec
from literl.registry import ConfigError

PRESET_DIR = "configs/presets"
# Algorithm fields that hold one trick, and the registry each one is checked against.
SINGLE_TRICKS = {"advantage": "advantage", "policy_loss": "policy_loss", "aggregation": "aggregation",
                 "is_correction": "is_correction", "kl": "kl", "group_filter": "group_filter"}
MULTI_TRICKS = {"loss_masks": "loss_mask", "reward_shaping": "reward_shaping"}
CHOICES = {
    "model.dtype": ("float32", "bfloat16"),
    "rollout.dtype": ("float32", "bfloat16"),
    "rollout.decode": ("auto", "static", "dynamic"),
    "optim.schedule": ("constant", "linear", "cosine"),
    "trainer.recompute_old_logp": ("auto", "always"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "data.template": ("auto", "plain", "chat", "raw"),
    "data.difficulty": ("easy", "medium", "hard", "mixed"),
    "model.testbed": ("base", "aligned", "micro"),
}
TESTBED_LR = 5e-5      # tuned on the testbed (docs/testbed.md); 3e-4 collapsed it in the prototype
HF_MODEL_LR = 1e-6     # LitePPO paper §3.1


# ---------------------------------------------------------------------------------------------- presets
def preset_names() -> list[str]:
    folder = resources.files("literl").joinpath(PRESET_DIR)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    if name not in preset_names():
        close = difflib.get_close_matches(name, preset_names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown preset '{name}'.{hint} Valid presets: {', '.join(preset_names())} "
                          f"(`literl presets` describes them).")
    return resources.files("literl").joinpath(PRESET_DIR, f"{name}.yaml").read_text()


def preset_summary(name: str) -> str:
    """The first header line of a preset file, without the leading '# name:'."""
    first = preset_text(name).splitlines()[0].lstrip("# ").strip()
    return first.split(":", 1)[1].strip() if first.startswith(f"{name}:") else first


# ---------------------------------------------------------------------------------------------- loading
def load_config(preset: str | None = None, config_file: str | Path | None = None,
                overrides: Iterable[str] = (), *, base: Config | None = None) -> Config:
    """Build a validated Config. Raises ConfigError with the fix on any bad key, value or trick."""
    layers = [OmegaConf.structured(base or Config())]
    if preset:
        layers.append(_parse_yaml(preset_text(preset), f"preset '{preset}'"))
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}. Pass an existing YAML file to --config.")
        layers.append(_parse_yaml(path.read_text(), str(path)))
    overrides = list(overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value (e.g. trainer.steps=100)")
    if overrides:
        layers.append(OmegaConf.from_dotlist(overrides))
    merged = layers[0]
    for layer, source in zip(layers[1:], _layer_names(preset, config_file, overrides)):
        merged = _merge(merged, layer, source)
    cfg: Config = OmegaConf.to_object(merged)
    if preset and cfg.preset is None:
        cfg.preset = preset
    validate(cfg)
    return cfg


def _layer_names(preset, config_file, overrides) -> list[str]:
    names = [f"preset '{preset}'"] if preset else []
    names += [str(config_file)] if config_file else []
    names += ["command-line overrides"] if overrides else []
    return names


def _parse_yaml(text: str, source: str):
    try:
        node = OmegaConf.create(text)
    except Exception as err:  # yaml syntax errors come in several types
        raise ConfigError(f"{source} is not valid YAML: {err}") from None
    return node if node is not None else OmegaConf.create({})


def _merge(base, layer, source: str):
    _forget_params_of_renamed_tricks(base, layer)
    try:
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        msg = str(err).splitlines()[0]
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        valid = _valid_keys(parent)
        listing = f" Valid keys under '{parent or '<top>'}': {', '.join(valid)}." if valid else ""
        raise ConfigError(f"bad config key or value '{key}' in {source}: {msg}.{listing} "
                          f"`literl config --explain` lists every key.") from None


def _forget_params_of_renamed_tricks(base, layer) -> None:
    """A layer that switches a trick to another name starts from that trick's own defaults: params set for
    the previous trick (say ppo_clip's eps_high from a preset) must not leak into the new one."""
    algo = layer.get("algorithm") if hasattr(layer, "get") else None
    if not algo or not hasattr(algo, "get"):
        return
    for field_name in SINGLE_TRICKS:
        spec = algo.get(field_name)
        new_name = spec.get("name") if spec is not None and hasattr(spec, "get") else None
        if new_name is not None and new_name != base.algorithm[field_name].name:
            base.algorithm[field_name].params = {}


def _valid_keys(dotted_parent: str) -> list[str]:
    node: Any = Config()
    for part in filter(None, dotted_parent.split(".")):
        node = getattr(node, part, None)
        if not dataclasses.is_dataclass(node):
            return []
    return [f.name for f in dataclasses.fields(node)]


# ---------------------------------------------------------------------------------------------- checks
def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Every rule about which values and tricks work together, in one function."""
    from literl.tricks import ALL

    algo = cfg.algorithm
    for field_name, axis in SINGLE_TRICKS.items():
        spec = getattr(algo, field_name)
        ALL[axis].check(spec.name, spec.params, where=f"algorithm.{field_name}")
    for field_name, axis in MULTI_TRICKS.items():
        for name, params in getattr(algo, field_name).items():
            ALL[axis].check(name, params or {}, where=f"algorithm.{field_name}.{name}")
    for key, valid in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        _check(value in valid, f"{key}={value!r} is not one of: {', '.join(valid)}")

    r, t = cfg.rollout, cfg.trainer
    _check(r.prompts_per_step >= 1 and r.group_size >= 1, "rollout.prompts_per_step and rollout.group_size must be >= 1")
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
    _check(r.max_rounds >= 1, "rollout.max_rounds must be >= 1 (1 = no resampling)")
    _check(t.steps >= 0, "trainer.steps must be >= 0")
    _check(1 <= t.minibatches <= r.prompts_per_step,
           f"trainer.minibatches={t.minibatches} must be between 1 and rollout.prompts_per_step={r.prompts_per_step} "
           "(mini-batches hold whole groups)")
    _check(t.micro_batch_tokens >= 1, "trainer.micro_batch_tokens must be >= 1")
    _check(cfg.eval.samples >= 1, "eval.samples must be >= 1")
    _check(cfg.reward.timeout_s > 0, "reward.timeout_s must be > 0")
    _check(len(cfg.reward.fns) >= 1, "reward.fns needs at least one function (the first decides accuracy)")
    for fn in cfg.reward.fns:
        _check(":" in fn.fn, f"reward fn '{fn.fn}' must be an import path 'package.module:function'")
    for tracker in t.trackers:
        _check(tracker in ("tensorboard", "wandb"), f"trainer.trackers: unknown tracker '{tracker}' "
                                                     "(valid: tensorboard, wandb)")

    # Combinations that silently do the wrong thing in other frameworks.
    _check(not (algo.policy_loss.name == "minirl" and algo.is_correction.name != "none"),
           "algorithm.policy_loss=minirl already weights tokens by π_θ/μ_old (with its own TIS); set "
           "algorithm.is_correction.name=none, or use minirl's params (tis_cap, train_infer_is)")
    _check(not (algo.bypass_mode and algo.is_correction.name != "none"),
           "algorithm.bypass_mode uses the rollout log-probs as old_logp, so the ratio already covers the "
           "training–inference gap and an IS correction would always be 1; set algorithm.is_correction.name=none")
    if algo.policy_loss.name in ("gspo", "gspo_token") and algo.aggregation.name != "seq_mean_token_mean":
        warnings.warn(f"{algo.policy_loss.name} is defined with seq_mean_token_mean aggregation "
                      f"(algorithms.md §2.5); {algo.aggregation.name} weights each sequence by its length")
    if algo.group_filter.name != "keep_all" and r.max_rounds == 1:
        warnings.warn("a group filter with rollout.max_rounds=1 drops groups without refilling the batch; "
                      "set rollout.max_rounds>1 to resample (DAPO dynamic sampling)")
    if algo.kl_in_reward and algo.kl_coef == 0:
        warnings.warn("algorithm.kl_in_reward=true has no effect while algorithm.kl_coef=0")

    from literl.objective import Objective  # noqa: PLC0415 - the objective imports this module's users

    Objective.from_config(cfg).self_check()


def resolve(cfg: Config) -> Config:
    """Fill the 'auto' values that depend on other keys, so the saved config says exactly what ran."""
    out = dataclasses.replace(cfg)
    if out.optim.lr is None:
        out.optim = dataclasses.replace(out.optim, lr=TESTBED_LR if out.model.path is None else HF_MODEL_LR)
    ev = out.eval
    out.eval = dataclasses.replace(
        ev, temperature=ev.temperature if ev.temperature is not None else out.rollout.temperature,
        max_new_tokens=ev.max_new_tokens if ev.max_new_tokens is not None else out.rollout.max_new_tokens)
    return out


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml_file(path: str | Path) -> Config:
    """Read a saved (resolved) config back, e.g. a run directory's config.yaml."""
    node = OmegaConf.merge(OmegaConf.structured(Config()), OmegaConf.load(path))
    return OmegaConf.to_object(node)


# ---------------------------------------------------------------------------------------------- explain
def explain() -> str:
    """Every config key with its default and help, then every trick with its parameters."""
    from literl.tricks import ALL

    lines: list[str] = []

    def walk(obj, prefix: str):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value) and not isinstance(value, TrickSpec):
                lines.append(f"{key}:  # {f.metadata.get('help', '')}")
                walk(value, key + ".")
                continue
            lines.append(f"  {key} = {_show(value)}    # {f.metadata.get('help', '')}")

    walk(Config(), "")
    lines.append("\nTricks (algorithm.<axis>.name, algorithm.<axis>.params.<param>):")
    for axis, registry in ALL.items():
        lines.append(f"  {axis}:")
        for name in registry.names():
            params = ", ".join(f"{k}={v!r}" for k, v in registry.params_of(name).items())
            doc = (registry.get(name).__doc__ or "").strip().splitlines()[0]
            lines.append(f"    {name}({params})  — {doc}")
    return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, TrickSpec):
        return f"{value.name} {value.params or ''}".strip()
    if dataclasses.is_dataclass(value):
        return str(dataclasses.asdict(value))
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return str([dataclasses.asdict(v) for v in value])
    return repr(value)
