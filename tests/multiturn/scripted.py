"""A scripted engine for episode tests: each problem's turns are fixed texts, returned as ids with made-up
log-probs (-0.01 * position in the turn, so every sampled token's log-prob is recognisable)."""

from __future__ import annotations

from literl.multiturn import SampledTurn


class ScriptedEngine:
    def __init__(self, chat, scripts: dict[str, list[str]], overrun: str = ""):
        self.chat = chat
        self.scripts = {question: list(turns) for question, turns in scripts.items()}
        self.overrun = overrun           # text an engine without stop support samples past the stop
        self.contexts: dict[str, list[list[int]]] = {q: [] for q in scripts}
        self.calls = 0

    def __call__(self, contexts, max_new_tokens):
        self.calls += 1
        turns = []
        for context, limit in zip(contexts, max_new_tokens):
            text = self.chat.decode(context)
            question = next(q for q in self.scripts if q in text)
            self.contexts[question].append(list(context))
            ids = self.chat.encode(self.scripts[question].pop(0) + self.overrun)[:limit]
            turns.append(SampledTurn(ids, [-0.01 * (i + 1) for i in range(len(ids))]))
        return turns


def logprobs(n):
    return [-0.01 * (i + 1) for i in range(n)]
