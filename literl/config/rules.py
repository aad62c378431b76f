"""Which config values and tricks work together. The rules live next to what they rule, and `validate` walks them:

- every knob's declared values (`literl.config.schema.knob(range=..., choices=...)`), over the whole config tree;
- every trick's parameters and their ranges, against its registry (`literl.algorithm.registry`);
- every trick's compatibility declarations (`register(compatibility=...)`): the other axes' tricks it is defined
  with, the settings under which it does not do what it is chosen for;
- and the few rules across keys that belong to no one knob or trick, each a small named function below (lists
  that must hold something, the cluster, the vLLM engine, asynchronous runs, bypass mode, settings without
  effect). No rule here compares a trick's name to a string (style.md §3.5).

`literl.config.load.load_config` calls `validate` on every config it builds. Values a trick can only reject when it
runs (a soft-overlong cache longer than the generation cap) are caught by the objective's self-check when it is
built (`literl.algorithm.objective.Objective.from_config`): once per run, before the model loads, and by
`literl config` / `literl ablate` for the configs they check.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from literl.algorithm.registry import UnderSettings, broken_clause, compatibility_problems
from literl.config.errors import ConfigError
from literl.config.multiturn_keys import check_multiturn_keys
from literl.config.schema import KNOB_KEYS, KNOB_RANGES, Config, TrickSpec

# Algorithm fields that hold one trick, and the registry each one is checked against.
SINGLE_TRICKS = {"advantage": "advantage", "policy_loss": "policy_loss", "aggregation": "aggregation",
                 "is_correction": "is_correction", "kl": "kl", "group_filter": "group_filter"}
MULTI_TRICKS = {"loss_masks": "loss_mask", "policy_masks": "policy_mask", "reward_shaping": "reward_shaping"}


def validate(cfg: Config) -> None:
    """Walk every declared rule, then the cross-key ones; the first problem raises ConfigError with its fix."""
    from literl.config.plugins import import_user_modules, load_entry_points
    from literl.algorithm.tricks import ALL

    _check_finite(cfg)
    # The user's own tricks register when their modules import: before any name is checked.
    load_entry_points()
    import_user_modules(cfg.imports)
    _check_trick_parameters(cfg, ALL)
    _check_knobs(cfg, cfg)
    _check_list_knobs(cfg)
    _check_cluster(cfg)
    _check_vllm(cfg.rollout)
    _check_async(cfg)
    check_multiturn_keys(cfg)
    trick_warnings = _check_trick_compatibility(cfg, ALL)
    _check_bypass_mode(cfg, ALL)
    for message in trick_warnings:
        warnings.warn(message)
    _warn_settings_without_effect(cfg, ALL)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_finite(node, prefix: str = "") -> None:
    """NaN or ±inf in any setting (optim.lr=inf, rescale.low=nan) would poison every weight: refuse it at load."""
    if dataclasses.is_dataclass(node):
        items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, (list, tuple)):
        items = list(enumerate(node))
    else:
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{prefix}={node} is not a finite number; give a finite value (for no limit, "
                              f"leave the key unset or use its documented 'off' value)")
        return
    for key, value in items:
        _check_finite(value, f"{prefix}.{key}" if prefix else str(key))


# ---------------------------------------------------------------------------------------------- declared rules
def _check_trick_parameters(cfg: Config, registries) -> None:
    """Each chosen trick exists and takes the parameters given, each in its declared range."""
    algo = cfg.algorithm
    context = {"max_new_tokens": cfg.rollout.max_new_tokens}    # what Objective.from_config fills in
    for field_name, axis in SINGLE_TRICKS.items():
        spec = getattr(algo, field_name)
        registries[axis].check(spec.name, spec.params, where=f"algorithm.{field_name}", context=context)
    for field_name, axis in MULTI_TRICKS.items():
        for name, params in getattr(algo, field_name).items():
            registries[axis].check(name, params or {}, where=f"algorithm.{field_name}.{name}", context=context)


def _check_knobs(node, cfg: Config, prefix: str = "") -> None:
    """Every knob of the tree under `node` against its declared range and choices (a trick is its registry's)."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if isinstance(value, TrickSpec):
            continue
        if dataclasses.is_dataclass(value):
            _check_knobs(value, cfg, f"{key}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                _check_knobs(item, cfg, f"{key}.{i}.")
        else:
            _check_knob(key, value, f.metadata, KNOB_RANGES.get((type(node), f.name)), node, cfg)


def _check_knob(key: str, value, metadata, clauses, section, cfg: Config) -> None:
    if value is None:       # the schema's type admits null only where null has a meaning (OmegaConf checks it)
        return
    choices = metadata.get("choices")
    if isinstance(value, list):
        for item in value if choices else ():
            _check(item in choices, f"{key} holds {item!r}, which is not one of: {', '.join(choices)}")
        return
    if clauses and isinstance(value, (int, float)) and not isinstance(value, bool):
        broken = broken_clause(value, clauses, lambda operand: _operand(operand, key, section, cfg)[1])
        _check(broken is None, _out_of_range(key, value, metadata, clauses, section, cfg))
    elif choices and not clauses:
        _check(value in choices, f"{key}={value!r} is not one of: {', '.join(choices)}"
                                 + (f" ({metadata['hint']})" if metadata.get("hint") else ""))
    elif clauses and value not in (choices or ()):
        raise ConfigError(_out_of_range(key, value, metadata, clauses, section, cfg))


def _operand(operand: str, key: str, section, cfg: Config):
    """A range's named operand as (its full key, its value): a key of the same section, or a full key."""
    if "." not in operand:
        return f"{key.rpartition('.')[0]}.{operand}".lstrip("."), getattr(section, operand)
    node = cfg
    for part in operand.split("."):
        node = getattr(node, part)
    return operand, node


def _out_of_range(key: str, value, metadata, clauses, section, cfg: Config) -> str:
    """'trainer.minibatches=64 must be >= 1 and <= rollout.prompts_per_step=8 (mini-batches hold whole groups)'."""
    def shown(operand):
        if not isinstance(operand, str):
            return _number(operand)
        name, bound = _operand(operand, key, section, cfg)
        return f"{name}={bound}"

    (low_op, low), (high_op, high) = sorted(clauses, key=lambda c: c[0][0] == "<") if len(clauses) == 2 else [
        ("", ""), ("", "")]
    if low_op in (">", ">=") and high_op in ("<", "<=") and not isinstance(low, str) and not isinstance(high, str):
        # '> 0 and <= 1' reads as 'in (0, 1]'
        text = f"in {'[' if low_op == '>=' else '('}{_number(low)}, {_number(high)}{']' if high_op == '<=' else ')'}"
    else:
        text = " and ".join(f"{op} {shown(operand)}" for op, operand in clauses)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number:
        text = f"a number {text}"
    choices = "".join(f", or {choice}" for choice in metadata.get("choices") or ())
    null = f", or null {metadata['null']}" if metadata.get("null") else ""
    hint = f" ({metadata['hint']})" if metadata.get("hint") else ""
    return f"{key}={value!r} must be {text}{choices}{null}{hint}"


def _check_trick_compatibility(cfg: Config, registries) -> list[str]:
    """The chosen tricks' compatibility declarations: raise the first error, return the warnings (in order)."""
    _check_declared_settings_exist(registries)
    algo = cfg.algorithm
    chosen = {axis: {getattr(algo, field_name).name: getattr(algo, field_name).params}
              for field_name, axis in SINGLE_TRICKS.items()}
    chosen.update({axis: dict(getattr(algo, field_name)) for field_name, axis in MULTI_TRICKS.items()})
    problems = compatibility_problems(registries, chosen, lambda key: _operand(key, key, cfg, cfg)[1])
    for is_error, message in problems:
        _check(not is_error, message)
    return [message for is_error, message in problems if not is_error]


def _check_declared_settings_exist(registries) -> None:
    """A declaration's config keys are strings the trick's module cannot check (tricks import no config): a key
    that does not exist would never match, so it is refused here, naming the trick that declares it."""
    for axis, registry in registries.items():
        for name in registry.names():
            for declaration in registry.compatibility_of(name):
                settings = declaration.settings if isinstance(declaration, UnderSettings) else {}
                unknown = sorted(set(settings) - KNOB_KEYS)
                _check(not unknown, f"{axis} '{name}' declares a rule on {', '.join(unknown)}, which is not a "
                                    f"config key (`literl config --explain` lists them); fix its registration")


# ---------------------------------------------------------------------------------------------- cross-key rules
def _check_list_knobs(cfg: Config) -> None:
    """Lists that must hold something, or hold it in a given shape."""
    betas = cfg.optim.betas
    _check(len(betas) == 2 and all(0 <= b < 1 for b in betas),
           f"optim.betas={list(betas)} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.999]")
    micro = cfg.trainer.micro_batch_tokens
    _check(not isinstance(micro, float), f"trainer.micro_batch_tokens={micro!r} must be an integer >= 1, or auto "
                                         "(16384 on CPU, sized from free GPU memory on CUDA)")
    _check(len(cfg.reward.fns) >= 1, "reward.fns needs at least one function (the first decides accuracy)")
    for fn in cfg.reward.fns:
        _check(":" in fn.fn, f"reward fn '{fn.fn}' must be an import path 'package.module:function'")
    _check(len(cfg.model.lora.target_modules) >= 1,
           "model.lora.target_modules needs at least one module name, or [all-linear]")


def _check_cluster(cfg: Config) -> None:
    c = cfg.cluster
    _check(c.address is None or str(c.address).strip() != "",
           "cluster.address is empty: use null (one process), local, or a Ray cluster's address")
    _check(c.address is None or cfg.rollout.engine != "vllm",
           "cluster.address with rollout.engine=vllm: the rollout workers of a Ray cluster run literl's HF engine "
           "(a vLLM engine per worker is not built yet); set rollout.engine=native, or cluster.address=null")
    _check(c.address is None or cfg.model.lora.rank == 0,
           "cluster.address with model.lora.rank > 0: the trainer ranks shard a plain model and the rollout workers "
           "sync its weights; LoRA runs in one process for now (set cluster.address=null, or model.lora.rank=0)")


def _check_vllm(r) -> None:
    _check(r.engine != "vllm" or r.dtype in ("float32", "bfloat16"),
           f"rollout.engine=vllm runs rollout.dtype=float32 or bfloat16, not {r.dtype} (literl's FP8-like rounding "
           "is its own engine's: use rollout.engine=native; vLLM's own FP8, rollout.vllm.extra={quantization: fp8}, "
           "needs a GPU and is untested here)")


def _number(value) -> str:
    """A bound as written: whole numbers in full (2^32 - 1 is 4294967295, not 4.29497e+09), others as %g."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else format(value, "g")


def _check_async(cfg: Config) -> None:
    r = cfg.rollout
    _check(r.max_staleness <= max(cfg.trainer.steps, 1),
           f"rollout.max_staleness={r.max_staleness} exceeds trainer.steps={cfg.trainer.steps}: the bound could "
           f"never be reached and every batch would come from the starting policy; set rollout.max_staleness <= "
           f"trainer.steps")
    _check(not r.partial_rollouts or r.max_staleness >= 1,
           "rollout.partial_rollouts=true switches a running response to a newer policy version, which only an "
           "asynchronous run has: set rollout.max_staleness >= 1, or partial_rollouts=false")
    _check(not r.partial_rollouts or (r.engine == "native" and cfg.cluster.address is None),
           "rollout.partial_rollouts=true needs literl's own engine in the trainer's process (rollout.engine=native, "
           "cluster.address=null): it loads the next version's weights between two decode steps of a running batch, "
           "which the vLLM engine's offline API and the Ray rollout workers do not offer; use max_staleness alone "
           "there")
    _check(r.max_staleness == 0 or r.engine != "native" or cfg.cluster.address is not None
           or not (r.compile or cfg.trainer.compile),
           "rollout.max_staleness >= 1 with literl's engine in the trainer's process runs generation and the update "
           "in two threads at once, and torch.compile is not safe to run from two threads: set rollout.compile=false "
           "and trainer.compile=false, or use rollout.engine=vllm (or Ray rollout workers, cluster.address)")


def _check_bypass_mode(cfg: Config, registries) -> None:
    """Bypass mode takes the rollout's log-probs as old_logp: nothing may need the pass it skips."""
    algo = cfg.algorithm
    _check(not (algo.bypass_mode and algo.routing_replay == "r2"),
           "algorithm.routing_replay=r2 replays the routes of the old-log-prob pass, which algorithm.bypass_mode "
           "skips; use routing_replay=r3 (the engine's routes) or turn bypass_mode off")
    _check(not (algo.bypass_mode and not registries["is_correction"].is_identity(algo.is_correction.name)),
           "algorithm.bypass_mode uses the rollout log-probs as old_logp, so the ratio already covers the "
           "training–inference gap and an IS correction would always be 1; set algorithm.is_correction.name=none")


def _warn_settings_without_effect(cfg: Config, registries) -> None:
    algo = cfg.algorithm
    if not registries["group_filter"].is_identity(algo.group_filter.name) and cfg.rollout.max_rounds == 1:
        warnings.warn("a group filter with rollout.max_rounds=1 drops groups without refilling the batch; "
                      "set rollout.max_rounds>1 to resample (DAPO dynamic sampling)")
    if algo.kl_in_reward and algo.kl_coef == 0:
        warnings.warn("algorithm.kl_in_reward=true has no effect while algorithm.kl_coef=0")
