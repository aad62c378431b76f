"""The rollout side of a step, built from the config: how a training problem becomes prompt ids (its template and
options), how a response is decoded and scored (the reward functions, isolated and time-bounded), what the engine
samples with, and the collector that puts them together (`literl.rollout.collector.Collector`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from literl.config.errors import ConfigError
from literl.config.multiturn_keys import check_multiturn_keys, multiturn_enabled
from literl.config.schema import Config
from literl.data.prompts import chat_messages, render_prompt, resolve_template
from literl.evaluation.periodic import prompt_options_of, prompt_template
from literl.multiturn.collector import MultiTurnCollector, check_append_only
from literl.multiturn.setup import MultiTurnSettings, build_episode_setup
from literl.rewards import RewardSet
from literl.rollout.collector import Collector, PromptStream
from literl.rollout.engine import SamplingParams


@dataclass(frozen=True)
class Prompting:
    """How the run's problems are prompted: the template (plain, chat, raw) and its options."""

    tokenizer: object
    template: str
    options: dict

    @classmethod
    def from_config(cls, cfg: Config, tokenizer, *, testbed_problems: bool) -> "Prompting":
        return cls(tokenizer, prompt_template(cfg, testbed_problems=testbed_problems), prompt_options_of(cfg))

    def ids(self, problem: str) -> list[int]:
        return render_prompt(problem, self.tokenizer, self.template, **self.options)


def build_collector(cfg: Config, *, problems: list[dict], prompting: Prompting, engine, objective,
                    reward_fns: Sequence | None, pad_id: int) -> Collector:
    """The collector of a run: P prompts × G samples per step from the prompt stream, scored by the reward
    functions (the config's, or those passed from Python)."""
    tokenizer = prompting.tokenizer
    prompt_cache: dict[int, list[int]] = {}

    def prompt_ids(index: int) -> list[int]:
        if index not in prompt_cache:
            prompt_cache[index] = prompting.ids(problems[index]["problem"])
        return prompt_cache[index]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    rewards = RewardSet(reward_specs(cfg, reward_fns), timeout_s=cfg.reward.timeout_s,
                        step_timeout_s=cfg.reward.step_timeout_s, max_failed_batches=cfg.reward.max_failed_batches,
                        chat_messages=_chat_messages(cfg, prompting))
    r = cfg.rollout
    if multiturn_enabled(r):
        return _multiturn_collector(cfg, prompting, engine=engine, problems=problems, decode=decode, rewards=rewards,
                                    objective=objective, pad_id=pad_id)
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                              keep_forward=cfg.trainer.replay_max_gib > 0)
    return Collector(
        engine=engine, problems=problems, prompt_ids=prompt_ids, decode=decode, rewards=rewards,
        objective=objective, sampling=sampling, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
        max_rounds=r.max_rounds, stream=PromptStream(len(problems), seed=cfg.seed), pad_id=pad_id)


def multiturn_settings(cfg: Config, tokenizer) -> MultiTurnSettings:
    """The episode settings of a run's `rollout.*` multi-turn keys. rollout.max_new_tokens is the whole
    trajectory's response budget (sampled, observation and boundary tokens); model_family=auto is hermes for a
    tokenizer with a chat template, raw (literl's testbed: plain text) otherwise."""
    r = cfg.rollout
    family = r.model_family
    if family == "auto":
        family = "hermes" if getattr(tokenizer, "chat_template", None) else "raw"
    return MultiTurnSettings(tools=list(r.tools), environment=r.environment or "tools", model_family=family,
                             system_prompt=cfg.data.system_prompt or None, max_turns=r.max_turns,
                             max_turn_tokens=min(r.max_turn_tokens or r.max_new_tokens, r.max_new_tokens),
                             max_response_tokens=r.max_new_tokens, max_tool_response_tokens=r.max_tool_response_tokens,
                             tool_timeout_s=r.tool_timeout_s)


def _multiturn_collector(cfg: Config, prompting: Prompting, **collector_parts) -> MultiTurnCollector:
    """The collector of episodes (literl.multiturn.collector): tools and environment imported and checked here,
    before the first episode; a chat template that is not append-only is refused."""
    r = cfg.rollout
    check_multiturn_keys(cfg)       # again here: a Config built in Python may not have gone through load_config
    try:
        setup = build_episode_setup(multiturn_settings(cfg, prompting.tokenizer), prompting.tokenizer)
        check_append_only(setup.chat)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    # The engine stops a turn at its end or at a tool call's closing token (where that is one token).
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                              stop_token_ids=tuple(setup.chat.stop_token_ids))
    episode_problem = (lambda problem: problem) if r.environment not in (None, "tools") else (
        lambda problem: {**problem, "problem": _question(cfg, prompting, str(problem["problem"]))})
    problems = collector_parts["problems"]
    return MultiTurnCollector(setup=setup, episode_problem=episode_problem, sampling=sampling,
                              prompts_per_step=r.prompts_per_step, group_size=r.group_size, max_rounds=r.max_rounds,
                              stream=PromptStream(len(problems), seed=cfg.seed), **collector_parts)


def _question(cfg: Config, prompting: Prompting, problem: str) -> str:
    """What the tools environment's user turn says: the problem as the run's prompt template words it (the
    instruction after it, except for the raw template)."""
    if resolve_template(prompting.template, prompting.tokenizer) == "raw":
        return problem
    return chat_messages(problem, system_prompt=cfg.data.system_prompt or "", instruction=cfg.data.instruction)[-1][
        "content"]


def reward_specs(cfg: Config, reward_fns: Sequence | None) -> list[tuple]:
    """Config reward specs, or functions passed from Python: f, 'pkg.mod:fn', (f, weight) or
    (f, weight, convention)."""
    if reward_fns is None:
        return [(spec.fn, spec.weight, spec.convention) for spec in cfg.reward.fns]
    specs = []
    for item in reward_fns:
        fn, weight, convention = (*item, "auto")[:3] if isinstance(item, tuple) else (item, 1.0, "auto")
        specs.append((fn, float(weight), convention))
    return specs


def _chat_messages(cfg: Config, prompting: Prompting) -> Callable | None:
    """With a chat template, TRL-style reward functions get TRL's conversational format: the prompt messages."""
    if resolve_template(prompting.template, prompting.tokenizer) != "chat":
        return None
    return lambda example: chat_messages(example["problem"], system_prompt=cfg.data.system_prompt or "",
                                         instruction=cfg.data.instruction)
