"""Ablation specs: one YAML file names a preset, a baseline, variants, scenarios and seeds.

    name: advantage_norm                     # optional; default: the file name
    description: what the ablation asks      # optional, shown in the report
    paper_finding: what the paper reported   # optional, shown in the report next to our numbers
    preset: lite_ppo                         # the preset every run starts from
    base:                                    # dotted overrides applied to every run (budget knobs live here)
      trainer.steps: 30
      eval.every: 5
    baseline: group                          # the variant the others are compared with
    variants:                                # name -> dotted overrides; `preset: NAME` swaps the preset
      group: {algorithm.advantage.name: grpo}
      no_std: {algorithm.advantage.name: dr_grpo}
    scenarios:                               # name -> dotted overrides (optional: one scenario 'default')
      reward_01: {}
      reward_pm1: {algorithm.reward_shaping.rescale.low: -1}
    seeds: [0, 1, 2]                         # a list, or a count n meaning 0..n-1
    metric: testbed/accuracy                 # optional: the key scored (higher is better)
    metric_source: eval                      # optional: eval (eval.jsonl, held-out: the default) | train
                                             # (metrics.jsonl, every step: e.g. entropy/mean for a claim about it)
    mechanism: [lengths]                     # optional: the report sections that explain the finding, shown
                                             # first (MECHANISM_SECTIONS)
    sequential: {first: 4, step: 4, max: 16, margin: 0.02}   # optional: seeds in waves, stopping when each
                                             # comparison is decided (literl.arena.sequential); seeds may then be
                                             # left out (0..max-1) or list at least max seeds, taken in order

Every run is `literl train --preset P <base> <scenario> <variant> seed=S trainer.output_dir=...`, in that
order, so a variant's value wins over a scenario's and a scenario's over the base. A variant and a
scenario may not set the same key (the cross would not hold the variant fixed), and the runner's own keys
(seed, output directory, resume, threads) may not appear at all.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from literl.arena.sequential import SequentialDesign, parse_design
from literl.config.errors import ConfigError

SPEC_KEYS = ("name", "description", "paper_finding", "preset", "base", "baseline", "variants", "scenarios",
             "seeds", "metric", "metric_source", "mechanism", "sequential")
REQUIRED_KEYS = ("preset", "baseline", "variants", "seeds")   # seeds may be left out when `sequential` is given
RUNNER_KEYS = ("seed", "trainer.output_dir", "trainer.resume", "trainer.threads")
DEFAULT_METRIC = "testbed/accuracy"
METRIC_SOURCES = ("eval", "train")   # eval.jsonl (held-out evaluations) or metrics.jsonl (every training step)
MECHANISM_SECTIONS = ("clipped_tokens", "lengths", "repetition", "reward_std_by_tier", "is_decomposition",
                      "mismatch_routing", "is_tails", "route_drift", "entropy", "selection")
"""The report's mechanism diagnostics, in their order; a spec's `mechanism:` names the ones that explain it."""
DEFAULT_SCENARIO = "default"
SHIPPED_DIR = "configs/ablations"
MAX_SEEDS = 1000     # seeds per (variant, scenario): far beyond any power analysis, far below a hang
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")   # variant/scenario names become directory names


@dataclass(frozen=True)
class Arm:
    """A named set of overrides: one variant or one scenario. `preset` is set only by variants that swap it."""

    name: str
    overrides: tuple[str, ...]
    preset: str | None = None


@dataclass(frozen=True)
class PlannedRun:
    """One (variant, scenario, seed) training run and everything needed to launch it."""

    variant: str
    scenario: str
    seed: int
    preset: str
    overrides: tuple[str, ...]
    directory: Path

    def command(self, python: str, threads: int | None = None) -> list[str]:
        """The `literl train` command line; resume is always on because the runner owns the directory."""
        extra = [f"trainer.threads={threads}"] if threads else []
        return [python, "-m", "literl.cli", "train", "--preset", self.preset, *self.overrides,
                f"seed={self.seed}", f"trainer.output_dir={self.directory}", "trainer.resume=true", *extra]

    def identity(self) -> dict:
        """What makes two runs the same experiment (compared when an ablation is resumed)."""
        return {"variant": self.variant, "scenario": self.scenario, "seed": self.seed, "preset": self.preset,
                "overrides": list(self.overrides)}


@dataclass
class AblationSpec:
    name: str
    preset: str
    baseline: str
    variants: list[Arm]
    scenarios: list[Arm]
    seeds: list[int]
    base: tuple[str, ...] = ()
    metric: str = DEFAULT_METRIC
    metric_source: str = "eval"
    mechanism: tuple[str, ...] = ()
    description: str = ""
    paper_finding: str = ""
    source: str = ""
    raw: dict = field(default_factory=dict)
    sequential: SequentialDesign | None = None    # None: the seeds are fixed up front

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]

    @property
    def scenario_names(self) -> list[str]:
        return [s.name for s in self.scenarios]

    def narrowed(self, *, seeds: list[int] | None = None, variants: list[str] | None = None) -> AblationSpec:
        """This spec on other seeds or a subset of its variants (`literl ablate --seeds/--variants`): a finding
        replicated on unseen seeds, or one arm left out, without editing the spec. Variants keep the spec's order;
        the baseline must stay, since every other variant is compared with it."""
        chosen = self.variants
        if variants is not None:
            unknown = [name for name in variants if name not in self.variant_names]
            if unknown:
                close = difflib.get_close_matches(unknown[0], self.variant_names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"--variants: '{unknown[0]}' is not a variant of spec {self.name}{hint}; its "
                                  f"variants are {', '.join(self.variant_names)}")
            if self.baseline not in variants:
                raise ConfigError(f"--variants must keep the baseline '{self.baseline}': every other variant is "
                                  f"compared with it (add it to the list)")
            chosen = [v for v in self.variants if v.name in variants]
        return replace(self, variants=chosen, seeds=list(seeds) if seeds is not None else self.seeds)

    def plan(self, out_dir: str | Path) -> list[PlannedRun]:
        """Every run, scenario-major then seed then variant, so that a partial ablation has whole pairs."""
        out_dir = Path(out_dir)
        runs = []
        for scenario in self.scenarios:
            for seed in self.seeds:
                for variant in self.variants:
                    runs.append(PlannedRun(
                        variant=variant.name, scenario=scenario.name, seed=seed,
                        preset=variant.preset or self.preset,
                        overrides=(*self.base, *scenario.overrides, *variant.overrides),
                        directory=out_dir / variant.name / scenario.name / f"seed_{seed}"))
        return runs


# ---------------------------------------------------------------------------------------------- loading
def shipped_spec_names() -> list[str]:
    folder = resources.files("literl").joinpath(SHIPPED_DIR)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def resolve_spec_path(name_or_path: str) -> Path:
    """A spec file path, or the name of a shipped spec (`advantage_norm`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if name_or_path in shipped_spec_names():
        return Path(str(resources.files("literl").joinpath(SHIPPED_DIR, f"{name_or_path}.yaml")))
    close = difflib.get_close_matches(name_or_path, shipped_spec_names(), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"ablation spec '{name_or_path}' is neither a file nor a shipped spec.{hint} "
                      f"Shipped specs: {', '.join(shipped_spec_names())} (`literl ablate --list`).")


def load_spec(name_or_path: str | Path, extra_base: list[str] | tuple[str, ...] = ()) -> AblationSpec:
    """Read and check a spec's structure (not yet its configs: see `check_configs`).

    `extra_base` are key=value overrides appended to the spec's base (from the command line).
    """
    path = resolve_spec_path(str(name_or_path))
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"ablation spec {path} is not valid YAML: {err}") from None
    return parse_spec(raw, source=str(path), default_name=path.stem, extra_base=extra_base)


