"""The multi-turn collector: per prompt × G, episodes on literl's engine, turned into rows of the same
`RolloutBatch` the single-turn collector builds, so every trick downstream reads them unchanged.

A trajectory's row: its prompt (the environment's first messages, rendered once), then its response region:
the engine's sampled ids (`mask_BT` True, `rollout_logp_BT` the engine's log-probs) and the observation and
boundary ids between turns (`context_mask_BT` True, `mask_BT` False, `rollout_logp_BT` 0), each the id the
engine was given, never re-templated. The forward computes the whole region (`RolloutBatch.forward_mask_BT`);
every loss, statistic and IS weight reads `mask_BT` only, so context is read and never trained on.

Rewards are over the whole trajectory. Reward functions get, as the response, the text of the whole region
(sampled turns and observations, special tokens skipped) and, in the example, `messages` (the conversation as the
engine saw it) and `tool_calls` (the calls' names, in order). The trajectory's return (`scores_B`) is the reward
functions' combined score plus the sum of the environment's per-turn rewards (turns without one add nothing);
its advantage lands on every sampled token of it. Reward shaping sees the region's length (what
`rollout.max_new_tokens` bounds) and `truncated_B` = the trajectory ended "length".

Templates that are not append-only (a re-rendered history that rewrites an earlier turn, e.g. Qwen3 dropping
earlier `<think>` blocks) split a trajectory into several samples; this collector refuses them when it is built
(`check_append_only`): several rows per trajectory would need group statistics over trajectories.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from literl.algorithm.batch import RolloutBatch
from literl.multiturn.chat_format import ChatFormat
from literl.multiturn.engine_turns import engine_turns
from literl.multiturn.episodes import run_episodes
from literl.multiturn.metrics import multiturn_metrics
from literl.multiturn.setup import EpisodeSetup
from literl.multiturn.tokens import is_append_only
from literl.multiturn.trajectory import Trajectory
from literl.rollout.collector import Collector, _Round

CONTEXT = "context_mask_BT"      # carried through the collector's per-token extras, then made the batch's field


@dataclass
class EpisodeGeneration:
    """A round of trajectories in the shape the collector reads from an engine's `Generation`."""

    response_ids_BT: torch.Tensor
    mask_BT: torch.Tensor             # sampled ids only
    rollout_logp_BT: torch.Tensor
    truncated_B: torch.Tensor         # the trajectory ended "length"
    region_len_B: torch.Tensor        # sampled + context ids of each row
    trajectories: list[Trajectory]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    forward_record: None = None


def trajectory_rows(trajectories: list[Trajectory], pad_id: int) -> EpisodeGeneration:
    """One row per trajectory (module docstring). A trajectory of several samples is refused."""
    for t in trajectories:
        if len(t.samples) != 1:
            raise ValueError(f"a trajectory split into {len(t.samples)} samples (the chat template rewrote an "
                             "earlier turn); the multi-turn collector trains one sample per trajectory: use an "
                             "append-only chat template")
    samples = [t.samples[0] for t in trajectories]
    B, T = len(samples), max((len(s.response_ids) for s in samples), default=1) or 1
    ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.bool)
    context_BT = torch.zeros((B, T), dtype=torch.bool)
    logp_BT = torch.zeros((B, T), dtype=torch.float32)
    for b, s in enumerate(samples):
        n = len(s.response_ids)
        ids_BT[b, :n] = torch.tensor(s.response_ids, dtype=torch.long)
        sampled = torch.tensor(s.response_mask, dtype=torch.bool)
        mask_BT[b, :n], context_BT[b, :n] = sampled, ~sampled
        logp_BT[b, :n] = torch.tensor(s.rollout_logp, dtype=torch.float32)
    truncated_B = torch.tensor([t.end_reason == "length" for t in trajectories], dtype=torch.bool)
    region_B = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long)
    return EpisodeGeneration(ids_BT, mask_BT, logp_BT, truncated_B, region_B, list(trajectories),
                             extras={CONTEXT: context_BT})


def trajectory_return(score: float, trajectory: Trajectory) -> float:
    """The reward functions' score plus the environment's per-turn rewards (None: no reward that turn)."""
    return float(score) + sum(float(r) for r in trajectory.turn_rewards if r is not None)


