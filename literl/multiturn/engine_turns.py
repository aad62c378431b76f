"""literl's own engine (`NativeEngine`, or any `Engine`) as the driver's `generate(contexts, max_new_tokens)`.

The engine stops only at its EOS ids and samples one `max_new_tokens` for the whole batch: the adapter asks for
the largest row cap, and the driver cuts each row at its own cap and at its first stop (a tool call's closing
tag is not an EOS for the engine). The cut is exact (a prefix of a sample, with its log-probs) but wastes the
tokens sampled past it (a stop hook in the engine's decode loop would save them).
"""

from __future__ import annotations

import dataclasses

import torch

from literl.multiturn.episodes import SampledTurn, TurnGenerator
from literl.rollout.engine import Engine, SamplingParams


def engine_turns(engine: Engine, params: SamplingParams, *, rng: torch.Generator | None = None) -> TurnGenerator:
    def generate(contexts: list[list[int]], max_new_tokens: list[int]) -> list[SampledTurn]:
        generation = engine.generate(contexts, dataclasses.replace(params, max_new_tokens=max(max_new_tokens)),
                                     rng=rng)
        turns = []
        for b in range(len(contexts)):
            n = int(generation.mask_BT[b].sum())
            turns.append(SampledTurn(generation.response_ids_BT[b, :n].tolist(),
                                     generation.rollout_logp_BT[b, :n].tolist()))
        return turns

    return generate