def parse_spec(raw: Any, *, source: str = "<spec>", default_name: str = "ablation",
               extra_base: list[str] | tuple[str, ...] = ()) -> AblationSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"ablation spec {source} must be a mapping with keys {', '.join(REQUIRED_KEYS)}")
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        hints = [f"'{k}' (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(str(k), SPEC_KEYS, n=1))
                 else f"'{k}'" for k in unknown]
        raise ConfigError(f"ablation spec {source}: unknown key(s) {', '.join(hints)}. Valid keys: "
                          f"{', '.join(SPEC_KEYS)}.")
    missing = [k for k in REQUIRED_KEYS if k not in raw and not (k == "seeds" and raw.get("sequential"))]
    if missing:
        raise ConfigError(f"ablation spec {source}: missing required key(s) {', '.join(missing)}")
    variants = _arms(raw["variants"], "variants", source, allow_preset=True)
    scenarios = (_arms(raw["scenarios"], "scenarios", source, allow_preset=False) if raw.get("scenarios")
                 else [Arm(DEFAULT_SCENARIO, ())])
    baseline = str(raw["baseline"])
    if baseline not in [v.name for v in variants]:
        raise ConfigError(f"ablation spec {source}: baseline '{baseline}' is not one of the variants "
                          f"({', '.join(v.name for v in variants)})")
    base = (*_overrides(raw.get("base") or {}, "base", source), *_checked_extra(extra_base))
    _check_no_runner_keys(base, "base", source)
    metric_source = str(raw.get("metric_source") or "eval")
    if metric_source not in METRIC_SOURCES:
        raise ConfigError(f"ablation spec {source}: metric_source '{metric_source}' must be one of "
                          f"{', '.join(METRIC_SOURCES)} (eval: a held-out key of eval.jsonl; train: a per-step key of "
                          "metrics.jsonl)")
    design = parse_design(raw["sequential"], f"ablation spec {source}: sequential") if raw.get("sequential") else None
    spec = AblationSpec(
        name=str(raw.get("name") or default_name), preset=str(raw["preset"]), baseline=baseline,
        variants=variants, scenarios=scenarios, seeds=_sequential_seeds(raw.get("seeds"), design, source)
        if design else _seeds(raw["seeds"], source), base=base, sequential=design,
        metric=str(raw.get("metric") or DEFAULT_METRIC), metric_source=metric_source,
        mechanism=_mechanism(raw.get("mechanism"), source), description=str(raw.get("description") or "").strip(),
        paper_finding=str(raw.get("paper_finding") or "").strip(), source=source, raw=raw)
    _check_no_shared_keys(spec, source)
    return spec


