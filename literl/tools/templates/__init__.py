"""Chat templates written for literl's tests and examples (no model's template is copied or downloaded).

    hermes_tools            Hermes/Qwen-style turns with tools, tool calls and tool responses; append-only
    hermes_strip_thinking   the same, but earlier assistant turns lose their <think> reasoning: not append-only
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE_FOLDER = Path(__file__).resolve().parent
CHAT_TEMPLATES = ("hermes_tools", "hermes_strip_thinking")


def chat_template(name: str) -> str:
    """The Jinja source of template `name` (one of CHAT_TEMPLATES)."""
    if name not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; literl ships: {', '.join(CHAT_TEMPLATES)}")
    return (TEMPLATE_FOLDER / f"{name}.jinja").read_text()
