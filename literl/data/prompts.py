"""Prompt templates: how a problem becomes the token ids a model continues.

    plain  problem + "\\n" + instruction (default "Please reason step by step, and put your final answer within
           \\boxed{}."), encoded with the tokenizer's own special tokens (a BOS if the tokenizer adds one)
    chat   the tokenizer's chat template (`apply_chat_template`, add_generation_prompt=True, plus any chat-template
           arguments) with an optional system message and one user message: the plain text above, or the problem
           alone when the system prompt is the instruction itself (the seed study's format, algorithms.md §8.1).
           The template writes any BOS/role tokens itself, so the text is encoded without adding special tokens
           again.
    raw    the problem text verbatim (base models prompted with their own format; the char-level testbed)
    auto   the template the tokenizer declares (`tokenizer.init_kwargs["literl_prompt_template"]`, saved in
           tokenizer_config.json; the testbed declares raw), else chat if the tokenizer has a chat template,
           else plain

The instruction is the one the LitePPO paper (arXiv:2508.08221 §3.1) and SimpleRL-Zoo use.
"""

from __future__ import annotations

from typing import Any

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = ("auto", "chat", "plain", "raw")
DECLARED_TEMPLATE_KEY = "literl_prompt_template"   # a model's own prompt format, kept with its tokenizer


def resolve_template(template: str, tokenizer: Any) -> str:
    """The concrete template (`auto` resolved); an unknown name or a chat-less `chat` raises with the fix."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; valid templates: {', '.join(TEMPLATES)}")
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        declared = (getattr(tokenizer, "init_kwargs", None) or {}).get(DECLARED_TEMPLATE_KEY)
        if declared in TEMPLATES and declared != "auto":
            return declared
        return "chat" if has_chat else "plain"
    if template == "chat" and not has_chat:
        raise ValueError("template 'chat' needs a tokenizer with a chat_template, and this one has none; "
                         "use template 'plain' (instruction appended) or 'raw' (problem verbatim)")
    return template


def chat_messages(problem: str, *, system_prompt: str = "", instruction: str = INSTRUCTION) -> list[dict]:
    """The chat messages of a problem: an optional system message, then the problem with the instruction on its
    own line (left out when the system prompt already is that instruction, as in the seed study's prompts)."""
    user = problem if not instruction or instruction == system_prompt else f"{problem}\n{instruction}"
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user",
                                                                                     "content": user}]


def render_prompt_text(problem: str, tokenizer: Any, template: str, *, system_prompt: str | None = None,
                       instruction: str = INSTRUCTION, chat_template_kwargs: dict | None = None) -> str:
    """The prompt as text, exactly what `render_prompt` encodes. `system_prompt` applies to chat prompts only;
    `chat_template_kwargs` are passed to the chat template (e.g. enable_thinking=False for Qwen3)."""
    template = resolve_template(template, tokenizer)
    if template == "raw":
        return problem
    if template == "plain":
        return f"{problem}\n{instruction}" if instruction else problem
    messages = chat_messages(problem, system_prompt=system_prompt or "", instruction=instruction)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **dict(chat_template_kwargs or {}))


def render_prompt(problem: str, tokenizer: Any, template: str, **options) -> list[int]:
    """The prompt as token ids, ready for `Engine.generate`; `options` as for `render_prompt_text`."""
    text = render_prompt_text(problem, tokenizer, template, **options)
    # A chat template already wrote its special tokens; adding them again would double the BOS.
    add_special = resolve_template(template, tokenizer) != "chat"
    ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
    if not ids:
        raise ValueError(f"the prompt for problem {problem[:60]!r} encodes to no tokens")
    return list(ids)
