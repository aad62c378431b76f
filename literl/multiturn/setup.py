"""From settings (what the config's `rollout.*` multi-turn keys will hold) to what `run_episodes` takes.

    settings = MultiTurnSettings(tools=["literl.tools:calculator"], model_family="qwen3", max_turns=4)
    setup = build_episode_setup(settings, tokenizer)
    run_episodes(generate, problems, setup.env_factory, setup.chat, setup.caps)

`environment` names the environment: a registered name (`ENVIRONMENTS`: "tools", the default, is
`ToolEnvironment`) or an import path `module:Class`. The class is constructed once per episode, with
`runner=` (the configured tools' runner) when its constructor takes that argument, with no argument otherwise,
and must have `reset(problem)` and `step(turn)`. Every problem is reported when the setup is built, before any
episode runs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from literl.multiturn.chat_format import ChatFormat
from literl.multiturn.environment import Environment, ToolEnvironment
from literl.multiturn.episodes import TRUNCATION_MARKER, EpisodeCaps
from literl.rewards.isolation import resolve_function
from literl.tools.execution import ToolRunner
from literl.tools.loading import load_tools, tool_schemas

ENVIRONMENTS: dict[str, type] = {"tools": ToolEnvironment}


@dataclass
class MultiTurnSettings:
    tools: list[str] = field(default_factory=list)     # import paths, e.g. "literl.tools:python"
    environment: str = "tools"                          # a name in ENVIRONMENTS or "module:Class"
    model_family: str = "hermes"
    system_prompt: str | None = None                    # for the "tools" environment
    max_turns: int = 4
    max_turn_tokens: int = 256
    max_response_tokens: int = 1024
    max_tool_response_tokens: int | None = 256
    tool_timeout_s: float = 30.0
    tool_workers: int = 8


@dataclass
class EpisodeSetup:
    chat: ChatFormat
    env_factory: Callable[[dict], Environment]
    caps: EpisodeCaps
    runner: ToolRunner

    def close(self) -> None:
        self.runner.close()


def build_episode_setup(settings: MultiTurnSettings, tokenizer) -> EpisodeSetup:
    caps = EpisodeCaps(settings.max_turns, settings.max_turn_tokens, settings.max_response_tokens,
                       settings.max_tool_response_tokens)
    tools = load_tools(settings.tools)
    runner = ToolRunner(tools, timeout_s=settings.tool_timeout_s, max_workers=settings.tool_workers)
    environment = environment_class(settings.environment)
    takes_runner = "runner" in inspect.signature(environment).parameters
    if environment is ToolEnvironment:
        if not tools:
            raise ValueError("rollout.environment 'tools' needs at least one tool in rollout.tools "
                             "(e.g. rollout.tools=[literl.tools:calculator])")
        factory = lambda problem: ToolEnvironment(runner, system_prompt=settings.system_prompt)  # noqa: E731
    elif takes_runner:
        factory = lambda problem: environment(runner=runner)  # noqa: E731
    else:
        factory = lambda problem: environment()  # noqa: E731
    chat = ChatFormat(tokenizer, settings.model_family, tool_schemas(tools))
    _check_room_for_the_cut_marker(chat, settings.max_tool_response_tokens)
    return EpisodeSetup(chat, factory, caps, runner)


def _check_room_for_the_cut_marker(chat: ChatFormat, cap: int | None) -> None:
    """A cut observation ends with the marker saying how much was cut; a cap shorter than the marker (as long as
    it is for a million-token cut, with this tokenizer) would fail at the first long observation, mid-run."""
    if cap is None:
        return
    longest = len(chat.encode(TRUNCATION_MARKER.format(n=10**6)))
    if cap < longest:
        raise ValueError(f"rollout.max_tool_response_tokens={cap} leaves no room for the marker a cut observation "
                         f"ends with ({longest} tokens with this tokenizer); raise it to at least {longest}, or "
                         "null to never cut")


def environment_class(name: str) -> type:
    """The environment class registered as `name`, or imported from `module:Class`; errors say how to fix it."""
    if name in ENVIRONMENTS:
        cls = ENVIRONMENTS[name]
    elif ":" in name:
        try:
            cls = resolve_function(name)
        except ValueError as exc:
            raise ValueError(f"rollout.environment: {exc}") from None
    else:
        raise ValueError(f"rollout.environment {name!r} is neither a registered environment "
                         f"({', '.join(ENVIRONMENTS)}) nor an import path 'module:Class'")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        raise ValueError(f"rollout.environment {name!r} must be a class with reset(problem) and step(turn) "
                         f"methods{'; it lacks ' + ', '.join(missing) if missing else ''}")
    return cls
