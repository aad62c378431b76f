"""How one model family's conversations become text and ids: prompts, the frames around observations, stops.

The frames around observations are read off the tokenizer's own chat template, not written per model: a
conversation of placeholders (a user turn, an assistant turn, then the observation messages) is rendered with
the generation prompt, and the text after the assistant's placeholder, split at the observations'
placeholders, gives the frames (Qwen/Hermes, one tool result: "<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n"
before it and "\\n</tool_response>\\n<|im_end|>\\n<|im_start|>assistant\\n" after). Each frame is tokenized
on its own, once, and cached per sequence of observation roles. What differs per family (the end-of-turn
text, the stop string, the raw family's framing) comes from `literl.tools.families`.
"""

from __future__ import annotations

from typing import Sequence

from literl.tools.families import ModelFamily, model_family

_ASSISTANT = "\u2063LITERL-ASSISTANT-PLACEHOLDER\u2063"
_USER = "LITERL-USER-PLACEHOLDER"


def _observation_placeholder(i: int) -> str:
    return f"LITERL-OBSERVATION-{i}-PLACEHOLDER"


class ChatFormat:
    """`tokenizer` (a Hugging Face tokenizer; with a chat template unless the family is "raw"), the model family,
    and the tool schemas listed in the prompt."""

    def __init__(self, tokenizer, family: str | ModelFamily, tool_schemas: Sequence[dict] = ()):
        self.tokenizer = tokenizer
        self.family = family if isinstance(family, ModelFamily) else model_family(family)
        self.tool_schemas = list(tool_schemas)
        if self.family.uses_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"model family {self.family.name!r} renders prompts with the tokenizer's chat template, "
                             "but this tokenizer has none: set tokenizer.chat_template (literl.tools.templates has "
                             "test templates) or use the 'raw' family for plain-text prompts")
        self._frames: dict[tuple[str, ...], list[list[int]]] = {}
        self.end_of_turn_ids = self.encode(self.family.end_of_turn) if self.family.end_of_turn else []

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        if self.family.uses_chat_template:
            return self.tokenizer.apply_chat_template(list(messages), tools=self.tool_schemas or None,
                                                      add_generation_prompt=add_generation_prompt, tokenize=False)
        return self._render_raw(messages)

    def _render_raw(self, messages: Sequence[dict]) -> str:
        before, after = self.family.raw_observation
        parts = []
        for message in messages:
            if message["role"] in ("tool", "observation"):
                parts.append(f"{before}{message['content']}{after}")
            elif message["role"] != "system":
                parts.append(message["content"])
        return "".join(parts)

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that end a turn: the EOS, the end-of-turn token and the tool-call stop, where each is one token."""
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        for text in (self.family.end_of_turn, self.family.tool_call_stop):
            if text:
                encoded = self.encode(text)
                if len(encoded) == 1:
                    ids.add(encoded[0])
        return sorted(ids)

    @property
    def stop_strings(self) -> list[str]:
        """Stops that are more than one token (an engine stops on them as text)."""
        texts = [t for t in (self.family.end_of_turn, self.family.tool_call_stop) if t]
        return [t for t in texts if len(self.encode(t)) > 1]

    def observation_frames(self, roles: Sequence[str]) -> list[list[int]]:
        """The ids of the len(roles)+1 frames around observations with these roles (see the module docstring)."""
        key = tuple(roles)
        if key not in self._frames:
            self._frames[key] = [self.encode(text) for text in self._frame_texts(key)]
        return self._frames[key]

    def _frame_texts(self, roles: tuple[str, ...]) -> list[str]:
        if not self.family.uses_chat_template:
            before, after = self.family.raw_observation
            return [before] + [after + before] * (len(roles) - 1) + [after]
        messages = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        messages += [{"role": role, "content": _observation_placeholder(i)} for i, role in enumerate(roles)]
        text = self.render(messages, add_generation_prompt=True)
        if text.count(_ASSISTANT) != 1:
            raise ValueError("the chat template does not render an assistant message's content verbatim, so the "
                             "tokens between turns cannot be read off it")
        rest = text[text.index(_ASSISTANT) + len(_ASSISTANT):]
        frames = []
        for i in range(len(roles)):
            placeholder = _observation_placeholder(i)
            if placeholder not in rest:
                raise ValueError(f"the chat template drops a {roles[i]!r} message's content; observations with that "
                                 "role cannot be shown to the model")
            frame, rest = rest.split(placeholder, 1)
            frames.append(frame)
        return frames + [rest]
