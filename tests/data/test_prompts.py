"""Prompt templates: plain, chat, raw and auto, as text and as token ids."""

from __future__ import annotations

import pytest

from literl.data.prompts import INSTRUCTION, render_prompt, render_prompt_text, resolve_template

PROBLEM = "What is 2+3?"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_plain_and_raw(char_tokenizer):
    assert render_prompt_text(PROBLEM, char_tokenizer, "plain") == PROBLEM + "\n" + INSTRUCTION
    assert render_prompt_text(PROBLEM, char_tokenizer, "raw") == PROBLEM
    assert INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    ids = render_prompt(PROBLEM, char_tokenizer, "raw")
    assert ids == char_tokenizer(PROBLEM, add_special_tokens=False)["input_ids"] and len(ids) == len(PROBLEM)
    assert char_tokenizer.decode(render_prompt(PROBLEM, char_tokenizer, "plain")) == PROBLEM + "\n" + INSTRUCTION


def test_auto_is_plain_without_a_chat_template(char_tokenizer):
    char_tokenizer.init_kwargs.pop("literl_prompt_template")
    assert resolve_template("auto", char_tokenizer) == "plain"
    assert render_prompt(PROBLEM, char_tokenizer, "auto") == render_prompt(PROBLEM, char_tokenizer, "plain")


def test_auto_follows_the_template_a_tokenizer_declares(char_tokenizer, tmp_path):
    """The testbed tokenizer declares raw (its model never saw an instruction), and keeps it through a save."""
    from transformers import AutoTokenizer

    char_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert resolve_template("auto", reloaded) == "raw"
    assert render_prompt(PROBLEM, reloaded, "auto") == render_prompt(PROBLEM, reloaded, "raw")


def test_chat_uses_the_tokenizers_template(char_tokenizer):
    char_tokenizer.init_kwargs.pop("literl_prompt_template")
    char_tokenizer.chat_template = CHAT_TEMPLATE
    text = render_prompt_text(PROBLEM, char_tokenizer, "chat")
    assert text == f"<|user|>{PROBLEM}\n{INSTRUCTION}\n<|assistant|>"
    assert resolve_template("auto", char_tokenizer) == "chat"
    assert char_tokenizer.decode(render_prompt(PROBLEM, char_tokenizer, "chat")) == text


def test_chat_without_template_and_unknown_template_explain(char_tokenizer):
    with pytest.raises(ValueError, match="needs a tokenizer with a chat_template.*'plain'"):
        render_prompt(PROBLEM, char_tokenizer, "chat")
    with pytest.raises(ValueError, match="unknown prompt template 'fancy'; valid templates: auto, chat, plain, raw"):
        render_prompt(PROBLEM, char_tokenizer, "fancy")


def test_a_system_prompt_and_chat_template_arguments(char_tokenizer):
    """A system prompt opens the chat; when it is the instruction itself (the seed study's prompts, algorithms.md
    §8.1) the user message is the bare problem, otherwise the instruction follows the problem. Template arguments
    such as Qwen3's enable_thinking reach the template."""
    char_tokenizer.chat_template = ("{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
                                    + CHAT_TEMPLATE)
    assert (render_prompt_text(PROBLEM, char_tokenizer, "chat", system_prompt=INSTRUCTION)
            == f"<|system|>{INSTRUCTION}\n<|user|>{PROBLEM}\n<|assistant|>")
    assert (render_prompt_text(PROBLEM, char_tokenizer, "chat", system_prompt="Be brief.", instruction="Box it.")
            == f"<|system|>Be brief.\n<|user|>{PROBLEM}\nBox it.\n<|assistant|>")
    assert (render_prompt_text(PROBLEM, char_tokenizer, "chat", instruction="",
                               chat_template_kwargs={"enable_thinking": False})
            == f"<nothink><|user|>{PROBLEM}\n<|assistant|>")
    assert render_prompt_text(PROBLEM, char_tokenizer, "plain", system_prompt="ignored", instruction="Box it.") == (
        f"{PROBLEM}\nBox it.")