def check_append_only(chat: ChatFormat) -> None:
    """Refuse a chat template that rewrites an earlier assistant turn once an observation follows it (probed with
    a turn that reasons, calls a tool and gets its result)."""
    call = {"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}
    history = [{"role": "user", "content": "Q"},
               {"role": "assistant", "content": "<think>R</think>A", "tool_calls": [call]}]
    before = chat.render(history, add_generation_prompt=False)
    after = chat.render(history + [{"role": "tool", "content": "O"}], add_generation_prompt=True)
    if not is_append_only(before, after):
        raise ValueError("the tokenizer's chat template is not append-only: it rewrites an earlier assistant turn "
                         "once an observation follows (e.g. it strips earlier <think> reasoning), so a trajectory "
                         "would split into several training samples, which the multi-turn collector does not train "
                         "yet. Use a template that keeps the history as sampled (for Qwen3, one that keeps "
                         "reasoning in every turn)")


class MultiTurnCollector(Collector):
    """`Collector` whose rounds are multi-turn episodes (module docstring); everything else is the collector's:
    the prompt stream, group filters, rounds, metrics, checkpoint state."""

    def __init__(self, *, setup: EpisodeSetup, episode_problem: Callable[[dict], dict] = lambda p: p, **kwargs):
        super().__init__(prompt_ids=lambda index: [], **kwargs)
        self.setup, self.episode_problem = setup, episode_problem

    def _sample_round(self, num_prompts: int, rng: torch.Generator) -> _Round:
        chosen = self.stream.take(num_prompts)
        problem_index = [i for i in chosen for _ in range(self.G)]
        examples = [self.problems[i] for i in problem_index]
        start = time.perf_counter()
        generate = engine_turns(self.engine, self.sampling, rng=rng)
        trajectories = run_episodes(generate, [self.episode_problem(e) for e in examples], self.setup.env_factory,
                                    self.setup.chat, self.setup.caps)
        generation = trajectory_rows(trajectories, self.pad_id)
        generated = time.perf_counter()
        region_BT = generation.mask_BT | generation.extras[CONTEXT]
        responses = [self.decode(ids[m].tolist()) for ids, m in zip(generation.response_ids_BT, region_BT)]
        reward_examples = [{**e, "messages": t.messages, "tool_calls": [r.call.name for r in t.tool_results]}
                           for e, t in zip(examples, trajectories)]
        scores_B, correct_B, reward_metrics = self.rewards.score(responses, reward_examples)
        scores_B = torch.tensor([trajectory_return(s, t) for s, t in zip(scores_B.tolist(), trajectories)],
                                dtype=torch.float32)
        seconds = {"generate": generated - start, "reward": time.perf_counter() - generated}
        rewards_B = self.objective.shape_rewards(scores_B, generation.region_len_B, generation.truncated_B)
        group_B = torch.arange(self._next_group_id, self._next_group_id + num_prompts).repeat_interleave(self.G)
        self._next_group_id += num_prompts
        keep_B = self.objective.keep_groups(correct_B, rewards_B, group_B)
        prompt_ids = [t.samples[0].prompt_ids for t in trajectories]
        return _Round(problem_index, prompt_ids, generation, responses, scores_B, correct_B, rewards_B, group_B,
                      keep_B, reward_metrics, seconds)

    def _assemble(self, rounds: list[_Round]) -> RolloutBatch:
        """The collector's batch, laid out over each row's whole region (so tokens_BL holds the context between
        the sampled ids), then `mask_BT` narrowed back to the sampled ids and the context made its own field."""
        over_region = [dataclasses.replace(r, generation=dataclasses.replace(
            r.generation, mask_BT=r.generation.mask_BT | r.generation.extras[CONTEXT])) for r in rounds]
        batch = super()._assemble(over_region)
        extras = dict(batch.extras)
        context_BT = extras.pop(CONTEXT, None)
        if context_BT is None:
            context_BT = torch.zeros_like(batch.mask_BT)
        return dataclasses.replace(batch, mask_BT=batch.mask_BT & ~context_BT, extras=extras,
                                   context_mask_BT=context_BT)

    def _metrics(self, rounds: list[_Round], batch: RolloutBatch) -> dict[str, float]:
        metrics = super()._metrics(rounds, batch)
        metrics.update(multiturn_metrics([t for r in rounds for t in r.generation.trajectories]))
        return metrics

