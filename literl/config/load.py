"""Loading, checking, resolving and explaining configs; the preset catalogue.

`load_config` merges: dataclass defaults ← preset YAML ← user YAML ← dotted overrides, then
`literl.config.rules.validate` checks every trick against its registry and every cross-key rule in one place.
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
from yaml import YAMLError

from literl.config.schema import ENGINE_CHOICE_ON_GPU, Config, TrickSpec, valid_values
from literl.config.rules import MULTI_TRICKS, SINGLE_TRICKS, validate
from literl.config.profiles import HF_MODEL_LR, TESTBED_LR  # noqa: F401 - re-exported (tests, older imports)
from literl.config.errors import ConfigError

PRESET_DIR = "configs/presets"
TRICK_MAP_EXAMPLES = {"loss_masks": {"overlong": {}}, "policy_masks": {"opsm": {"delta": 0.5}},
                      "reward_shaping": {"rescale": {"low": -1}}}


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
    """Build a validated Config. Raises ConfigError with the fix on any bad key, value or trick.

    A map given for `algorithm.loss_masks`, `algorithm.policy_masks` or `algorithm.reward_shaping` (in a YAML file,
    or as `algorithm.reward_shaping={...}`) replaces the earlier layers' map; a dotted override into one entry
    merges into it, and `<axis>.<name>=null` or `~<axis>.<name>` removes that entry.
    """
    merged = OmegaConf.structured(base or Config())
    if preset:
        merged = _merge(merged, _parse_yaml(preset_text(preset), f"preset '{preset}'"), f"preset '{preset}'")
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}. Pass an existing YAML file to --config.")
        merged = _merge(merged, _parse_yaml(path.read_text(), str(path)), str(path))
    merged = _apply_overrides(merged, list(overrides))
    cfg: Config = _with_current_names(OmegaConf.to_object(merged))
    if preset and cfg.preset is None:
        cfg.preset = preset
    validate(cfg)
    return cfg


# Values renamed since configs were written with them: (section, key) -> {old: new}. Old config files, presets,
# specs and saved run configs keep working; the loader reads the old value as the new one and says so once.
RENAMED_VALUES = {("rollout", "engine"): {"hf": "native"}}


def _with_current_names(cfg: Config) -> Config:
    for (section, key), renames in RENAMED_VALUES.items():
        part = getattr(cfg, section)
        old = getattr(part, key)
        if old in renames:
            warnings.warn(f"{section}.{key}={old} is now {section}.{key}={renames[old]} (same behaviour); "
                          f"write {renames[old]}", FutureWarning, stacklevel=3)
            setattr(cfg, section, dataclasses.replace(part, **{key: renames[old]}))
    return cfg


def _parse_yaml(text: str, source: str):
    try:
        node = OmegaConf.create(text)
    except Exception as err:  # yaml syntax errors come in several types
        raise ConfigError(_top_level_problem(text, source) or f"{source} is not valid YAML: {err}") from None
    if node is None:
        return OmegaConf.create({})
    if not OmegaConf.is_dict(node):
        raise ConfigError(_top_level_problem(text, source) or f"{source} must hold a map at its top level")
    return node


def _top_level_problem(text: str, source: str) -> str | None:
    """OmegaConf rejects a YAML scalar or list at the top level without saying so; name the shape instead."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if data is None or isinstance(data, dict):
        return None
    return (f"{source} holds {_kind(data)} at its top level, but a config file is a map of sections, e.g. "
            f"'trainer: {{steps: 10}}' (`literl config --explain` lists every key)")


def _merge(base, layer, source: str):
    problem = _shape_problem(OmegaConf.to_container(base, resolve=False),
                             OmegaConf.to_container(layer, resolve=False), source)
    if problem:
        raise ConfigError(problem)
    try:
        _forget_params_of_renamed_tricks(base, layer)
        _replace_given_trick_maps(base, layer, source)
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        msg = str(err).splitlines()[0]
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        valid = _valid_keys(parent)
        listing = f" Valid keys under '{parent or '<top>'}': {', '.join(valid)}." if valid else ""
        raise ConfigError(f"bad config key or value '{key}' in {source}: {msg}.{listing} "
                          f"`literl config --explain` lists every key.") from None


