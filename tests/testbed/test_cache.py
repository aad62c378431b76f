"""The testbed cache, on the micro variant (seconds): Hugging Face folders, reuse, rebuilds, locking."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from literl.testbed import cache as cache_module
from literl.testbed.build import read_manifest
from literl.testbed.cache import TestbedCacheError, cache_root, ensure_testbed
from literl.testbed.recipes import MICRO, recipe_for


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    started = time.monotonic()
    folder = ensure_testbed("micro", cache_dir=root, progress=False)
    return folder, time.monotonic() - started


def test_micro_builds_in_seconds_into_a_named_folder(micro_dir):
    folder, seconds = micro_dir
    # a few seconds on an idle laptop; generous because the test machine is shared
    assert seconds < 60
    assert folder.name == MICRO.folder_name() and folder.name.startswith("micro-")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "manifest.json", "generation_config.json"):
        assert (folder / name).is_file(), name


def test_micro_loads_with_auto_classes_and_generates(micro_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _ = micro_dir
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.bos_token_id) == (0, 1, 2)
    assert model.config.vocab_size == len(tokenizer) == 100
    # a class name transformers 4 (and vLLM on it) can resolve too
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    prompt = tokenizer("What is 3+4?\n", add_special_tokens=False)["input_ids"]
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
    out = engine.generate([prompt, prompt], SamplingParams(max_new_tokens=8), rng=torch.Generator().manual_seed(0))
    assert out.response_ids_BT.shape[0] == 2 and out.mask_BT[:, 0].all()


def test_manifest_records_recipe_seed_time_and_measurements(micro_dir):
    folder, _ = micro_dir
    manifest = read_manifest(folder)
    assert manifest["recipe"] == MICRO.to_dict()
    assert manifest["recipe_hash"] == MICRO.recipe_hash()
    assert manifest["seed_used"] == MICRO.seed
    assert manifest["build_seconds"] > 0
    assert manifest["num_parameters"] > 0
    heldout = manifest["heldout"]
    for key in ("sampled_accuracy", "greedy_accuracy", "mean_token_entropy"):
        assert key in heldout
    assert heldout["num_problems"] == MICRO.measure.heldout_problems
    assert manifest["prompt_format"]["eos_token_id"] == 1


def test_second_call_reuses_the_folder_without_building(micro_dir, monkeypatch):
    folder, _ = micro_dir
    monkeypatch.setattr(cache_module, "build_testbed", _fail_if_called)
    assert ensure_testbed("micro", cache_dir=folder.parent.parent, progress=False) == folder


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the cached testbed was rebuilt")


def test_a_changed_recipe_builds_a_new_folder(micro_dir):
    folder, _ = micro_dir
    changed = dataclasses.replace(MICRO, seed=1)
    assert changed.recipe_hash() != MICRO.recipe_hash()
    other = ensure_testbed(changed, cache_dir=folder.parent.parent, progress=False)
    assert other != folder and other.parent == folder.parent
    assert read_manifest(other)["seed_used"] == 1
    assert (folder / "manifest.json").is_file(), "the old build is left alone"


def test_every_recipe_field_feeds_the_hash():
    base = recipe_for("base")
    variations = [
        dataclasses.replace(base, warmup=dataclasses.replace(base.warmup, lr=1e-3)),
        dataclasses.replace(base, shape=dataclasses.replace(base.shape, num_layers=3)),
        dataclasses.replace(base, measure=dataclasses.replace(base.measure, heldout_problems=100)),
        dataclasses.replace(base, num_threads=1),
    ]
    hashes = {base.recipe_hash()} | {v.recipe_hash() for v in variations}
    assert len(hashes) == 1 + len(variations)


def test_same_recipe_gives_identical_weights(micro_dir, tmp_path):
    folder, _ = micro_dir
    again = ensure_testbed("micro", cache_dir=tmp_path, progress=False)
    first, second = load_file(folder / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    """Two threads ask at once: the first builds (slowly), the second waits on the lock, then reuses it."""
    builds = []
    real_build = cache_module.build_testbed

    def slow_build(*args, **kwargs):
        builds.append(threading.get_ident())
        time.sleep(1.0)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(cache_module, "build_testbed", slow_build)
    results = [None, None]

    def ask(slot):
        results[slot] = ensure_testbed("micro", cache_dir=tmp_path, progress=False)

    threads = [threading.Thread(target=ask, args=(slot,)) for slot in (0, 1)]
    threads[0].start()
    time.sleep(0.3)
    threads[1].start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(builds) == 1
    assert results[0] == results[1] and results[0] is not None


def test_failed_build_leaves_no_folder_and_releases_the_lock(tmp_path, monkeypatch):
    def broken_build(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cache_module, "build_testbed", broken_build)
    with pytest.raises(RuntimeError, match="boom"):
        ensure_testbed("micro", cache_dir=tmp_path, progress=False)
    testbeds = tmp_path / "testbeds"
    assert [p.name for p in testbeds.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    assert (ensure_testbed("micro", cache_dir=tmp_path, progress=False) / "manifest.json").is_file()


def test_unwritable_cache_gives_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(TestbedCacheError, match="LITERL_CACHE_DIR"):
        ensure_testbed("micro", cache_dir=blocker / "cache", progress=False)


def test_cache_root_follows_the_documented_order(monkeypatch, tmp_path):
    monkeypatch.setenv("LITERL_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("LITERL_CACHE_DIR")
    assert cache_root() == tmp_path / "xdg" / "literl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "literl"


def test_unknown_variant_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="aligned.*base.*micro"):
        ensure_testbed("huge", cache_dir=tmp_path, progress=False)
