"""What differs between model families in tool use, in one place: how calls are written and parsed, which
text ends a turn, and how an observation is framed. Everything else (the episode driver, the token
bookkeeping) asks `model_family(name)`.

    hermes (aliases: qwen, qwen2.5, qwen3)   Hermes/Qwen chat format: turns end with <|im_end|>, calls are
                                             <tool_call>{json}</tool_call>, observations are "tool" messages
                                             that the tokenizer's chat template frames
    raw                                      plain text without a chat template (literl's testbed): calls as in
                                             hermes, the end of a turn is the tokenizer's EOS, an observation is
                                             framed as <tool_response>...</tool_response> text
"""

from __future__ import annotations

from dataclasses import dataclass

from literl.tools.parsing import HermesToolCallParser, ToolCallParser


@dataclass(frozen=True)
class ModelFamily:
    name: str
    parser: ToolCallParser
    tool_call_stop: str                  # stop string after which a turn's calls are run
    end_of_turn: str | None              # the text a turn ends with in the chat template; None: the EOS token
    uses_chat_template: bool             # prompts and observations rendered by the tokenizer's chat template
    raw_observation: tuple[str, str] = ("", "")   # raw family: the text around an observation


_HERMES = ModelFamily("hermes", HermesToolCallParser(), "</tool_call>", "<|im_end|>", True)
_RAW = ModelFamily("raw", HermesToolCallParser(), "</tool_call>", None, False,
                   ("\n<tool_response>\n", "\n</tool_response>\n"))
MODEL_FAMILIES = {"hermes": _HERMES, "qwen": _HERMES, "qwen2.5": _HERMES, "qwen3": _HERMES, "raw": _RAW}


def model_family(name: str) -> ModelFamily:
    """The family called `name`; a ValueError lists the known ones for any other name."""
    try:
        return MODEL_FAMILIES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown model family {name!r} for tool calls; known: {', '.join(MODEL_FAMILIES)}. "
                         "A new family needs a parser and its turn-boundary facts in literl/tools/families.py"
                         ) from None