def _shape_problem(want: dict, given: dict, source: str, prefix: str = "") -> str | None:
    """A map where the config holds a list (or the reverse) makes OmegaConf raise a bare TypeError that names
    no key; find the key first. Unknown keys are left to the merge, which lists the valid ones."""
    for key, value in given.items():
        if not isinstance(key, str) or key not in want:
            continue
        default, where = want[key], f"{prefix}{key}"
        if isinstance(default, list) and not isinstance(value, list):
            item_hint = f" (or set one item, e.g. {where}.0.weight=2)" if where == "reward.fns" else ""
            return (f"{where} in {source} is {_kind(value)}, but it must be a list; give the whole list, "
                    f"e.g. {where}={_flow(default) if default else '[a, b]'}{item_hint}")
        if not isinstance(default, dict) or (value is None and _is_trick_map(where)):
            continue
        if not isinstance(value, dict):
            return f"{where} in {source} is {_kind(value)}, but it must be a map: {_map_hint(where, default)}"
        if not _is_trick_map(where):    # a trick map replaces the earlier one; _check_trick_map checks it
            problem = _shape_problem(default, value, source, where + ".")
            if problem:
                return problem
    return None


def _map_hint(where: str, default: dict) -> str:
    if _is_trick_map(where):
        return f"trick name -> params, e.g. {where}={_flow(TRICK_MAP_EXAMPLES[where.split('.')[1]])}"
    if set(default) == {"name", "params"}:
        return (f"set {where}.name=<trick> and {where}.params.<param>=<value> "
                f"(in YAML: {where.rsplit('.', 1)[-1]}: {{name: ..., params: {{...}}}})")
    if where.endswith(".params"):
        return f"parameter name -> value; set one with {where}.<param>=<value>"
    return f"a section with the keys {', '.join(_valid_keys(where)) or '(see `literl config --explain`)'}"


def _kind(value) -> str:
    """The value's shape, with its article: 'a map', 'a list', 'null', 'the int 3'."""
    return {dict: "a map", list: "a list", type(None): "null"}.get(type(value),
                                                                   f"the {type(value).__name__} {value!r}")


