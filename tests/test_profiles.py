"""The testbed and real-model profiles: what `resolve` fills in for the keys left null, and the context cap."""

from __future__ import annotations

import pytest

from literl.cli import main
from literl.config.load import from_yaml_file, load_config, resolve
from literl.data.prompts import INSTRUCTION
from literl.config.profiles import REAL_BENCHMARKS, response_budget, REAL


def _resolved(*overrides, **kwargs):
    notes: list[str] = []
    return resolve(load_config(overrides=list(overrides)), notes=notes, **kwargs), notes


def test_the_testbed_profile_keeps_the_testbed_defaults():
    cfg, notes = _resolved()
    r = cfg.rollout
    assert cfg.model.profile == "testbed" and notes == []
    assert (r.max_new_tokens, r.temperature, r.top_p, r.top_k) == (64, 1.0, 1.0, 0)
    assert cfg.optim.lr == 5e-5 and cfg.eval.benchmarks == ["testbed"] and cfg.data.system_prompt == ""


def test_a_hugging_face_model_gets_the_seed_studys_setup(tmp_path):
    """algorithms.md §8.1: temperature 0.99, top-p 0.99, top-k 100, lr 1e-6, the six benchmarks, its system prompt,
    8192-token responses (a 32768-position model has room for them after a 1024-token prompt)."""
    cfg, notes = _resolved("model.path=/models/qwen3", f"data.dir={tmp_path}", model_context=32768)
    r = cfg.rollout
    assert cfg.model.profile == "real" and notes == []
    assert (r.max_new_tokens, r.temperature, r.top_p, r.top_k) == (8192, 0.99, 0.99, 100)
    assert cfg.optim.lr == 1e-6 and cfg.data.system_prompt == INSTRUCTION
    assert cfg.eval.benchmarks == list(REAL_BENCHMARKS) == ["math500", "aime24", "aime25", "amc23", "minerva",
                                                             "olympiadbench"]
    assert cfg.eval.temperature == 0.99 and cfg.eval.max_new_tokens == 8192
    assert resolve(load_config(), external_model=True).model.profile == "real", "a model passed to literl.train"


@pytest.mark.parametrize("context,expected", [(32768, 8192), (9216, 8192), (4096, 3072), (2048, 1024), (512, 256)])
def test_the_response_length_is_capped_to_fit_the_models_context(context, expected):
    """The prompt keeps min(1024, C/2) positions: 4096 - 1024 = 3072; 2048 - 1024 = 1024; 512 - 256 = 256."""
    tokens, note = response_budget(REAL, context)
    assert tokens == expected
    assert (note is None) == (expected == 8192)
    if note:
        assert f"rollout.max_new_tokens={expected}" in note and f"{context} positions" in note


def test_the_context_is_read_from_the_model_directory_and_an_explicit_length_wins(tiny_qwen3_dir, monkeypatch):
    """The tiny model has 256 positions: 128 for the prompt, 128 for the response."""
    monkeypatch.delenv("LITERL_DATA_DIR", raising=False)
    cfg, notes = _resolved(f"model.path={tiny_qwen3_dir}")
    assert cfg.rollout.max_new_tokens == 128 and "256 positions" in notes[0]
    assert cfg.eval.benchmarks == [] and "no held-out evaluation" in notes[1], "no data dir: nothing to evaluate on"
    explicit, notes = _resolved(f"model.path={tiny_qwen3_dir}", "rollout.max_new_tokens=40", "rollout.temperature=1.0",
                                "eval.benchmarks=[testbed]")
    assert (explicit.rollout.max_new_tokens, explicit.rollout.temperature, explicit.eval.benchmarks) == (
        40, 1.0, ["testbed"]) and notes == []


def test_the_profile_can_be_chosen(tiny_qwen3_dir):
    assert _resolved(f"model.path={tiny_qwen3_dir}", "model.profile=testbed")[0].rollout.max_new_tokens == 64
    assert _resolved("model.profile=real")[0].rollout.top_k == 100
    with pytest.raises(Exception, match="model.profile='huge' is not one of: auto, testbed, real"):
        load_config(overrides=["model.profile=huge"])


def test_train_takes_model_data_and_data_dir_flags(tiny_qwen3_dir, tmp_path, capsys, shared_data):
    assert main(["train", "--model", str(tiny_qwen3_dir), "--data", "math_train", "--data-dir", str(shared_data),
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "c.yaml").write_text(printed)
    cfg = from_yaml_file(tmp_path / "c.yaml")
    assert cfg.model.path == str(tiny_qwen3_dir) and cfg.model.profile == "real"
    assert cfg.data.train == "math_train" and cfg.data.dir == str(shared_data)
    assert cfg.rollout.max_new_tokens == 128 and cfg.eval.benchmarks == list(REAL_BENCHMARKS)


def test_the_context_of_a_model_object_or_folder(tiny_qwen3_dir, tmp_path):
    """literl.train(cfg, model=...) passes a module or a folder: both tell their 256 positions."""
    from literl.config.profiles import model_context
    from tests.conftest import build_tiny_qwen3

    assert model_context(build_tiny_qwen3()) == 256 == model_context(tiny_qwen3_dir) == model_context(str(tiny_qwen3_dir))
    assert model_context(None) is None and model_context(tmp_path) is None, "no config.json: unknown, no cap"
