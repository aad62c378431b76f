"""A damaged testbed in the cache is found on load and repaired, never trained silently (issue 31.3).

Before: noise written over one weight of the cached `base` testbed (same size) trained at accuracy 0.000 with exit
0; a truncated weights file ended in a raw safetensors traceback; a missing tokenizer.json in a misleading
sentencepiece message. Every file of a cached folder is now checked against the sha256 its manifest records (the
shipped manifest for a folder installed from it), and a damaged folder is reinstalled or rebuilt with a warning
naming it.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from literl.testbed import cache as cache_module
from literl.testbed.build import read_manifest
from literl.testbed.cache import PREBUILT_DIR, TestbedCacheError, TestbedCacheWarning, ensure_testbed
from literl.testbed.recipes import BASE, MICRO

SHIPPED = PREBUILT_DIR / BASE.folder_name()


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _noise_over_one_weight(folder) -> None:
    """The probe's damage: one tensor replaced by noise of the same shape, so the file keeps its size."""
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    size = path.stat().st_size
    weights["model.embed_tokens.weight"] = torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, str(path), metadata={"format": "pt"})
    assert path.stat().st_size == size


def _truncate(folder) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100_000])


def _remove_tokenizer(folder) -> None:
    (folder / "tokenizer.json").unlink()


@pytest.fixture
def installed_base(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "build_testbed", _fail_if_built)
    return ensure_testbed("base", cache_dir=tmp_path, progress=False)


def _fail_if_built(*args, **kwargs):
    raise AssertionError("the shipped testbed was built instead of reinstalled")


@pytest.mark.parametrize("damage,what", [(_noise_over_one_weight, "model.safetensors does not match"),
                                         (_truncate, "model.safetensors does not match"),
                                         (_remove_tokenizer, "tokenizer.json is missing")])
def test_a_damaged_cached_testbed_is_reinstalled_with_a_warning_naming_it(installed_base, damage, what):
    damage(installed_base)
    with pytest.warns(TestbedCacheWarning, match=f"{installed_base}.*{what}"):
        again = ensure_testbed("base", cache_dir=installed_base.parent.parent, progress=False)
    assert again == installed_base
    for item in SHIPPED.iterdir():
        if item.name != "manifest.json":
            assert _sha256(again / item.name) == _sha256(item), item.name


def test_an_intact_folder_is_used_as_it_is(installed_base, recwarn):
    stamp = (installed_base / "model.safetensors").stat().st_mtime_ns
    assert ensure_testbed("base", cache_dir=installed_base.parent.parent, progress=False) == installed_base
    assert (installed_base / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [w for w in recwarn if issubclass(w.category, TestbedCacheWarning)]


def test_a_folder_cached_before_hashes_were_recorded_is_checked_against_the_shipped_manifest(installed_base):
    """Caches filled by earlier literl versions have manifests without `files`: a shipped variant's folder is
    checked against the shipped manifest's hashes."""
    manifest = read_manifest(installed_base)
    del manifest["files"]
    (installed_base / "manifest.json").write_text(json.dumps(manifest))
    _noise_over_one_weight(installed_base)
    with pytest.warns(TestbedCacheWarning, match="does not match"):
        ensure_testbed("base", cache_dir=installed_base.parent.parent, progress=False)
    assert _sha256(installed_base / "model.safetensors") == _sha256(SHIPPED / "model.safetensors")


def test_a_built_variant_records_its_hashes_and_is_rebuilt_when_damaged(tmp_path):
    """micro is not shipped: its build records the hashes, and a damaged folder is rebuilt (seconds), bitwise the
    same (same recipe, torch and thread count)."""
    folder = ensure_testbed("micro", cache_dir=tmp_path, progress=False)
    recorded = read_manifest(folder)["files"]
    assert set(recorded) >= {"model.safetensors", "config.json", "tokenizer.json"}
    assert recorded["model.safetensors"] == _sha256(folder / "model.safetensors")
    _noise_over_one_weight(folder)
    with pytest.warns(TestbedCacheWarning, match=f"{folder}.*rebuilding"):
        ensure_testbed(MICRO, cache_dir=tmp_path, progress=False)
    assert _sha256(folder / "model.safetensors") == recorded["model.safetensors"]


def test_a_damaged_folder_in_a_read_only_cache_is_an_error_naming_it(installed_base, monkeypatch):
    _truncate(installed_base)
    monkeypatch.setattr(cache_module, "_writable_testbeds_folder", _read_only)
    with pytest.raises(TestbedCacheError, match=f"{installed_base} is damaged.*model.safetensors.*Delete that folder"):
        ensure_testbed("base", cache_dir=installed_base.parent.parent, progress=False)


def _read_only(root):
    raise TestbedCacheError(f"cannot write the literl testbed cache at {root / 'testbeds'} (Read-only file system)")


def test_an_unreadable_manifest_names_the_folder_and_is_repaired(installed_base):
    (installed_base / "manifest.json").write_bytes(b"\x00{not json")
    with pytest.warns(TestbedCacheWarning, match=f"{installed_base}.*manifest.json cannot be read"):
        ensure_testbed("base", cache_dir=installed_base.parent.parent, progress=False)
    assert read_manifest(installed_base)["recipe_hash"] == BASE.recipe_hash()


def test_a_folder_without_recorded_hashes_that_cannot_load_names_the_folder(tmp_path, monkeypatch):
    """A folder built by an earlier literl records no hashes; if it cannot load (here: no tokenizer.json, which
    was a misleading sentencepiece message), the error names the folder and the fix."""
    from literl.config.load import load_config
    from literl.assembly.model_loading import load_policy

    folder = tmp_path / "testbeds" / BASE.folder_name()
    shutil.copytree(SHIPPED, folder)
    manifest = read_manifest(folder)
    del manifest["files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _remove_tokenizer(folder)
    monkeypatch.setenv("LITERL_CACHE_DIR", str(tmp_path))
    with pytest.raises(TestbedCacheError, match=f"{folder} cannot be loaded.*Delete that folder"):
        load_policy(load_config(overrides=["trainer.progress=false"]))
