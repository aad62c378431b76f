"""Slow (minutes): the real base warm-up lands in RL's useful range for several seeds, and alignment
lowers entropy. Run with `pytest -m slow tests/testbed`."""

from __future__ import annotations

import dataclasses

import pytest

from literl.testbed.build import read_manifest
from literl.testbed.cache import ensure_testbed
from literl.testbed.recipes import ALIGNED, BASE

pytestmark = pytest.mark.slow

USEFUL_SAMPLED_RANGE = (0.20, 0.60)   # below, RL has too little signal; above, too little room


@pytest.fixture(scope="module")
def slow_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("testbed-cache")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_base_warmup_lands_in_the_useful_range(slow_cache, seed):
    folder = ensure_testbed(dataclasses.replace(BASE, seed=seed), cache_dir=slow_cache, progress=False)
    heldout = read_manifest(folder)["heldout"]
    low, high = USEFUL_SAMPLED_RANGE
    assert low <= heldout["sampled_accuracy"] <= high, heldout
    assert heldout["greedy_accuracy"] > heldout["sampled_accuracy"], "sampling slips more than argmax"
    assert heldout["truncated_rate"] < 0.05, "responses end with EOS inside the RL token budget"


def test_aligned_has_lower_entropy_and_higher_accuracy_than_base(slow_cache):
    base = read_manifest(ensure_testbed(BASE, cache_dir=slow_cache, progress=False))["heldout"]
    aligned = read_manifest(ensure_testbed(ALIGNED, cache_dir=slow_cache, progress=False))["heldout"]
    assert aligned["mean_token_entropy"] < base["mean_token_entropy"]
    assert aligned["sampled_accuracy"] > base["sampled_accuracy"]
