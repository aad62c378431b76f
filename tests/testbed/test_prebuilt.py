"""The testbed weights shipped with literl (literl/testbed/prebuilt/): what they are, that their manifest tells the
truth about them, and that a first use installs them instead of building (docs/testbed.md, "Build and cache")."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from literl.testbed import cache as cache_module
from literl.testbed.build import read_manifest
from literl.testbed.cache import PREBUILT_DIR, ensure_testbed, prebuilt_folder
from literl.testbed.measure import measure_policy
from literl.testbed.recipes import BASE, VARIANTS, recipe_for
from literl.testbed.tasks import heldout_problems

SHIPPED = PREBUILT_DIR / BASE.folder_name()


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the testbed was built although its weights are shipped")


def test_the_shipped_folder_is_the_current_base_recipe():
    """The folder is named by the recipe hash and its manifest holds that recipe: editing BASE (or bumping
    CODE_VERSION) without rebuilding and re-shipping fails here rather than silently training stale weights."""
    assert prebuilt_folder(BASE) == SHIPPED
    manifest = read_manifest(SHIPPED)
    assert manifest["recipe"] == BASE.to_dict()
    assert manifest["recipe_hash"] == BASE.recipe_hash()
    assert "installed_from" not in manifest   # the manifest of a real build, as it wrote it


def test_every_shipped_folder_matches_a_current_variant():
    """A stale shipped folder (a recipe that no variant has any more) is dead weight in every clone."""
    current = {recipe.folder_name() for recipe in VARIANTS.values()}
    shipped = {folder.name for folder in PREBUILT_DIR.iterdir() if folder.is_dir()}
    assert shipped and shipped <= current, sorted(shipped - current)


def test_the_shipped_manifest_reports_what_the_shipped_weights_do():
    """Held-out sampled and greedy accuracy measured now, with the manifest's own settings (200 problems ×
    4 samples, seed 0), equal the numbers the build wrote. Bitwise equal weights give equal numbers with
    the same torch build; another CPU's float rounding may flip a few samples, hence the 2-point slack."""
    manifest = read_manifest(SHIPPED)
    heldout = manifest["heldout"]
    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    assert sum(p.numel() for p in model.parameters()) == manifest["num_parameters"]
    measured = measure_policy(model, tokenizer, heldout_problems(heldout["num_problems"]),
                              samples_per_problem=heldout["samples_per_problem"],
                              max_new_tokens=heldout["max_new_tokens"], seed=BASE.measure.sampling_seed)
    assert measured.sampled_accuracy == pytest.approx(heldout["sampled_accuracy"], abs=0.02)
    assert measured.greedy_accuracy == pytest.approx(heldout["greedy_accuracy"], abs=0.02)
    # the band the gate promises RL: room to improve what the model samples
    assert BASE.gate.low <= measured.sampled_accuracy <= BASE.gate.high
    assert measured.greedy_accuracy > measured.sampled_accuracy + 0.2


def test_first_use_installs_the_shipped_weights_without_building(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "build_testbed", _fail_if_called)
    folder = ensure_testbed("base", cache_dir=tmp_path, progress=False)
    assert folder == tmp_path / "testbeds" / BASE.folder_name()
    for item in SHIPPED.iterdir():
        if item.name != "manifest.json":
            assert _sha256(folder / item.name) == _sha256(item), item.name
    manifest = read_manifest(folder)
    assert manifest["installed_from"].startswith("prebuilt")
    assert {k: v for k, v in manifest.items() if k != "installed_from"} == read_manifest(SHIPPED)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]   # no staging folder left
    # and a second use is a plain cache hit
    assert ensure_testbed("base", cache_dir=tmp_path, progress=False) == folder


def test_an_interrupted_install_leaves_no_folder_and_the_next_use_completes_it(tmp_path, monkeypatch):
    """A copy that dies half-way (a full disk, Ctrl-C) must not leave a folder that later loads as a testbed."""
    real_copy = cache_module.shutil.copyfile
    calls = []

    def copy_then_fail(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_copy(src, dst)

    monkeypatch.setattr(cache_module.shutil, "copyfile", copy_then_fail)
    with pytest.raises(OSError, match="No space left"):
        ensure_testbed("base", cache_dir=tmp_path, progress=False)
    testbeds = tmp_path / "testbeds"
    assert [p.name for p in testbeds.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(cache_module.shutil, "copyfile", real_copy)
    folder = ensure_testbed("base", cache_dir=tmp_path, progress=False)
    assert _sha256(folder / "model.safetensors") == _sha256(SHIPPED / "model.safetensors")


def test_prebuilt_false_builds_instead(tmp_path, monkeypatch):
    built = []

    def record_build(recipe, out_dir, **kwargs):
        built.append(recipe.folder_name())
        (out_dir / "manifest.json").write_text(json.dumps({"recipe": recipe.to_dict()}))

    monkeypatch.setattr(cache_module, "build_testbed", record_build)
    folder = ensure_testbed("base", cache_dir=tmp_path, progress=False, prebuilt=False)
    assert built == [BASE.folder_name()] and not (folder / "model.safetensors").exists()


def test_a_changed_recipe_never_gets_the_shipped_weights(tmp_path, monkeypatch):
    """Another seed is another recipe hash: nothing is shipped for it, so it builds."""
    import dataclasses

    other = dataclasses.replace(BASE, seed=7)
    assert prebuilt_folder(other) is None
    monkeypatch.setattr(cache_module, "build_testbed", lambda recipe, out_dir, **kw: (
        (out_dir / "manifest.json").write_text("{}")))
    folder = ensure_testbed(other, cache_dir=tmp_path, progress=False)
    assert folder.name == other.folder_name() and not (folder / "model.safetensors").exists()


def test_the_aligned_variant_builds_on_the_installed_base(tmp_path, monkeypatch):
    """aligned = base + a clean SFT phase: its base comes from the shipped weights, only the alignment runs."""
    aligned = recipe_for("aligned")
    seen = {}

    def record_build(recipe, out_dir, *, progress, base_dir=None):
        seen["base_dir"] = base_dir
        (out_dir / "manifest.json").write_text("{}")

    monkeypatch.setattr(cache_module, "build_testbed", record_build)
    ensure_testbed(aligned, cache_dir=tmp_path, progress=False)
    assert seen["base_dir"] == tmp_path / "testbeds" / BASE.folder_name()
    assert read_manifest(seen["base_dir"])["installed_from"].startswith("prebuilt")


@pytest.mark.slow
def test_building_the_base_recipe_here_gives_the_shipped_weights(tmp_path):
    """The shipped weights are what the recipe builds: bitwise with the torch build and thread count they were
    built with (~5 min on 2 cores), else the same held-out accuracy within a few points (float rounding)."""
    manifest = read_manifest(SHIPPED)
    folder = ensure_testbed("base", cache_dir=tmp_path, progress=False, prebuilt=False)
    assert "installed_from" not in read_manifest(folder)
    if manifest["versions"]["torch"] == torch.__version__ and manifest["torch_threads"] == BASE.num_threads:
        assert _sha256(folder / "model.safetensors") == _sha256(SHIPPED / "model.safetensors")
    else:
        shipped, rebuilt = load_file(SHIPPED / "model.safetensors"), load_file(folder / "model.safetensors")
        assert shipped.keys() == rebuilt.keys()
        assert read_manifest(folder)["heldout"]["sampled_accuracy"] == pytest.approx(
            manifest["heldout"]["sampled_accuracy"], abs=0.05)
