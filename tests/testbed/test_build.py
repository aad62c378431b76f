"""The build pieces on micro-sized models (seconds): SFT masking and schedule, measurement, the accuracy
gate, and the aligned path."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from literl.testbed.build import TestbedBuildError, build_testbed, read_manifest
from literl.testbed.cache import ensure_testbed
from literl.testbed.measure import measure_policy
from literl.testbed.model import ModelShape, build_model
from literl.testbed.progress import BuildProgress
from literl.testbed.recipes import MICRO, AccuracyGate
from literl.testbed.tasks import heldout_problems
from literl.testbed.tokenizer import build_char_tokenizer
from literl.testbed.warmup import SFTPhase, encode_examples, learning_rate

TINY_PHASE = SFTPhase(steps=2, lr=1e-3, slip_rate=0.2, batch_size=8, warmup_steps=1)


def test_loss_mask_covers_exactly_the_solution_and_eos():
    """"What is 1+2?\\n" is 13 prompt tokens; the targets scored are "1+2=3\\n\\boxed{3}" then EOS."""
    tokenizer = build_char_tokenizer()
    record = {"problem": "What is 1+2?\n", "solution": "1+2=3\n\\boxed{3}"}
    batch = encode_examples(tokenizer, [record, {"problem": "What is 1?\n", "solution": "\\boxed{1}"}])
    targets = batch.input_ids_BT[0, 1:][batch.loss_mask_BT[0]].tolist()
    assert tokenizer.decode(targets[:-1]) == record["solution"]
    assert targets[-1] == tokenizer.eos_token_id
    assert int(batch.loss_mask_BT[0].sum()) == len(record["solution"]) + 1
    assert not batch.loss_mask_BT[0, :12].any(), "no prompt token is a target"
    # the shorter row is right-padded and its padding is neither attended nor scored
    assert batch.attention_BT[1].sum() == len("What is 1?\n") + len("\\boxed{1}") + 1
    assert int(batch.loss_mask_BT[1].sum()) == len("\\boxed{1}") + 1


def test_learning_rate_warms_up_then_follows_a_cosine_to_the_floor():
    """lr 1, warm-up 10 of 110 steps, floor 0.1: step 0 -> 0.1, step 9 -> 1, step 60 (half-way) -> 0.55,
    step 110 and later -> 0.1."""
    phase = SFTPhase(steps=110, lr=1.0, slip_rate=0.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, phase) == pytest.approx(0.1)
    assert learning_rate(9, phase) == pytest.approx(1.0)
    assert learning_rate(60, phase) == pytest.approx(0.55)
    assert learning_rate(110, phase) == pytest.approx(0.1)
    assert learning_rate(500, phase) == pytest.approx(0.1)


def test_measure_policy_on_a_uniform_model_has_entropy_log_vocab():
    """Zero embeddings make every logit 0, so each next-token distribution is uniform over 100 ids:
    entropy ln(100) = 4.605 nats; random characters never box the right integer."""
    tokenizer = build_char_tokenizer()
    model = build_model(ModelShape(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, ffn_size=16),
                        tokenizer, seed=0)
    with torch.no_grad():
        model.get_input_embeddings().weight.zero_()
    result = measure_policy(model, tokenizer, heldout_problems(4), samples_per_problem=2, max_new_tokens=8)
    assert result.mean_token_entropy == pytest.approx(math.log(100), abs=1e-4)
    assert result.sampled_accuracy == 0.0 and result.greedy_accuracy == 0.0
    assert result.num_problems == 4 and result.samples_per_problem == 2


def test_a_gate_that_cannot_be_met_fails_with_every_attempt_listed(tmp_path):
    impossible = dataclasses.replace(MICRO, gate=AccuracyGate(low=0.99, high=1.0, extension=TINY_PHASE,
                                                               max_extensions=1, max_seed_retries=1))
    with pytest.raises(TestbedBuildError, match="after 2 seeds") as error:
        build_testbed(impossible, tmp_path, progress=BuildProgress("t", enabled=False))
    message = str(error.value)
    assert '"seed": 0' in message and '"seed": 1000' in message, "a retry uses a new seed"
    assert message.count('"label": "extra warm-up 1"') == 2, "each seed got its extension"


def test_a_gate_that_is_met_keeps_the_first_seed(tmp_path):
    lenient = dataclasses.replace(MICRO, gate=AccuracyGate(low=0.0, high=1.0, extension=TINY_PHASE))
    manifest = build_testbed(lenient, tmp_path, progress=BuildProgress("t", enabled=False))
    assert manifest["seed_used"] == MICRO.seed
    assert [c["label"] for c in manifest["checks"]] == ["warm-up"]
    assert read_manifest(tmp_path) == manifest


def test_an_aligned_recipe_builds_on_its_cached_base(tmp_path):
    aligned = dataclasses.replace(MICRO, variant="micro-aligned", alignment=TINY_PHASE)
    folder = ensure_testbed(aligned, cache_dir=tmp_path, progress=False)
    base_folder = tmp_path / "testbeds" / aligned.base_recipe().folder_name()
    assert read_manifest(base_folder)["recipe"]["alignment"] is None
    manifest = read_manifest(folder)
    assert manifest["base"]["folder"] == base_folder.name
    assert [c["label"] for c in manifest["checks"]] == ["alignment"]
    with pytest.raises(ValueError, match="base_dir"):
        build_testbed(aligned, tmp_path / "unused", progress=BuildProgress("t", enabled=False))
