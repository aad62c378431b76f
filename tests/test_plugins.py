"""Custom tricks reach the command line: --import, the `imports` key and the `literl.plugins` entry point.

The worked example is the code block of docs/custom-tricks.md itself, so the documentation cannot drift.
Commands that register a trick run in a subprocess, which keeps this process's registries as shipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import literl
from literl.cli import main
from literl.algorithm.tricks import ADVANTAGES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "custom-tricks.md"
LENGTH_REWARD = '''

def length_reward(response, example):
    """Varies within groups even for a random model, so the advantage is not 0 everywhere."""
    return float(len(response) % 3 == 0)
'''


def documented_module() -> str:
    return re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)


def _literl(*args: str, cwd: Path, env_path: Path | None = None) -> subprocess.CompletedProcess:
    """`literl ...` as a user runs it: the console script when installed (its sys.path lacks the current folder)."""
    script = Path(sys.executable).parent / "literl"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "literl.cli"]
    paths = [str(env_path)] if env_path else []
    if not script.exists():     # not installed (e.g. a bare GPU image): literl from its checkout, never from `cwd`
        paths.append(str(Path(literl.__file__).resolve().parents[1]))
    # The caller's absolute entries stay (a GPU image's carried packages, e.g. /tmp/site); relative ones would put
    # `cwd` on the path.
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_documented_advantage_matches_its_hand_computation(monkeypatch):
    """Rewards [1, 0, 0, 0 | 1, 1]: group 0 mean 0.25 -> signs [+, -, -, -]; group 7 is all-equal -> 0.
    scale 0.5 -> [0.5, -0.5, -0.5, -0.5, 0, 0] on the masked tokens, 0 on padding."""
    monkeypatch.setattr(ADVANTAGES, "_entries", dict(ADVANTAGES._entries))    # registered only for this test
    namespace: dict = {}
    exec(compile(documented_module(), str(DOC), "exec"), namespace)
    fn = ADVANTAGES.get("sign_of_centered")
    mask_BT = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0], [1, 1], [1, 1]], dtype=torch.bool)
    adv_BT = fn(torch.tensor([1.0, 0, 0, 0, 1, 1]), torch.tensor([0, 0, 0, 0, 7, 7]), mask_BT,
                torch.zeros(6, 2), scale=0.5)
    expected = torch.tensor([[0.5, 0.5], [-0.5, 0], [-0.5, -0.5], [0, 0], [0, 0], [0, 0]])
    torch.testing.assert_close(adv_BT, expected)


def test_an_unregistered_trick_fails_at_once_and_says_how_to_import_it(tmp_path, capsys):
    assert main(["train", "algorithm.advantage.name=sign_of_centered", f"trainer.output_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "unknown advantage 'sign_of_centered'" in err and "--import MODULE" in err
    assert not (tmp_path / "r").exists()


def test_literl_train_uses_a_trick_from_an_imported_module(tmp_path, tiny_qwen3_dir):
    """scale=0 makes every advantage 0, so with AdamW (no weight decay) the weights cannot move: the run trained
    with the custom function, whose parameter came from the command line (a built-in advantage with this reward
    changes them: tests/training/test_trainer.py)."""
    (tmp_path / "my_tricks.py").write_text(documented_module() + LENGTH_REWARD)
    out = tmp_path / "run"
    result = _literl("train", "--import", "my_tricks", "algorithm.advantage.name=sign_of_centered",
                     "algorithm.advantage.params.scale=0.0", "reward.fns=[{fn: 'my_tricks:length_reward'}]",
                     f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}", "model.profile=testbed",
                     "trainer.steps=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
                     "rollout.max_new_tokens=12", "eval.before=false", "eval.benchmarks=[]", "optim.lr=1e-2",
                     "trainer.progress=false", "data.size=16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "imports:\n- my_tricks" in (out / "config.yaml").read_text()
    before = load_file(str(tiny_qwen3_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_config_explain_and_ablate_see_imported_and_installed_tricks(tmp_path):
    (tmp_path / "my_tricks.py").write_text(documented_module())
    explained = _literl("config", "--explain", "--import", "my_tricks.py", cwd=tmp_path)
    assert explained.returncode == 0, explained.stderr
    assert "sign_of_centered(scale=1.0)" in explained.stdout

    spec = tmp_path / "spec.yaml"
    spec.write_text("preset: lite_ppo\nbaseline: mine\nseeds: 1\nvariants:\n"
                    "  mine: {algorithm.advantage.name: sign_of_centered}\n  grpo: {algorithm.advantage.name: grpo}\n")
    plan = _literl("ablate", str(spec), "--import", "my_tricks", "--dry-run", "--out", str(tmp_path / "abl"),
                   cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count('imports=["my_tricks"]') == 2      # every run imports it in its own process

    # An installed package's entry point: a dist-info folder on the path, no --import.
    site = tmp_path / "site"
    (site / "my_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "my_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (site / "my_plugin-0.1.dist-info" / "entry_points.txt").write_text("[literl.plugins]\nmine = my_plugin_tricks\n")
    (site / "my_plugin_tricks.py").write_text(documented_module())
    installed = _literl("config", "--explain", cwd=ROOT, env_path=site)
    assert installed.returncode == 0, installed.stderr
    assert "sign_of_centered(scale=1.0)" in installed.stdout


@pytest.mark.parametrize("name", ["no_such_module_xyz", "missing.py"])
def test_an_import_that_fails_names_the_module(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--import", name]) == 2
    assert name.removesuffix(".py") in capsys.readouterr().err
