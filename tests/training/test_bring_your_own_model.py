"""The issue's whole path at once, as a user types it: a Hugging Face model folder (a tiny Qwen3 with a chat template),
`literl train --model PATH --data math_train` on the shared MATH data with the real-model profile, a system prompt,
a TRL-style reward function and LoRA."""

from __future__ import annotations

import json

import pytest

from literl.cli import main
from literl.config.load import from_yaml_file
from literl.data.prompts import INSTRUCTION
from literl.run.metrics_log import read_metrics
from tests.conftest import build_tiny_qwen3

pytest.importorskip("peft")

CHAT_TEMPLATE = ("{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
                 "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TRL_REWARD = '''
def boxed(prompts, completions, answer, **kwargs):
    """TRL's conversational format under a chat template: completions[i][0]["content"] (plain strings would fail)."""
    return [float("\\\\boxed{" + a + "}" in c[0]["content"]) + 0.01 * len(c[0]["content"]) for c, a in zip(completions, answer)]
'''


def test_train_a_hugging_face_model_on_math_with_a_trl_reward_and_lora(tmp_path, char_tokenizer, shared_data,
                                                                        monkeypatch):
    model_dir = tmp_path / "my-model"
    build_tiny_qwen3(max_position_embeddings=2048).save_pretrained(model_dir)
    char_tokenizer.init_kwargs.pop("literl_prompt_template")      # an ordinary tokenizer: its chat template decides
    char_tokenizer.chat_template = CHAT_TEMPLATE
    char_tokenizer.save_pretrained(model_dir)
    (tmp_path / "my_rewards.py").write_text(TRL_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code = main(["train", "--model", str(model_dir), "--data", "math_train", "--data-dir", str(shared_data),
                 "reward.fns=[{fn: 'my_rewards:boxed'}]", "model.lora.rank=2", "algorithm.kl_coef=0.01",
                 "data.chat_template_kwargs={enable_thinking: false}", "data.limit=8", "trainer.steps=1",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
                 "eval.limit=1", "eval.samples=1", "eval.greedy=false", "eval.before=false",
                 "trainer.progress=false", f"trainer.output_dir={out}"])
    assert code == 0
    cfg = from_yaml_file(out / "config.yaml")
    assert cfg.model.profile == "real" and cfg.data.system_prompt == INSTRUCTION
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k, cfg.optim.lr) == (0.99, 0.99, 100, 1e-6)
    assert cfg.eval.benchmarks == ["math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"]
    (metrics,) = read_metrics(out)
    assert metrics["reward/boxed/errors"] == 0.0 and metrics["reward/boxed/mean"] > 0, "scored by the TRL function, in the conversational format: the chat template was used"
    evaluation = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert {"math500/accuracy", "olympiadbench/accuracy"} <= set(evaluation[-1])
    assert (out / "final" / "config.json").is_file() and (out / "final" / "adapter" / "adapter_config.json").is_file()


def test_the_chat_prompt_carries_the_system_prompt_and_template_arguments(char_tokenizer):
    """What the run above sends the model for a MATH problem: system prompt, problem, thinking off."""
    from literl.data.prompts import render_prompt_text

    char_tokenizer.chat_template = CHAT_TEMPLATE
    text = render_prompt_text("Find x.", char_tokenizer, "chat", system_prompt=INSTRUCTION,
                              chat_template_kwargs={"enable_thinking": False})
    assert text == f"<nothink><|system|>{INSTRUCTION}\n<|user|>Find x.\n<|assistant|>"
