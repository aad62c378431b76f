"""What a multi-turn episode produces: training samples of the engine's own ids with a per-token mask, and the
record of the episode (messages, calls, end reason, counts).

Token glossary (one sample): `prompt_ids` is the context the engine was given before its first sampled token;
`response_ids` is everything from that token on: the engine's sampled ids (mask 1, with the engine's log-prob in
`rollout_logp`) and the context inserted between turns (mask 0, log-prob 0.0): the template's boundary tokens
and the observations. A trajectory is one sample unless the chat template is not append-only; then each
re-rendered history starts a new sample (`literl.multiturn.episodes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from literl.tools.calls import ToolCall, ToolResult

EndReason = Literal["answer", "eos", "max_turns", "length", "tool_failure"]
END_REASONS: tuple[str, ...] = ("answer", "eos", "max_turns", "length", "tool_failure")
SAMPLED, CONTEXT = 1, 0


@dataclass
class TrainingSample:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)      # 1 sampled by the engine, 0 context only
    rollout_logp: list[float] = field(default_factory=list)     # engine log-prob where sampled, 0.0 elsewhere

    def add_sampled(self, ids: list[int], logprobs: list[float]) -> None:
        self.response_ids += ids
        self.response_mask += [SAMPLED] * len(ids)
        self.rollout_logp += [float(p) for p in logprobs]

    def add_context(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [CONTEXT] * len(ids)
        self.rollout_logp += [0.0] * len(ids)

    @property
    def context_ids(self) -> list[int]:
        """What the engine is given to sample the next turn."""
        return self.prompt_ids + self.response_ids

    @property
    def sampled_tokens(self) -> int:
        return sum(self.response_mask)


@dataclass(frozen=True)
class ModelTurn:
    """One turn the engine sampled, as the environment sees it. `text` is the decoded turn without its
    end-of-turn marker; `content` the text before the first tool call; `stopped` says what ended it."""

    text: str
    content: str
    calls: tuple[ToolCall, ...]
    stopped: Literal["end_of_turn", "tool_call"]


@dataclass
class Trajectory:
    problem: dict
    samples: list[TrainingSample]
    messages: list[dict]
    end_reason: EndReason | None = None
    turns: int = 0
    turn_rewards: list[float | None] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    void_turns: int = 0
    observation_tokens: int = 0        # observation ids appended (after truncation), boundary tokens not included
    boundary_tokens: int = 0
    truncated_observations: int = 0
    failure: str | None = None          # what went wrong when end_reason is "tool_failure"

    @property
    def sampled_tokens(self) -> int:
        return sum(s.sampled_tokens for s in self.samples)

    @property
    def tool_calls(self) -> int:
        return len(self.tool_results)

    def counts(self) -> dict[str, int]:
        """Per-trajectory counts the metrics (`multiturn/...`) are means of."""
        return {"turns": self.turns, "tool_calls": self.tool_calls,
                "tool_errors": sum(r.status == "error" for r in self.tool_results),
                "tool_timeouts": sum(r.status == "timeout" for r in self.tool_results),
                "void_turns": self.void_turns, "sampled_tokens": self.sampled_tokens,
                "observation_tokens": self.observation_tokens, "boundary_tokens": self.boundary_tokens,
                "truncated_observations": self.truncated_observations, "samples": len(self.samples)}
