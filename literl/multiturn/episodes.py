"""The multi-turn driver: sample a turn for every live episode at once, step their environments concurrently,
append the observations' ids, repeat, until each episode ends with a recorded reason.

    run_episodes(generate, problems, env_factory, chat, caps) -> [Trajectory]

`generate(contexts, max_new_tokens) -> [SampledTurn]` is the engine: for each context (token ids) it samples
up to that row's `max_new_tokens` ids and returns them with their per-token log-probs, stopping at
`chat.stop_token_ids` / `chat.stop_strings` (the EOS, the end of turn, a tool call's closing tag). An engine
that cannot stop on them may run on: the driver cuts each turn at its first stop (exact, since a prefix of a
sample is what sampling with the stop would have given).

Per turn, for each live episode:
1. the sampled ids (mask 1, their log-probs kept) are appended to the episode's current sample;
2. a turn that ended without a stop (its token cap, or the engine's own length limit) ends the episode:
   "length";
3. otherwise the environment steps on the parsed turn; an exception there ends the episode: "tool_failure"
   (its message kept in `failure`), the other episodes go on; done ends it with the environment's reason
   ("answer" or "eos");
4. a live episode that has had `max_turns` turns ends: "max_turns";
5. the observations are truncated to `max_tool_response_tokens` (marked), framed by the chat template's
   boundary ids and appended as context (mask 0); when that would pass `max_response_tokens`: "length".
   When the template is not append-only (re-rendering the history changed an earlier turn, e.g. stripped its
   reasoning), the episode instead starts a new sample whose prompt is the re-rendered history: each sample
   holds exactly the ids the engine was given and sampled.
`trajectory.messages` holds what the engine saw and sampled: the tool results of a turn that ends the episode
at "max_turns" or "length" are in `tool_results`, not in the messages.
Budgets count the tokens after the first prompt in the engine's context: `max_response_tokens` bounds
sampled + boundary + observation ids together, `max_turn_tokens` one turn's sampled ids.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from literl.multiturn.chat_format import ChatFormat
from literl.multiturn.environment import Environment, StepResult
from literl.multiturn.tokens import (continuation, first_stop, is_append_only, truncate_observation)
from literl.multiturn.trajectory import ModelTurn, TrainingSample, Trajectory

TRUNCATION_MARKER = "\n...[cut: {n} more tokens]"


@dataclass(frozen=True)
class SampledTurn:
    ids: list[int]
    logprobs: list[float]


class TurnGenerator(Protocol):
    def __call__(self, contexts: list[list[int]], max_new_tokens: list[int]) -> list[SampledTurn]: ...


@dataclass(frozen=True)
class EpisodeCaps:
    max_turns: int = 4
    max_turn_tokens: int = 256
    max_response_tokens: int = 1024
    max_tool_response_tokens: int | None = 256

    def __post_init__(self):
        for name in ("max_turns", "max_turn_tokens", "max_response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_tool_response_tokens is not None and self.max_tool_response_tokens < 1:
            raise ValueError(f"rollout.max_tool_response_tokens must be >= 1 or None (got "
                             f"{self.max_tool_response_tokens})")


class _Episode:
    def __init__(self, problem: dict, env: Environment, chat: ChatFormat):
        self.env = env
        messages = list(env.reset(problem))
        prompt = chat.prompt_ids(messages)
        if not prompt:
            raise ValueError(f"the environment's first messages render to no tokens (problem {problem!r})")
        self.first_prompt_len = len(prompt)
        self.trajectory = Trajectory(problem, [TrainingSample(prompt)], messages)

    @property
    def sample(self) -> TrainingSample:
        return self.trajectory.samples[-1]

    @property
    def response_tokens(self) -> int:
        return len(self.sample.context_ids) - self.first_prompt_len

    def end(self, reason: str, failure: str | None = None) -> None:
        self.trajectory.end_reason = reason
        self.trajectory.failure = failure


def run_episodes(generate: TurnGenerator, problems: Sequence[dict], env_factory: Callable[[dict], Environment],
                 chat: ChatFormat, caps: EpisodeCaps = EpisodeCaps(), *, max_parallel_steps: int = 16
                 ) -> list[Trajectory]:
    """One trajectory per problem, in order (module docstring)."""
    episodes = [_Episode(problem, env_factory(problem), chat) for problem in problems]
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel_steps, len(episodes)))) as pool:
        live = [e for e in episodes if _ensure_room(e, caps)]
        while live:
            limits = [min(caps.max_turn_tokens, caps.max_response_tokens - e.response_tokens) for e in live]
            turns = generate([e.sample.context_ids for e in live], limits)
            _check_generation(turns, live, limits)
            stepping = []
            for episode, turn, limit in zip(live, turns, limits):
                model_turn = _take_turn(episode, turn, limit, chat)
                if model_turn is None:
                    episode.end("length")
                else:
                    stepping.append((episode, pool.submit(episode.env.step, model_turn)))
            live = []
            for episode, future in stepping:
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - one episode's failure ends that episode only
                    episode.end("tool_failure", f"{type(exc).__name__}: {exc}")
                    continue
                if _after_step(episode, result, chat, caps):
                    live.append(episode)
    return [e.trajectory for e in episodes]


def _ensure_room(episode: _Episode, caps: EpisodeCaps) -> bool:
    if caps.max_response_tokens - episode.response_tokens < 1:
        episode.end("length")
        return False
    return True


def _check_generation(turns, live, limits) -> None:
    if len(turns) != len(live):
        raise ValueError(f"generate returned {len(turns)} turns for {len(live)} contexts; it must return one each")
    for i, (turn, limit) in enumerate(zip(turns, limits)):
        if len(turn.ids) != len(turn.logprobs):
            raise ValueError(f"generate's turn {i} has {len(turn.ids)} ids but {len(turn.logprobs)} log-probs; "
                             "it must return one log-prob per sampled id")
        if not turn.ids:
            raise ValueError(f"generate's turn {i} is empty; an engine samples at least one token")


def _take_turn(episode: _Episode, turn: SampledTurn, limit: int, chat: ChatFormat) -> ModelTurn | None:
    """Append the sampled ids (cut at the first stop and to the cap); the parsed turn, or None when the cap cut
    it before any stop."""
    stop = first_stop(turn.ids, chat.stop_token_ids, chat.stop_strings, chat.decode)
    n = min(stop or len(turn.ids), limit)
    ids, logprobs = list(turn.ids[:n]), list(turn.logprobs[:n])
    episode.sample.add_sampled(ids, logprobs)
    episode.trajectory.turns += 1
    if stop is None or stop > limit:
        return None
    text = chat.decode(ids)
    ended_turn = next((m for m in (chat.family.end_of_turn, chat.tokenizer.eos_token) if m and text.endswith(m)), None)
    if ended_turn:
        text = text[: -len(ended_turn)]
    parsed = chat.family.parser.parse(text)
    stopped = "tool_call" if text.rstrip().endswith(chat.family.tool_call_stop) and not ended_turn else "end_of_turn"
    model_turn = ModelTurn(text, parsed.content, parsed.calls, stopped)
    episode.trajectory.messages.append(_assistant_message(model_turn))
    return model_turn


def _assistant_message(turn: ModelTurn) -> dict:
    """The turn as a chat message: its content and structured calls; with a malformed call, the whole text as
    content (a malformed call has no structure to render)."""
    if turn.calls and all(c.error is None for c in turn.calls):
        calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls]
        return {"role": "assistant", "content": turn.content, "tool_calls": calls}
    return {"role": "assistant", "content": turn.text}


def _after_step(episode: _Episode, result: StepResult, chat: ChatFormat, caps: EpisodeCaps) -> bool:
    """Record the step; append its observations. True when the episode goes on."""
    trajectory = episode.trajectory
    trajectory.turn_rewards.append(result.reward)
    trajectory.tool_results += list(result.tool_results)
    trajectory.void_turns += bool(result.void)
    if result.done:
        episode.end(result.end_reason or "eos")
        return False
    if not result.observations:
        raise ValueError("an environment step that is not done must return observations for the next turn "
                         "(or done=True)")
    if trajectory.turns >= caps.max_turns:
        episode.end("max_turns")
        return False
    observations, shown, cut = [], [], 0
    for message in result.observations:
        ids, was_cut = _observation_ids(str(message["content"]), chat, caps.max_tool_response_tokens)
        observations.append(ids)
        shown.append({"role": message["role"], "content": chat.decode(ids) if was_cut else str(message["content"])})
        cut += was_cut
    messages_before = list(trajectory.messages)
    trajectory.messages += shown
    history_before = chat.render(messages_before, add_generation_prompt=False)
    history_after = chat.render(trajectory.messages, add_generation_prompt=True)
    if is_append_only(history_before, history_after):
        frames = chat.observation_frames([m["role"] for m in result.observations])
        added = continuation(episode.sample.response_ids, frames, observations,
                             chat.end_of_turn_ids)
        if episode.response_tokens + len(added.ids) >= caps.max_response_tokens:
            episode.end("length")
            return False
        episode.sample.add_context(added.ids)
        trajectory.observation_tokens += added.observation_tokens
        trajectory.boundary_tokens += added.boundary_tokens
    else:
        prompt = chat.encode(history_after)
        if len(prompt) - episode.first_prompt_len >= caps.max_response_tokens:
            episode.end("length")
            return False
        trajectory.samples.append(TrainingSample(prompt))
        trajectory.observation_tokens += sum(len(o) for o in observations)
    trajectory.truncated_observations += cut
    return True


def _observation_ids(text: str, chat: ChatFormat, max_tokens: int | None) -> tuple[list[int], bool]:
    """The observation's ids, tokenized once; past `max_tokens`, cut and ended with a marker saying how many
    tokens were cut (the marker counts against the cap)."""
    ids = chat.encode(text)
    if max_tokens is None or len(ids) <= max_tokens:
        return ids, False
    marker = chat.encode(TRUNCATION_MARKER.format(n=len(ids)))            # the longest the count can be
    exact = chat.encode(TRUNCATION_MARKER.format(n=len(ids) - max_tokens + len(marker)))
    return truncate_observation(ids, max_tokens, exact if len(exact) == len(marker) else marker)