def _flow(value) -> str:
    """A value in YAML flow style, as a key=value override takes it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return "null" if value is None else str(value)


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


def _replace_given_trick_maps(base, layer, source: str) -> None:
    """A layer that gives a loss_masks / reward_shaping map states the whole ordered pipeline, so it replaces
    the earlier map instead of merging into it: a file listing only `rescale` must not keep a preset's
    `soft_overlong`, and a map merge could never drop or reorder an entry."""
    algo = layer.get("algorithm") if OmegaConf.is_dict(layer) else None
    if not OmegaConf.is_dict(algo):
        return
    for field_name in MULTI_TRICKS:
        if field_name not in algo:
            continue
        given = OmegaConf.to_container(algo, resolve=False)[field_name] or {}
        _check_trick_map(f"algorithm.{field_name}", given, source)
        algo[field_name] = given
        base.algorithm[field_name] = {}


def _check_trick_map(where: str, given: dict, source: str) -> None:
    for name, params in given.items():
        if params is None:
            raise ConfigError(f"{where}.{name} is null in {source}; write '{name}: {{}}' for its default params, "
                              f"or leave it out (a map given for {where} replaces the earlier one)")
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.{name} in {source} is {_kind(params)}, but each entry maps a trick "
                              f"to its params; write '{name}: {{}}' for the defaults, e.g. "
                              f"{where}={_flow(TRICK_MAP_EXAMPLES[where.split('.')[1]])}")


def _is_trick_map(dotted: str) -> bool:
    return dotted in {f"algorithm.{f}" for f in MULTI_TRICKS}


# ---------------------------------------------------------------------------------------------- overrides
def _apply_overrides(merged, items: list[str]):
    """Apply key=value overrides: whole values as one layer (as before), then one item of a list
    (`reward.fns.0.weight=2`), then edits of the trick maps, each in command-line order."""
    plain, list_items, map_edits = [], [], []
    for item in items:
        removal = item.startswith("~")
        if removal and "=" in item:
            raise ConfigError(f"override '{item}' mixes removal and assignment; write '{item.split('=')[0]}'")
        if not removal and "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value (e.g. trainer.steps=100)")
        key = item.lstrip("~").split("=", 1)[0].strip()
        if _trick_map_of(key):
            map_edits.append(item)
        elif removal:
            raise ConfigError(f"override '{item}': only algorithm.loss_masks, algorithm.policy_masks, "
                              f"algorithm.reward_shaping and their "
                              f"entries can be removed with ~; set other keys with key=value")
        elif _inside_list(merged, key):
            list_items.append(item)
        else:
            plain.append(item)
    if plain:
        merged = _merge(merged, _parse_overrides(plain), "command-line overrides")
    for item in list_items:
        _set_list_item(merged, item)
    if map_edits:
        _edit_trick_maps(merged, map_edits)
    return merged


def _parse_overrides(items: list[str]):
    try:
        return OmegaConf.from_dotlist(items)
    except Exception as err:  # yaml and grammar errors come in several types
        first = str(err).splitlines()[0]
        bad = next((i for i in items if _unparsable(i)), ", ".join(items))
        raise ConfigError(f"override '{bad}' has a value that is not valid YAML ({first}); quote maps and "
                          f"lists whole, e.g. 'algorithm.loss_masks={{overlong: {{}}}}'") from None


def _unparsable(item: str) -> bool:
    try:
        OmegaConf.from_dotlist([item])
    except Exception:  # noqa: BLE001 - any parse failure marks the culprit
        return True
    return False


def _trick_map_of(key: str) -> str | None:
    parts = key.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "algorithm" and parts[1] in MULTI_TRICKS else None


def _inside_list(merged, key: str) -> bool:
    """True when the key indexes into a list (`reward.fns.0.weight`): a dotlist layer would hold a map there,
    which OmegaConf cannot merge into the list."""
    node = merged
    for part in key.split(".")[:-1]:
        if not OmegaConf.is_dict(node) or part not in node:
            return False
        node = node[part]
        if OmegaConf.is_list(node):
            return True
    return False


def _set_list_item(merged, item: str) -> None:
    parts = item.split("=", 1)[0].strip().split(".")
    node, at = merged, 0
    while not OmegaConf.is_list(node):
        node, at = node[parts[at]], at + 1
    list_key, index, current = ".".join(parts[:at]), parts[at], OmegaConf.to_container(node, resolve=False)
    try:
        merged.merge_with_dotlist([item])
    except Exception as err:  # noqa: BLE001 - index, type and parse errors come in several types
        out_of_range = index.lstrip("-").isdigit() and not -len(current) <= int(index) < len(current)
        problem = f"index {index} is out of range" if out_of_range else str(err).splitlines()[0]
        held = f"{list_key} has indices 0..{len(current) - 1}" if current else f"{list_key} is empty"
        raise ConfigError(f"bad override '{item}': {problem} ({held}; to add or remove items give the whole "
                          f"list, e.g. {list_key}={_flow(current) if current else '[a, b]'})") from None


def _edit_trick_maps(merged, items: list[str]) -> None:
    """Replay the overrides that touch algorithm.loss_masks / reward_shaping in order, on plain dicts."""
    maps = {}
    for item in items:
        removal = item.startswith("~")
        key = item.lstrip("~").split("=", 1)[0].strip()
        field_name, path = _trick_map_of(key), key.split(".")[2:]
        where = f"algorithm.{field_name}"
        if field_name not in maps:
            maps[field_name] = OmegaConf.to_container(merged.algorithm[field_name], resolve=False)
        if removal:
            _remove(maps[field_name], path, where, item)
            continue
        value = OmegaConf.to_container(_parse_overrides([item]), resolve=False)["algorithm"][field_name]
        if not path:
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{where} in override '{item}' is {_kind(value)}, but it must be a map: "
                                  f"{_map_hint(where, {})}")
            _check_trick_map(where, value or {}, f"override '{item}'")
            maps[field_name] = value or {}
            continue
        name, entry = path[0], value[path[0]]
        if len(path) == 1 and entry is None:
            _remove(maps[field_name], path, where, item)
        elif len(path) == 1 and not isinstance(entry, dict):
            _check_trick_map(where, {name: entry}, f"override '{item}'")
        else:
            merged_entry = OmegaConf.merge(maps[field_name].get(name) or {}, entry)
            maps[field_name][name] = OmegaConf.to_container(merged_entry, resolve=False)
    for field_name, value in maps.items():
        try:
            merged.algorithm[field_name] = value
        except OmegaConfBaseException as err:
            raise ConfigError(f"bad value for algorithm.{field_name}: {str(err).splitlines()[0]}") from None


def _remove(trick_map: dict, path: list[str], where: str, item: str) -> None:
    if not path:
        trick_map.clear()
        return
    node = trick_map
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or path[-1] not in node:
        holds = ", ".join(trick_map) or "nothing"
        raise ConfigError(f"override '{item}' removes {where}.{'.'.join(path)}, which is not set "
                          f"({where} holds: {holds}); check the name against `literl config`")
    del node[path[-1]]


def _valid_keys(dotted_parent: str) -> list[str]:
    node: Any = Config()
    for part in filter(None, dotted_parent.split(".")):
        node = getattr(node, part, None)
        if not dataclasses.is_dataclass(node):
            return []
    return [f.name for f in dataclasses.fields(node)]


def resolve(cfg: Config, *, external_model: bool = False, model_context: int | None = None,
            notes: list[str] | None = None) -> Config:
    """Fill the values left null (or 'auto') from the profile and other keys, so the saved config says exactly
    what ran (literl/config/profiles.py has the profiles).

    external_model: the policy comes from the caller (`literl.train(cfg, model=...)`: a Hugging Face model
    object or directory) rather than from cfg.model, so model.path cannot tell it from the testbed.
    model_context: the policy's maximum positions (read from model.path's config.json when not given); the
    real profile's response length is capped to fit it. notes: receives what the caller should tell the user.
    """
    from literl.config import profiles

    notes = notes if notes is not None else []
    hf_model = external_model or cfg.model.path is not None
    profile = profiles.choose_profile(cfg.model.profile, hf_model=hf_model)
    out = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, profile=profile.name))
    r = out.rollout
    max_new_tokens = r.max_new_tokens
    if max_new_tokens is None:
        context = model_context if model_context is not None else profiles.model_context(cfg.model.path)
        max_new_tokens, note = profiles.response_budget(profile, context)
        if note:
            notes.append(note)
    out.rollout = dataclasses.replace(
        r, max_new_tokens=max_new_tokens, temperature=_or(r.temperature, profile.temperature),
        top_p=_or(r.top_p, profile.top_p), top_k=_or(r.top_k, profile.top_k))
    out.optim = dataclasses.replace(out.optim, lr=_or(out.optim.lr, profile.lr))
    out.data = dataclasses.replace(out.data, system_prompt=_or(out.data.system_prompt, profile.system_prompt))
    ev = out.eval
    benchmarks = ev.benchmarks
    if benchmarks is None:
        benchmarks = list(profile.benchmarks)
        if profile is profiles.REAL and not profiles.data_dir_available(out.data.dir):
            benchmarks = []
            notes.append("no held-out evaluation: the real-model profile evaluates on "
                         f"{', '.join(profile.benchmarks)}, "
                         "read from data.dir (--data-dir) or $LITERL_DATA_DIR, and neither is set; set one, or "
                         "name files or benchmarks with eval.benchmarks=[...]")
    if out.model.lora.rank > 0 and out.trainer.replay_max_gib > 0:
        # A record keeps plain linear projections (literl.model.record.can_record): LoRA layers have none to keep,
        # and a replay of the base weights would leave the adapters out.
        out.trainer = dataclasses.replace(out.trainer, replay_max_gib=0.0)
        notes.append("trainer.replay_max_gib=0: with LoRA the update computes its forward instead of replaying the "
                     "rollout's (the replay reads the base weights, without the adapters)")
    out.eval = dataclasses.replace(
        ev, benchmarks=benchmarks, temperature=_or(ev.temperature, out.rollout.temperature),
        max_new_tokens=_or(ev.max_new_tokens, out.rollout.max_new_tokens))
    return out


def _or(value, default):
    return default if value is None else value


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml_file(path: str | Path) -> Config:
    """Read a saved (resolved) config back, e.g. a run directory's config.yaml; ConfigError names the file."""
    try:
        loaded = OmegaConf.load(path)
        if not OmegaConf.is_dict(loaded):
            raise ConfigError(f"it holds {_kind(OmegaConf.to_container(loaded) if loaded is not None else None)}, "
                              "not a map of config sections")
        return _with_current_names(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config()), loaded)))
    except (OSError, ValueError, YAMLError, OmegaConfBaseException) as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{path} is not a readable literl config ({detail})") from None


