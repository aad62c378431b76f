"""Frames around observations read off literl's own chat templates, stops, and the family checks."""

from __future__ import annotations

import pytest

from literl.multiturn import ChatFormat
from literl.multiturn.testbed_chat import build_chat_tokenizer
from literl.testbed.tokenizer import build_char_tokenizer


def frame_texts(chat, roles):
    return [chat.decode(ids) for ids in chat.observation_frames(roles)]


def test_hermes_frames_close_the_turn_wrap_each_result_and_open_the_next_assistant_turn():
    chat = ChatFormat(build_chat_tokenizer("hermes_tools"), "qwen")
    assert frame_texts(chat, ["tool"]) == ["<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                                           "\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"]
    # two results share one user turn: the middle frame closes one response and opens the next
    assert frame_texts(chat, ["tool", "tool"])[1] == "\n</tool_response>\n<tool_response>\n"
    assert frame_texts(chat, ["user"]) == ["<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"]
    # <|im_start|> is one id (100), so each frame is tokenized on its own, once: '<|im_end|>' then '\n' ...
    assert chat.observation_frames(["tool"])[0][:3] == [101, chat.encode("\n")[0], 100]


def test_stops_are_the_end_of_turn_and_the_closing_tool_call_tag():
    chat = ChatFormat(build_chat_tokenizer(), "hermes")
    assert chat.stop_token_ids == [101, 103]        # <|im_end|> (also the EOS) and </tool_call>
    assert chat.stop_strings == []
    assert chat.end_of_turn_ids == [101]


def test_the_raw_family_frames_observations_as_text_and_stops_on_the_tag_as_a_string():
    chat = ChatFormat(build_char_tokenizer(), "raw")
    assert frame_texts(chat, ["tool", "tool"]) == ["\n<tool_response>\n", "\n</tool_response>\n\n<tool_response>\n",
                                                   "\n</tool_response>\n"]
    assert chat.stop_token_ids == [1] and chat.stop_strings == ["</tool_call>"]
    assert chat.prompt_ids([{"role": "user", "content": "What is 2+3?\n"}]) == chat.encode("What is 2+3?\n")


def test_a_chat_family_without_a_chat_template_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"has none: set tokenizer.chat_template .* 'raw' family"):
        ChatFormat(build_char_tokenizer(), "qwen3")
