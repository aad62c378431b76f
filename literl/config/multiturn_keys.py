"""The multi-turn keys of `rollout` (tools, environment, caps), checked when a config loads.

What can be checked without importing anything is checked here (by `literl.config.rules.validate`): the shape of
each import path and the combinations the multi-turn rollout does not run; the caps' ranges are declared on their
knobs. Whether a tool or environment imports, and whether a model
family is known, is checked when the run is built (`literl.multiturn.setup.build_episode_setup`), before the first
episode: the config layer imports neither tools nor environments.
"""

from __future__ import annotations

from literl.config.errors import ConfigError


def multiturn_enabled(rollout) -> bool:
    """Whether the run rolls out multi-turn episodes: some tool or an environment is named."""
    return bool(rollout.tools) or rollout.environment is not None


def _import_path_problem(path) -> str | None:
    if not isinstance(path, str) or path.count(":") != 1:
        return "is not an import path 'module:name'"
    module, name = path.split(":")
    if not module.strip() or not name.strip():
        return "names no module or no function ('module:name', both parts non-empty)"
    return None


def check_multiturn_keys(cfg) -> None:
    r = cfg.rollout
    for i, tool in enumerate(r.tools):
        problem = _import_path_problem(tool)
        if problem:
            raise ConfigError(f"rollout.tools[{i}]={tool!r} {problem}, e.g. rollout.tools=[literl.tools:calculator]")
    if len(set(r.tools)) != len(r.tools):
        raise ConfigError(f"rollout.tools={list(r.tools)} names a tool twice; list each once")
    if r.environment is not None and (not isinstance(r.environment, str) or not r.environment.strip()):
        raise ConfigError(f"rollout.environment={r.environment!r} must be a registered name ('tools') or "
                          "'module:Class', or null")
    if not multiturn_enabled(r):
        return
    refused = [
        (r.engine != "native", f"rollout.engine={r.engine}: multi-turn episodes run on literl's own engine only for "
                               "now (vLLM multi-turn is not wired); set rollout.engine=native"),
        (r.max_staleness >= 1, f"rollout.max_staleness={r.max_staleness}: multi-turn episodes run in the "
                               "synchronous loop only for now; set rollout.max_staleness=0"),
        (cfg.cluster.address is not None, "cluster.address: multi-turn episodes run in one process for now (the "
                                          "Ray rollout workers sample single turns); set cluster.address=null"),
        (cfg.algorithm.routing_replay == "r3", "algorithm.routing_replay=r3 replays the engine's MoE routes, which a "
                                               "multi-turn trajectory does not carry across its turns; use r2 or "
                                               "none"),
    ]
    for refused_here, message in refused:
        if refused_here:
            raise ConfigError(message + " (or drop rollout.tools / rollout.environment for the single-turn rollout)")
