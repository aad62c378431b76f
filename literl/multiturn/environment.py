"""The environment interface of multi-turn rollouts, and `ToolEnvironment`, which implements it with tools.

An environment (SkyRL's `BaseTextEnv`, verl's agent loop, TRL's `environment_factory` have the same shape) is
made per episode by a factory from the problem:

    reset(problem) -> messages          the conversation the first turn is sampled from
    step(turn) -> StepResult            given the model's turn: observations (messages), optional reward, done

`turn` is a `ModelTurn`: the decoded text, its content before any tool call and the parsed calls (parsed by the
model family's parser, in one place, before the environment sees them). An environment may also expose
`tool_schemas` (a list of JSON schemas) to have them listed in the prompt by the chat template.
Observation messages have role "tool" (a tool's result) or "user" (e.g. a simulated user's reply).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

from literl.multiturn.trajectory import EndReason, ModelTurn
from literl.tools.calls import ToolResult
from literl.tools.execution import ToolRunner
from literl.tools.json_schema import tool_schema

BOXED_ANSWER = r"\\boxed\{"


@dataclass
class StepResult:
    observations: Sequence[dict] = ()       # messages to show the model next ({"role": "tool"|"user", "content"})
    reward: float | None = None             # this turn's reward, if the environment gives per-turn rewards
    done: bool = False
    end_reason: EndReason | None = None     # when done: "answer" or "eos" (default "eos")
    tool_results: Sequence[ToolResult] = ()
    void: bool = False                      # neither a tool call nor an answer (SimpleTIR's "void turn")
    info: dict = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    def reset(self, problem: dict) -> list[dict]: ...

    def step(self, turn: ModelTurn) -> StepResult: ...


class ToolEnvironment:
    """Answers each tool call with its result; a turn without calls ends the episode.

    A turn with calls: the calls run (concurrently, under the runner's deadline) and each result is a "tool"
    message, in the calls' order. A turn without calls is the end: "answer" when its text matches
    `answer_pattern` (default: a \\boxed{} answer), else "eos", counted as a void turn.
    `prompt_key` names the problem's field holding the question; `system_prompt` opens the conversation.
    """

    def __init__(self, runner: ToolRunner, *, system_prompt: str | None = None, prompt_key: str = "problem",
                 answer_pattern: str = BOXED_ANSWER):
        self.runner = runner
        self.system_prompt = system_prompt
        self.prompt_key = prompt_key
        self.answer_pattern = re.compile(answer_pattern)

    @property
    def tool_schemas(self) -> list[dict]:
        return [tool_schema(fn) for fn in self.runner.tools.values()]

    def reset(self, problem: dict) -> list[dict]:
        if self.prompt_key not in problem:
            raise ValueError(f"ToolEnvironment reads the question from the problem's {self.prompt_key!r} field; "
                             f"this problem has {sorted(problem)}: pass prompt_key=...")
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + [{"role": "user", "content": str(problem[self.prompt_key])}]

    def step(self, turn: ModelTurn) -> StepResult:
        if turn.calls:
            results = self.runner.run(turn.calls)
            return StepResult([{"role": "tool", "content": r.text} for r in results], tool_results=results)
        answered = bool(self.answer_pattern.search(turn.text))
        return StepResult(done=True, end_reason="answer" if answered else "eos", void=not answered)
