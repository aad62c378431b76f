"""literl's own engine (`NativeEngine`, or any `Engine`) as the driver's `generate(contexts, max_new_tokens)`.

The engine samples one `max_new_tokens` for the whole batch: the adapter asks for the largest row cap, and the
driver cuts each row at its own cap. A row stops at the engine's EOS ids and at `params.stop_token_ids` (the
multi-turn collector passes `ChatFormat.stop_token_ids`: the end of turn and, where it is one token, a tool call's
closing tag). Stops that are several tokens (`ChatFormat.stop_strings`) the engine cannot see: the driver cuts
the turn at the first one afterwards, which is exact (a prefix of a sample, with its log-probs) but samples
tokens that are thrown away.
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
