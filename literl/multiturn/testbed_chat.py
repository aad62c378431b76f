"""A character-level chat tokenizer for tool-use tests: the testbed's tokenizer plus the Hermes/Qwen special
tokens, with one of literl's own chat templates attached. Built locally; nothing is downloaded.

Ids: the testbed's 100 (pad 0, eos 1, bos 2, unk 3, newline and printable ASCII), then CHAT_SPECIAL_TOKENS
from 100 in order. The EOS token is <|im_end|>, the end of a chat turn, as in Qwen's chat models.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from literl.testbed.tokenizer import build_char_tokenizer
from literl.tools.templates import chat_template

CHAT_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                       "</tool_response>", "<think>", "</think>"]


def build_chat_tokenizer(template: str = "hermes_tools") -> PreTrainedTokenizerFast:
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIAL_TOKENS})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = chat_template(template)
    tok.init_kwargs.pop("literl_prompt_template", None)     # prompts use the chat template, not raw text
    return tok
