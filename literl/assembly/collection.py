"""The rollout side of a step, built from the config: how a training problem becomes prompt ids (its template and
options), how a response is decoded and scored (the reward functions, isolated and time-bounded), what the engine
samples with, and the collector that puts them together (`literl.rollout.collector.Collector`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from literl.config.schema import Config
from literl.data.prompts import chat_messages, render_prompt, resolve_template
from literl.evaluation.periodic import prompt_options_of, prompt_template
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
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                              keep_forward=cfg.trainer.replay_max_gib > 0)
    return Collector(
        engine=engine, problems=problems, prompt_ids=prompt_ids, decode=decode, rewards=rewards,
        objective=objective, sampling=sampling, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
        max_rounds=r.max_rounds, stream=PromptStream(len(problems), seed=cfg.seed), pad_id=pad_id)


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