def _mechanism(raw: Any, source: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"ablation spec {source}: mechanism must be a list of report sections, e.g. [lengths]")
    unknown = [n for n in names if n not in MECHANISM_SECTIONS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], MECHANISM_SECTIONS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"ablation spec {source}: mechanism '{unknown[0]}' is not a report section{hint}; the "
                          f"sections are {', '.join(MECHANISM_SECTIONS)}")
    return tuple(names)


def _arms(section: Any, where: str, source: str, *, allow_preset: bool) -> list[Arm]:
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"ablation spec {source}: '{where}' must be a non-empty mapping of name -> overrides")
    arms = []
    for name, body in section.items():
        name = str(name)
        if not SAFE_NAME.match(name):
            raise ConfigError(f"ablation spec {source}: {where} name '{name}' becomes a directory name; use "
                              "letters, digits, '_', '-', '.', '+' only")
        body = dict(body or {}) if isinstance(body, dict) or body is None else body
        preset = body.pop("preset", None) if isinstance(body, dict) else None
        if preset is not None and not allow_preset:
            raise ConfigError(f"ablation spec {source}: scenario '{name}' sets 'preset'; only variants may "
                              "swap the preset (a scenario changes the setting, not the algorithm)")
        overrides = _overrides(body, f"{where}.{name}", source)
        _check_no_runner_keys(overrides, f"{where}.{name}", source)
        arms.append(Arm(name, overrides, str(preset) if preset is not None else None))
    return arms


def _overrides(body: Any, where: str, source: str) -> tuple[str, ...]:
    """Dotted overrides from a mapping {key: value} or a list of 'key=value' strings."""
    if isinstance(body, list):
        bad = [item for item in body if not isinstance(item, str) or "=" not in item]
        if bad:
            raise ConfigError(f"ablation spec {source}: {where} has {bad[0]!r}, which is not 'key=value'")
        return tuple(body)
    if not isinstance(body, dict):
        raise ConfigError(f"ablation spec {source}: {where} must map dotted keys to values "
                          f"(e.g. {{algorithm.advantage.name: grpo}}), not {type(body).__name__}")
    return tuple(f"{key}={format_value(value)}" for key, value in body.items())


