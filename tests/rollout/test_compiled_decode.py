"""`rollout.compile=true` on the fixed-shape route: compiled once, whatever the batch size, the prompt width, the
response length or the column (the column is a device tensor: nothing about it reaches a guard), its compile time
kept and printed once; the same tokens as the eager step. Both forms are checked on CPU: one graph of the whole
step (CPU's), and one graph of a layer serving every layer (CUDA's, `compiled.compiles_layer_by_layer`: its compile
time does not grow with depth), here forced on CPU."""

from __future__ import annotations

import pytest
import torch

from literl.model.compiled import compile_for_varying_sizes, compile_seconds
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3
from tests.rollout.test_engine import MANY_EOS, PAD, _prompts

# Batches of 6, 9, 1 and 7 rows, prompt widths 9, 9, 5 and 20, response lengths 24, 40, 12 and 30: every size
# a graph could specialise on changes from one generation to the next.
GENERATIONS = [(_prompts(seed=9) * 2, 24), (_prompts(seed=10) * 3, 40), (_prompts(seed=9)[:1], 12),
               (_prompts(seed=11, groups=((20, 2), (3, 5))), 30)]


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _compare_with_eager(model, compiled_engine):
    """Every generation: the compiled engine's tokens and log-probs against the eager fixed step's; returns the
    dynamo graph count after the first generation and after the last."""
    eager_engine = NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, decode="fixed")
    counts = []
    for seed, (prompts, T) in enumerate(GENERATIONS):
        params = SamplingParams(max_new_tokens=T, temperature=0.9, top_k=40)
        compiled = compiled_engine.generate(prompts, params, rng=torch.Generator().manual_seed(seed))
        eager = eager_engine.generate(prompts, params, rng=torch.Generator().manual_seed(seed))
        assert torch.equal(compiled.response_ids_BT, eager.response_ids_BT)
        torch.testing.assert_close(compiled.rollout_logp_BT, eager.rollout_logp_BT, rtol=0, atol=1e-5)
        counts.append(_graphs())
    return counts[0], counts[-1]


def test_the_compiled_fixed_step_compiles_once_for_every_size_and_length():
    model = build_tiny_qwen3(seed=9)
    first, last = _compare_with_eager(model, NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, decode="fixed",
                                                      compile=True))
    assert first == last, "a later generation recompiled"
    assert compile_seconds()["the fixed-shape decode step"] > 0


def test_one_compiled_layer_serves_every_layer_of_the_fixed_step_and_the_prompts(monkeypatch):
    """CUDA's form: a four-layer model compiles one graph of a decode layer and one of a prompt layer."""
    monkeypatch.setattr("literl.rollout.native_engine.compiles_layer_by_layer", lambda device_type: True)
    monkeypatch.setattr("literl.model.prompt_pass.compiles_layer_by_layer", lambda device_type: True)
    model = build_tiny_qwen3(seed=9, num_hidden_layers=4)
    before = _graphs()
    first, last = _compare_with_eager(model, NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, decode="fixed",
                                                      compile=True))
    assert first == last and last - before <= 2, "one graph per kind of layer, none per layer"
    assert {"a fixed-shape decode layer", "a prompt layer"} <= set(compile_seconds())


def test_the_compile_time_is_printed_once(capsys):
    def double(x):
        return 2 * x

    twice = compile_for_varying_sizes(double, name="a test function", eager_when=lambda x: x.shape[0] < 2)
    assert torch.equal(twice(torch.ones(3)), torch.full((3,), 2.0))
    assert torch.equal(twice(torch.ones(5)), torch.full((5,), 2.0))
    printed = capsys.readouterr().err
    assert printed.count("[literl] compiled a test function in ") == 1
    assert compile_seconds()["a test function"] > 0


@pytest.mark.slow
def test_a_compiled_training_run_compiles_everything_in_its_first_step(tiny_qwen3_dir, tmp_path):
    """`trainer.compile=true rollout.compile=true`: after one step has compiled every graph (the decode step, the
    prompts' pass, the update's layers), three more steps from another seed, whose responses and length buckets
    differ, compile nothing. ~3 min on one shared CPU thread: `python -m pytest -m slow
    tests/rollout/test_compiled_decode.py`."""
    from literl.config.load import load_config
    from literl.assembly.api import train
    from literl.run.metrics_log import read_metrics
    from tests.training.test_trainer import length_reward

    def run(name, steps, seed):
        cfg = load_config(preset="grpo", overrides=[
            f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={tmp_path / name}", f"trainer.steps={steps}",
            f"seed={seed}", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
            "eval.every=0", "eval.before=false", "trainer.progress=false", "optim.lr=1e-3", "trainer.compile=true",
            "rollout.compile=true", "rollout.decode=fixed"])
        return read_metrics(train(cfg, reward_fns=[length_reward]))

    first = run("first", 1, seed=0)
    compiled = _graphs()
    later = run("later", 3, seed=1)
    assert _graphs() == compiled, "a later step recompiled"
    lengths = {round(record["response_length/mean"], 3) for record in first + later}
    assert len(lengths) > 2, "the steps' responses must differ in length"
