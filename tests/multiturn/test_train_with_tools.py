"""`literl train` with rollout.tools=[literl.tools:calculator], end to end on a tiny Qwen3 over the testbed chat
tokenizer (2 steps, a few seconds): the multi-turn collector is chosen from the config, episodes call the tool,
observations reach the batch as context, and the `multiturn/...` metrics land in metrics.jsonl."""

from __future__ import annotations

import json

import torch

from literl.cli import main
from literl.multiturn.testbed_chat import build_chat_tokenizer
from tests.conftest import build_tiny_qwen3

IM_END, TOOL_CALL, TOOL_CALL_END = 101, 102, 103
FAST = ["trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=96",
        "rollout.max_turns=3", "rollout.max_tool_response_tokens=40", "eval.before=false", "eval.every=0",
        "eval.benchmarks=[]", "trainer.progress=false", "data.size=16", "optim.lr=1e-3", "seed=0"]


def tool_happy_qwen3(tokenizer):
    """A tiny random Qwen3 that writes <tool_call> and </tool_call> (~15% each) and <|im_end|> (~10%) at any point:
    residual dimension 0 is 1 for every token and no layer writes to it, and only those three rows of the head read
    it, so their logits are ~3 above the rest whatever the context. Its calls are malformed (random text between the
    tags): each is answered with an error observation, as a real beginner's are."""
    model = build_tiny_qwen3(seed=4, vocab_size=len(tokenizer), max_position_embeddings=2048,
                             tie_word_embeddings=False, eos_token_id=IM_END)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[[TOOL_CALL, TOOL_CALL_END, IM_END], 0] = torch.tensor([0.58, 0.58, 0.51])
    return model


def test_two_steps_of_literl_train_with_the_calculator_log_the_multiturn_metrics(tmp_path):
    """Each step's four trajectories end for exactly one reason each (the end_<reason> counts sum to 4); over the two
    steps the model calls the tool, every call is malformed (tool_error_frac 1), the error observations are context
    (observation_token_frac > 0), and the trained-token counts stay the sampled ones."""
    tokenizer = build_chat_tokenizer("hermes_tools")
    model_dir = tmp_path / "tool-qwen3"
    tool_happy_qwen3(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "run"
    assert main(["train", f"model.path={model_dir}", f"trainer.output_dir={out}",
                 "rollout.tools=[literl.tools:calculator]", *FAST]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "multiturn/turns_mean" in s]
    assert len(steps) == 2
    ends = ("answer", "eos", "max_turns", "length", "tool_failure")
    for step in steps:
        assert sum(step[f"multiturn/end_{reason}"] for reason in ends) == 4
        assert 1 <= step["multiturn/turns_mean"] <= 3
        for key in ("tool_timeout_frac", "void_turn_frac", "observation_token_frac"):
            assert 0 <= step[f"multiturn/{key}"] <= 1
    assert max(s["multiturn/tool_calls_mean"] for s in steps) > 0
    assert all(s["multiturn/tool_error_frac"] == 1.0 for s in steps if s["multiturn/tool_calls_mean"] > 0)
    assert max(s["multiturn/observation_token_frac"] for s in steps) > 0


def length_reward(response: str, example: dict) -> float:
    """Rewards that differ within groups for a random model (so every step updates): the response text's length
    mod 3 is 0. The text includes the observations, so they move the reward too."""
    return float(len(response) % 3 == 0)


def test_a_multiturn_run_resumed_from_its_checkpoint_equals_the_run_straight_through(tmp_path):
    """Two steps straight vs one step, saved, then resumed to two: the same metrics (timing aside), the
    multiturn ones included, and bit-identical parameters. The collector's state is the prompt stream's position,
    and the episodes draw from the run's generator only, so a resumed run repeats the episodes."""
    from safetensors.torch import load_file

    from literl.assembly.api import train
    from literl.config.load import load_config
    from literl.run.metrics_log import read_metrics

    tokenizer = build_chat_tokenizer("hermes_tools")
    model_dir = tmp_path / "tool-qwen3"
    tool_happy_qwen3(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    common = [f"model.path={model_dir}", "rollout.tools=[literl.tools:calculator]", *FAST, "trainer.save_every=1"]

    def run(folder, *extra):
        return train(load_config(preset="grpo", overrides=[*common, f"trainer.output_dir={tmp_path / folder}",
                                                           *extra]), reward_fns=[length_reward])

    straight = run("a", "trainer.steps=2")
    run("b", "trainer.steps=1")
    resumed = run("b", "trainer.steps=2", "trainer.resume=true")
    timing = ("time/", "throughput/")
    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(timing)} for r in read_metrics(run_dir)]

    assert comparable(straight) == comparable(resumed)
    assert comparable(straight)[-1]["optim/grad_norm"] > 0         # the resumed step is a real update
    a, b = load_file(str(next((straight / "final").glob("*.safetensors")))), \
        load_file(str(next((resumed / "final").glob("*.safetensors"))))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