# ---------------------------------------------------------------------------------------------- explain
# How the config layers merge: printed by `literl config --explain` and on docs/config-reference.md.
LAYERS_NOTE = (
    "Layers: defaults <- preset <- --config file <- key=value overrides. Maps merge key by key; a list",
    "  is replaced whole (reward.fns=[...]) or one item is set by index (reward.fns.0.weight=2).",
    "  algorithm.loss_masks, algorithm.policy_masks and algorithm.reward_shaping are maps of tricks: a map",
    "  given for one, in a file or as algorithm.reward_shaping={...}, replaces the earlier map ({} clears",
    "  it); a dotted key adds or merges one entry (algorithm.policy_masks.opsm.delta=0.5);",
    "  algorithm.reward_shaping.NAME=null or ~algorithm.reward_shaping.NAME removes one entry.",
    "  A parameter shown as <required> has no default: a config that names the trick must set it.",
)


def explain() -> str:
    """Every config key with its default and help, then every trick with its parameters."""
    from literl.algorithm.tricks import ALL

    lines: list[str] = []

    def walk(obj, prefix: str):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value) and not isinstance(value, TrickSpec):
                lines.append(f"{key}:  # {f.metadata.get('help', '')}")
                walk(value, key + ".")
                continue
            valid = valid_values(f.metadata)
            lines.append(f"  {key} = {_show(value)}    # {f.metadata.get('help', '')}"
                         + (f"  [valid: {valid}]" if valid else ""))

    walk(Config(), "")
    lines += ["", *LAYERS_NOTE]
    lines += ["", *ENGINE_CHOICE_ON_GPU]
    lines.append("\nTricks (algorithm.<axis>.name, algorithm.<axis>.params.<param>; the map axes loss_mask, "
                 "policy_mask, reward_shaping: algorithm.<axis>s.<name>.<param>):")
    for axis, registry in ALL.items():
        lines.append(f"  {axis}:")
        for name in registry.names():
            params = ", ".join(f"{k}={v!r}" for k, v in registry.params_of(name).items())
            doc = (registry.get(name).__doc__ or "").strip().splitlines()[0]
            ranges = "; ".join(f"{k} {v}" for k, v in registry.ranges_of(name).items())
            lines.append(f"    {name}({params})  — {doc}" + (f"\n      valid: {ranges}" if ranges else ""))
    return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, TrickSpec):
        return f"{value.name} {value.params or ''}".strip()
    if dataclasses.is_dataclass(value):
        return str(dataclasses.asdict(value))
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return str([dataclasses.asdict(v) for v in value])
    return repr(value)
