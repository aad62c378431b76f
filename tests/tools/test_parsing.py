"""Hermes/Qwen tool-call parsing and the one place that chooses a family."""

from __future__ import annotations

import pytest

from literl.tools import model_family


def parse(text):
    return model_family("qwen3").parser.parse(text)


def test_hermes_parser_reads_two_calls_and_the_content_before_them():
    turn = parse('I will compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
                 '\n<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>')
    assert turn.content == "I will compute."
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [
        ("calculator", {"expression": "2+2"}, None), ("python", {"code": "print(1)"}, None)]
    assert turn.calls[0].raw.startswith("<tool_call>") and turn.calls[0].raw.endswith("</tool_call>")


def test_a_turn_without_calls_is_all_content():
    turn = parse("The answer is \\boxed{4}")
    assert turn.content == "The answer is \\boxed{4}" and turn.calls == ()


@pytest.mark.parametrize("body, message", [
    ("{name: calculator}", "not valid JSON"),
    ('["calculator"]', "must be a JSON object"),
    ('{"arguments": {}}', 'no "name" string'),
    ('{"name": "calculator", "arguments": [1]}', '"arguments" of tool \'calculator\' must be a JSON object'),
])
def test_malformed_calls_become_calls_with_an_error(body, message):
    (call,) = parse(f"<tool_call>{body}</tool_call>").calls
    assert message in call.error and "<tool_call>{\"name\"" in call.error


def test_an_unclosed_call_is_an_error_call():
    (call,) = parse('x<tool_call>{"name": "calculator"').calls
    assert "no closing </tool_call>" in call.error


def test_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model family 'llama9'.*known: hermes, qwen"):
        model_family("llama9")
    assert model_family("Qwen").name == "hermes" and model_family("raw").end_of_turn is None
