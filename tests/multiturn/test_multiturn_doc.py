"""docs/multiturn.md's code blocks run as written, so the guide cannot drift from the API."""

from __future__ import annotations

import re
from pathlib import Path

from literl.multiturn.testbed_chat import build_chat_tokenizer
from literl.multiturn import ChatFormat
from literl.tools import tool_schema
from tests.multiturn.scripted import ScriptedEngine

DOC = Path(__file__).resolve().parents[2] / "docs" / "multiturn.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def block_with(text):
    (block,) = [b for b in BLOCKS if text in b]
    return block


def test_the_tool_example_has_the_schema_the_guide_describes():
    namespace = {}
    exec(block_with("def lookup"), namespace)
    schema = tool_schema(namespace["lookup"])["function"]
    assert schema["parameters"]["required"] == ["word"]
    assert schema["parameters"]["properties"]["limit"] == {"type": "integer", "description": "how many senses to return"}


def test_the_sandbox_wrapper_example_is_a_working_tool():
    namespace = {}
    exec(block_with("PythonSandbox(SandboxLimits"), namespace)
    assert namespace["python"]("print(2 + 2)") == "4\n"
    assert tool_schema(namespace["python"])["function"]["name"] == "python"


def test_the_settings_example_runs_with_a_scripted_engine():
    tokenizer = build_chat_tokenizer()
    question = "What is 6*7?"
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    engine = ScriptedEngine(ChatFormat(tokenizer, "qwen3"), {question: [call, "\\boxed{42}<|im_end|>"]})
    namespace = {"tokenizer": tokenizer, "generate": engine, "problems": [{"problem": question}],
                 "run_episodes": __import__("literl.multiturn", fromlist=["run_episodes"]).run_episodes}
    exec(block_with("build_episode_setup("), namespace)
    (trajectory,) = namespace["trajectories"]
    assert trajectory.end_reason == "answer" and trajectory.messages[2]["content"] == "42"


def test_the_episode_example_runs_with_a_scripted_engine():
    tokenizer = build_chat_tokenizer()
    question = "What is 6*7?"
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    engine = ScriptedEngine(ChatFormat(tokenizer, "qwen3"), {question: [call, "\\boxed{42}<|im_end|>"]})
    namespace = {"tokenizer": tokenizer, "generate": engine, "problems": [{"problem": question}]}
    exec(block_with("runner = ToolRunner("), namespace)
    (trajectory,) = namespace["trajectories"]
    assert trajectory.end_reason == "answer" and trajectory.messages[2]["content"] == "42"
