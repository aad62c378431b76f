"""The token bookkeeping between turns, as pure functions on id lists.

After a turn the engine sampled, the next context is: the sampled ids as they are, then the ids the chat
template puts between that turn and the observation (closing the turn, the tool-response header), the
observation ids (tokenized once, truncated if long), the ids after it (the footer, the next assistant header).
Everything inserted is context (mask 0). Whether that is what the model would see depends on the template
being append-only, which `is_append_only` checks on the rendered text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Continuation:
    """The context ids to append after a turn: `ids`, of which `observation_tokens` are observations; all mask 0."""

    ids: list[int]
    observation_tokens: int
    boundary_tokens: int
    truncated: int                     # how many observations were cut to the cap


def truncate_observation(ids: Sequence[int], max_tokens: int | None, marker_ids: Sequence[int]) -> tuple[list[int], bool]:
    """`ids` cut to at most `max_tokens` ids, the last `len(marker_ids)` of which are the marker saying it was cut.
    Returns (ids, was_cut); with `max_tokens=None` nothing is cut."""
    ids = list(ids)
    if max_tokens is None or len(ids) <= max_tokens:
        return ids, False
    if max_tokens < len(marker_ids):
        raise ValueError(f"max_tool_response_tokens={max_tokens} leaves no room for the truncation marker "
                         f"({len(marker_ids)} tokens); raise it to at least {len(marker_ids)}")
    keep = max_tokens - len(marker_ids)
    return ids[:keep] + list(marker_ids), True


def drop_repeated_end_of_turn(sampled_ids: Sequence[int], first_frame_ids: Sequence[int],
                              end_of_turn_ids: Sequence[int]) -> list[int]:
    """The first frame's ids without its leading end-of-turn ids when the sampled turn already ends with them.

    A turn that stops at its tool call's closing tag did not sample the end-of-turn token: the template's
    frame supplies it, as context. A turn that ended with the end-of-turn token sampled it: the frame must not
    repeat it."""
    first, end = list(first_frame_ids), list(end_of_turn_ids)
    if end and list(sampled_ids[-len(end):]) == end and first[:len(end)] == end:
        return first[len(end):]
    return first


def continuation(sampled_ids: Sequence[int], frame_ids: Sequence[Sequence[int]],
                 observation_ids: Sequence[Sequence[int]], end_of_turn_ids: Sequence[int]) -> Continuation:
    """frame 0, observation 0, frame 1, ..., observation n-1, frame n: `len(frame_ids) == len(observation_ids) + 1`."""
    if len(frame_ids) != len(observation_ids) + 1:
        raise ValueError(f"{len(observation_ids)} observations need {len(observation_ids) + 1} frames "
                         f"(got {len(frame_ids)})")
    frames = [drop_repeated_end_of_turn(sampled_ids, frame_ids[0], end_of_turn_ids), *map(list, frame_ids[1:])]
    ids: list[int] = list(frames[0])
    for obs, frame in zip(observation_ids, frames[1:]):
        ids += list(obs) + frame
    n_obs = sum(len(o) for o in observation_ids)
    return Continuation(ids, n_obs, len(ids) - n_obs, 0)


def is_append_only(history_before: str, history_after: str) -> bool:
    """Whether the rendered history after a step extends the one before it unchanged (the template did not
    rewrite earlier turns, e.g. by stripping their reasoning)."""
    return history_after.startswith(history_before)


def first_stop(ids: Sequence[int], stop_token_ids: Sequence[int], stop_strings: Sequence[str], decode) -> int | None:
    """The length of the shortest prefix of `ids` that ends at a stop (a stop token, or a decoded stop string);
    None when there is none. Cutting a sample there is exact: the kept ids and their log-probs are what
    sampling with that stop would have produced."""
    stops = set(stop_token_ids)
    found = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
    if stop_strings:
        # A longer prefix decodes to a longer text, so "contains a stop string" is monotone in the prefix length:
        # bisect it (a few decodes, not one per token).
        horizon = found or len(ids)
        contains = lambda n: any(s in decode(list(ids[:n])) for s in stop_strings)
        if contains(horizon):
            low, high = 1, horizon
            while low < high:
                middle = (low + high) // 2
                low, high = (low, middle) if contains(middle) else (middle + 1, high)
            found = low
    return found
