"""The run record: config.yaml replays a CLI run exactly; run.json says what a Python-API run was given that a
config cannot name, and `literl train --config` refuses to pretend otherwise (literl/run/manifest.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from literl.cli import main
from literl.config.load import from_yaml_file, load_config
from literl.rewards.math_answer import math_accuracy
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from literl.run.manifest import importable_path, problems_hash, replay_problem
from tests.training.test_trainer import TINY, _comparable, length_reward

PROBLEMS = [{"problem": f"{a}+{a}=", "answer": str(2 * a)} for a in range(8)]


def test_a_cli_run_rerun_from_its_own_config_gives_identical_metrics(tiny_qwen3_dir, tmp_path, capsys):
    """The second run is told nothing but the first run's config.yaml and a new directory."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", "--preset", "dr_grpo", f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={first}",
                 *TINY, "seed=3", "rollout.temperature=0.9"]) == 0
    assert main(["train", "--config", str(first / "config.yaml"), f"trainer.output_dir={second}"]) == 0
    assert _comparable(read_metrics(second)) == _comparable(read_metrics(first))
    assert read_metrics(second, "eval.jsonl") == read_metrics(first, "eval.jsonl")
    record = json.loads((first / "run.json").read_text())
    assert record["replayable"] is True and record["not_replayable"] == []


def test_run_json_records_provenance(tiny_qwen3_dir, tmp_path):
    import torch

    run_dir = train(load_config(preset="lite_ppo", overrides=[f"model.path={tiny_qwen3_dir}",
                                                              f"trainer.output_dir={tmp_path / 'r'}", *TINY,
                                                              "trainer.threads=1"]))
    session = json.loads((run_dir / "run.json").read_text())["sessions"][0]
    prov = session["provenance"]
    assert prov["packages"]["torch"] and prov["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert prov["packages"]["transformers"]
    assert "vllm" in prov["packages"]                        # None when it is not installed
    assert prov["machine"]["torch_threads"] == 1 and prov["machine"]["cpus_available"] >= 1
    assert prov["machine"]["cpus"] >= prov["machine"]["cpus_available"]
    assert prov["command"]["argv"] and prov["command"]["cwd"]
    assert session["engine"] == {"name": "native"}            # in-process: the packages above are its versions
    git = prov["literl"]["git"]
    head = subprocess.run(["git", "-C", prov["literl"]["path"], "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:                                  # running from a checkout
        assert git["commit"] == head.stdout.strip() and isinstance(git["dirty"], bool)
    else:
        assert git is None


def test_a_python_api_run_with_objects_says_what_it_cannot_replay(tiny_qwen3, char_tokenizer, tmp_path, capsys):
    cfg = load_config(preset="lite_ppo", overrides=[f"trainer.output_dir={tmp_path / 'api'}", *TINY])
    run_dir = train(cfg, model=tiny_qwen3, tokenizer=char_tokenizer, problems=PROBLEMS,
                    reward_fns=[(lambda response, example: 0.0, 1.0)])
    record = json.loads((run_dir / "run.json").read_text())
    assert record["replayable"] is False
    missing = {m["input"]: m for m in record["not_replayable"]}
    assert set(missing) == {"model", "problems", "reward_fns"}
    assert "Qwen3ForCausalLM object" in missing["model"]["what"] and missing["model"]["key"] == "model.path"
    assert "8 problems" in missing["problems"]["what"] and missing["problems"]["key"] == "data.train"
    inputs = record["sessions"][0]["inputs"]
    assert inputs["problems"]["count"] == 8 and inputs["problems"]["sha256"] == problems_hash(PROBLEMS)
    assert inputs["model"]["parameters"] == sum(p.numel() for p in tiny_qwen3.parameters())
    assert inputs["tokenizer"]["vocab_size"] == len(char_tokenizer)
    assert inputs["reward_fns"][0]["importable"] is False and "<lambda>" in inputs["reward_fns"][0]["fn"]
    config_text = (run_dir / "config.yaml").read_text()
    assert config_text.startswith("# NOT REPLAYABLE") and "model.path=..." in config_text
    assert from_yaml_file(run_dir / "config.yaml").model.path is None     # still loadable as a config

    # Training from it would train the testbed on the testbed's data: refused, nothing created.
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / "config.yaml"), f"trainer.output_dir={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert "cannot be replayed" in err and "model.path=..." in err and "data.train=..." in err
    assert not (tmp_path / "x").exists()
    # ... and so is resuming it from the command line, which would load the same config.
    assert main(["train", f"trainer.output_dir={run_dir}", "trainer.resume=true", "trainer.steps=3"]) == 2


def test_naming_the_missing_keys_lets_the_config_train(tiny_qwen3_dir, tiny_qwen3, char_tokenizer, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    cfg = load_config(preset="lite_ppo", overrides=[f"trainer.output_dir={tmp_path / 'api'}", *TINY])
    run_dir = train(cfg, model=tiny_qwen3, tokenizer=char_tokenizer, problems=PROBLEMS)
    config = run_dir / "config.yaml"
    assert replay_problem(config, ["model.path"]) is not None          # data.train still missing
    assert replay_problem(config, ["model.path", "data.train"]) is None
    assert main(["train", "--config", str(config), f"trainer.output_dir={tmp_path / 'again'}",
                 f"model.path={tiny_qwen3_dir}", f"data.train={data}"]) == 0


def test_inputs_given_by_name_are_written_into_the_config(tiny_qwen3_dir, tmp_path):
    """A model directory, a problems file and an importable reward function are what the config's keys hold,
    so the run stays replayable."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    cfg = load_config(preset="lite_ppo", overrides=[f"trainer.output_dir={tmp_path / 'named'}", *TINY])
    run_dir = train(cfg, model=str(tiny_qwen3_dir), problems=str(data),
                    reward_fns=[(length_reward, 0.5, "literl"), math_accuracy])
    saved = from_yaml_file(run_dir / "config.yaml")
    assert saved.model.path == str(tiny_qwen3_dir) and saved.data.train == str(data)
    assert [(f.fn, f.weight, f.convention) for f in saved.reward.fns] == [
        ("tests.training.test_trainer:length_reward", 0.5, "literl"),
        ("literl.rewards.math_answer:math_accuracy", 1.0, "auto")]
    assert json.loads((run_dir / "run.json").read_text())["replayable"] is True


def test_importable_path_only_for_functions_that_import_back():
    assert importable_path(length_reward) == "tests.training.test_trainer:length_reward"
    assert importable_path(lambda r, e: 0.0) is None

    def closure(response, example):
        return 0.0
    assert importable_path(closure) is None


def test_a_resumed_run_adds_a_session(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "run"
    base = [f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}", *TINY, "trainer.save_every=1"]
    assert main(["train", *base, "trainer.steps=1"]) == 0
    assert main(["train", f"trainer.output_dir={out}", "trainer.resume=true", "trainer.steps=2"]) == 0
    record = json.loads((out / "run.json").read_text())
    assert [s["resume"] for s in record["sessions"]] == [False, True] and record["replayable"] is True


@pytest.mark.parametrize("name", ["config.yaml"])
def test_a_config_without_run_json_beside_it_is_a_plain_config(tmp_path, name):
    path = Path(tmp_path / name)
    path.write_text("seed: 1\n")
    assert replay_problem(path, []) is None