def format_value(value: Any) -> str:
    """A value as the right-hand side of a dotted override (parsed back as YAML by OmegaConf)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and yaml.safe_load(value) == value and value.strip() == value and value:
        return value
    return json.dumps(value)   # JSON is YAML flow syntax: mappings, lists and quoted strings survive


def _checked_extra(extra: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    bad = [item for item in extra if "=" not in item]
    if bad:
        raise ConfigError(f"command-line override '{bad[0]}' is not key=value (e.g. trainer.steps=20)")
    return tuple(extra)


def _seeds(raw: Any, source: str) -> list[int]:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        _check_seed_count(raw, f"ablation spec {source}: 'seeds'")
        return list(range(raw))
    if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        _check_seed_count(len(raw), f"ablation spec {source}: 'seeds'")
        if len(set(raw)) != len(raw):
            raise ConfigError(f"ablation spec {source}: seeds {raw} repeat a value")
        _check_seed_values(raw, f"ablation spec {source}: seeds")
        return list(raw)
    raise ConfigError(f"ablation spec {source}: seeds must be a count (3 → 0, 1, 2) or a list of integers, "
                      f"not {raw!r}")


def _check_seed_count(count: int, what: str) -> None:
    """Refused before a list of seeds is built: 30,000,000 seeds took 60 s and 2.3 GB before printing anything."""
    if count > MAX_SEEDS:
        raise ConfigError(f"{what} asks for {count} seeds, above the limit of {MAX_SEEDS} runs per arm; a paired "
                          f"comparison needs tens of seeds (see 'seeds needed' in the report), not thousands")


def _check_seed_values(seeds: list[int], what: str) -> None:
    from literl.config.schema import MAX_SEED

    bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if bad:
        raise ConfigError(f"{what}: seed {bad[0]} is outside 0..{MAX_SEED} (a run's seed is a 32-bit integer)")


def _sequential_seeds(raw: Any, design: SequentialDesign, source: str) -> list[int]:
    """The seed pool of a sequential spec, in wave order: 0..max-1, or the spec's list (at least max seeds)."""
    _check_seed_count(design.max, f"ablation spec {source}: sequential max")
    if raw is None:
        return list(range(design.max))
    seeds = _seeds(raw, source)
    if len(seeds) < design.max:
        raise ConfigError(f"ablation spec {source}: sequential max is {design.max} seeds but seeds gives "
                          f"{len(seeds)}; list at least {design.max} seeds, or leave seeds out (0..{design.max - 1})")
    return seeds[:design.max]


def parse_seed_list(text: str) -> list[int]:
    """`--seeds` on the command line: comma-separated seeds and inclusive ranges, e.g. '8-15', '0,1,2', '0-3,8'."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        try:
            bounds = (int(low), int(high)) if dash else (int(part), int(part))
        except ValueError:
            raise ConfigError(f"--seeds '{text}': '{part}' is not a seed or a range of seeds (e.g. 8-15 or "
                              "0,1,2)") from None
        if bounds[0] < 0 or bounds[1] < bounds[0]:
            raise ConfigError(f"--seeds '{text}': '{part}' must be a seed ≥ 0 or a range low-high with low ≤ high")
        _check_seed_count(len(seeds) + bounds[1] - bounds[0] + 1, f"--seeds '{text}'")
        _check_seed_values(list(bounds), f"--seeds '{text}'")
        seeds.extend(range(bounds[0], bounds[1] + 1))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds '{text}' repeats a seed")
    return seeds


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def _check_no_runner_keys(overrides: tuple[str, ...], where: str, source: str) -> None:
    for item in overrides:
        if _key(item) in RUNNER_KEYS:
            raise ConfigError(f"ablation spec {source}: {where} sets '{_key(item)}', which the runner sets per "
                              f"run ({', '.join(RUNNER_KEYS)}); remove it (seeds go in 'seeds', the output "
                              "folder is `literl ablate --out`, threads follow --jobs/--threads)")


def _check_no_shared_keys(spec: AblationSpec, source: str) -> None:
    for variant in spec.variants:
        variant_keys = {_key(o) for o in variant.overrides}
        for scenario in spec.scenarios:
            shared = variant_keys & {_key(o) for o in scenario.overrides}
            if shared:
                raise ConfigError(
                    f"ablation spec {source}: variant '{variant.name}' and scenario '{scenario.name}' both set "
                    f"{', '.join(sorted(shared))}; a scenario must not change what the variants compare. "
                    "Move the key to one of them.")


# ---------------------------------------------------------------------------------------------- configs
def check_configs(spec: AblationSpec, out_dir: str | Path = "runs/ablation-check") -> dict[tuple[str, str], int]:
    """Load every (variant, scenario) config before anything runs; a bad override names its run.

    Seeds only change `seed=`, so the first seed stands for all of them. Returns each pair's trainer.steps
    (the unit of the runner's progress bar).
    """
    from literl.config.load import load_config
    from literl.algorithm.objective import Objective

    steps: dict[tuple[str, str], int] = {}
    for run in spec.plan(out_dir):
        if (run.variant, run.scenario) in steps:
            continue
        try:
            cfg = load_config(preset=run.preset, overrides=[*run.overrides, f"seed={run.seed}"])
            Objective.from_config(cfg)      # values a trick rejects only when it runs
        except (ConfigError, ValueError) as err:
            raise ConfigError(f"ablation spec {spec.source}: variant '{run.variant}' × scenario "
                              f"'{run.scenario}' does not load as a config: {err}") from None
        steps[(run.variant, run.scenario)] = cfg.trainer.steps
    return steps
