"""The pure token bookkeeping between turns, on hand-made id lists."""

from __future__ import annotations

import pytest

from literl.multiturn.tokens import (continuation, drop_repeated_end_of_turn, first_stop, is_append_only,
                                     truncate_observation)

END, CALL_END = 101, 103      # <|im_end|> and </tool_call> in literl's chat tokenizer


def test_truncation_keeps_the_head_and_ends_with_the_marker_inside_the_cap():
    """10 ids, cap 6, a 2-id marker: keep 6-2 = 4 ids, then the marker: 6 ids in all."""
    assert truncate_observation(range(10, 20), 6, [1, 2]) == ([10, 11, 12, 13, 1, 2], True)
    assert truncate_observation([5, 6], 6, [1, 2]) == ([5, 6], False)
    assert truncate_observation(range(100), None, [1, 2]) == (list(range(100)), False)
    with pytest.raises(ValueError, match=r"max_tool_response_tokens=1 leaves no room .* at least 2"):
        truncate_observation(range(10), 1, [1, 2])


def test_the_frame_repeats_no_end_of_turn_the_engine_already_sampled():
    """Stopped at </tool_call>: the frame's <|im_end|> is inserted (context). Ended with <|im_end|>: it was sampled,
    so the frame starts after it."""
    frame = [END, 9, 10]
    assert drop_repeated_end_of_turn([5, 6, CALL_END], frame, [END]) == [END, 9, 10]
    assert drop_repeated_end_of_turn([5, 6, END], frame, [END]) == [9, 10]
    assert drop_repeated_end_of_turn([5, 6, END], frame, []) == [END, 9, 10]


def test_continuation_interleaves_frames_and_observations_and_counts_them():
    """frames [101, 9] | obs [50, 51] | [8] | obs [60] | [7, 7]: 8 ids, 3 of them observation, 5 boundary."""
    added = continuation([5, CALL_END], [[END, 9], [8], [7, 7]], [[50, 51], [60]], [END])
    assert added.ids == [END, 9, 50, 51, 8, 60, 7, 7]
    assert (added.observation_tokens, added.boundary_tokens) == (3, 5)
    with pytest.raises(ValueError, match="2 observations need 3 frames"):
        continuation([5], [[1], [2]], [[3], [4]], [END])


def test_first_stop_finds_the_shortest_prefix_ending_at_a_token_or_a_string():
    """ids 5 6 7 103 8 with stop token 103: the prefix of 4 ids. As text (one char per id, 'abcde'), stop string
    'cd' ends at the 4th id; 'zz' is absent."""
    assert first_stop([5, 6, 7, CALL_END, 8], [CALL_END], [], None) == 4
    decode = lambda ids: "".join("abcde"[i] for i in ids)
    assert first_stop([0, 1, 2, 3, 4], [], ["cd"], decode) == 4
    assert first_stop([0, 1, 2, 3, 4], [], ["zz"], decode) is None
    assert first_stop([0, 1, 2, 3, 4], [1], ["cd"], decode) == 2      # the token stop comes first


def test_append_only_is_a_prefix_check_on_the_rendered_history():
    assert is_append_only("<a>x</a>", "<a>x</a><b>y</b>")
    assert not is_append_only("<a><think>r</think>x</a>", "<a>x</a><b>y</b>")


def test_first_stop_on_a_string_finds_the_earliest_prefix_even_when_it_occurs_twice():
    """'xxcdxcd' one char per id: 'cd' first ends at the 4th id (the bisection must not land on the second)."""
    text = "xxcdxcd"
    decode = lambda ids: "".join(text[i] for i in ids)
    assert first_stop(list(range(7)), [], ["cd"], decode) == 4
    assert first_stop(list(range(7)), [], ["cd", "xx"], decode) == 2
