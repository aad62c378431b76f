"""The contract every registered trick obeys: a hand-computed test, a documented formula with references (its
docstring cites its section of docs/algorithms.md, which documents the trick's formula, parameters, paper and edge
cases), and finite values and gradients on the edge cases (group of one, zero std, empty response, fully masked)."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from literl.algorithm.metric_reduction import scalars
from literl.algorithm.tricks import ALL

HERE = Path(__file__).resolve().parent
ALGORITHMS_MD = HERE.parents[1] / "docs" / "algorithms.md"
TEST_FILE = {
    "advantage": "test_advantages.py", "policy_loss": "test_policy_losses.py", "aggregation": "test_aggregation.py",
    "kl": "test_kl.py", "is_correction": "test_is_correction.py", "loss_mask": "test_loss_masks.py",
    "policy_mask": "test_policy_masks.py", "reward_shaping": "test_reward_shaping.py",
    "group_filter": "test_group_filters.py",
}
CONTEXT = {"max_new_tokens": 8}  # run constants some entries take from the build context
REQUIRED = {"delta": 0.1}        # a value for each parameter that has no default (OPSM's δ)
ENTRIES = [(axis, name) for axis, registry in ALL.items() for name in registry.names()]


def hand_cases(axis):
    path = HERE / TEST_FILE[axis]
    spec = importlib.util.spec_from_file_location(f"_contract_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HAND_CASES


def test_every_axis_has_a_test_file():
    assert set(TEST_FILE) == set(ALL)


@pytest.mark.parametrize("axis", sorted(ALL))
def test_every_name_has_a_hand_case(axis):
    cases = hand_cases(axis)
    missing = set(ALL[axis].names()) - set(cases)
    assert not missing, f"{axis}: no HAND_CASES entry for {sorted(missing)} in tests/tricks/{TEST_FILE[axis]}"
    assert set(cases) <= set(ALL[axis].names()), f"{axis}: HAND_CASES names an unregistered trick"
    assert all(callable(fn) and fn.__name__.startswith("test_") for fn in cases.values())


@pytest.mark.parametrize("axis,name", ENTRIES)
def test_docstring_has_summary_formula_and_refs(axis, name):
    doc = ALL[axis].get(name).__doc__ or ""
    lines = [line.strip() for line in doc.strip().splitlines()]
    assert lines and lines[0], f"{axis}.{name}: no one-line summary"
    assert any("=" in line for line in lines[1:]), f"{axis}.{name}: no formula line"
    refs = re.search(r"^\s*Refs:(.*)", doc, re.M | re.S)
    assert refs, f"{axis}.{name}: no 'Refs:' line"
    cited = re.findall(r"algorithms\.md §(\d+(?:\.\d+)*)", refs.group(1))
    assert cited, f"{axis}.{name}: Refs must cite its section of docs/algorithms.md ('algorithms.md §N')"
    reference = ALGORITHMS_MD.read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{1,6} (\d+(?:\.\d+)*)\.? ", reference, re.M))
    assert set(cited) <= headings, f"{axis}.{name}: docs/algorithms.md has no section {sorted(set(cited) - headings)}"
    assert f"`{name}`" in reference, f"{axis}.{name}: docs/algorithms.md does not document it (as `{name}`)"


# ---- edge cases: every entry, four scenarios ---------------------------------------------------------------

def scenario(kind):
    """(rewards_B, group_B, mask_BT) for the four edge cases, T = 4."""
    full = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    if kind == "group_of_one":
        return [1.0, 1.0, 0.0, 1.0], [5, 9, 9, 9], full
    if kind == "zero_std":
        return [1.0, 1.0, 1.0, 1.0], [0, 0, 1, 1], full
    if kind == "empty_response":
        return [1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    return [1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [[0] * 4] * 4


def finite(*values):
    for v in values:
        if isinstance(v, dict):
            finite_metrics(v)
        elif torch.is_tensor(v) and v.is_floating_point():
            assert torch.isfinite(v).all(), v


def finite_metrics(metrics):
    """Finite, except a max (min) over no token, which is −inf (+inf): the identity the accumulator skips.
    What gets logged (the accumulated floats) is finite either way."""
    for key, value in metrics.items():
        if key.endswith("_BT"):
            continue
        empty = {"_max": -math.inf, "_min": math.inf}.get(key[-4:])
        assert math.isfinite(float(value)) or float(value) == empty, (key, value)
    assert all(math.isfinite(v) for v in scalars({k: v for k, v in metrics.items() if not k.endswith("_BT")}).values())


def run_axis(axis, fn, rewards_B, group_B, mask_BT):
    g = torch.Generator().manual_seed(0)
    B, T = mask_BT.shape
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    rollout = old + 0.3 * torch.randn(B, T, generator=g)
    if axis == "advantage":
        adv = fn(rewards_B, group_B, mask_BT, torch.zeros(B, T))
        assert adv.dtype == torch.float32 and adv.shape == (B, T) and (adv[~mask_BT] == 0).all()
        return [adv]
    if axis == "policy_loss":
        adv = torch.where(mask_BT, torch.randn(B, 1, generator=g).expand(B, T), torch.zeros(()))
        loss, metrics = fn(logp, old, rollout, adv, mask_BT)
        assert loss.shape == (B, T) and (loss[~mask_BT] == 0).all()
        return [loss, metrics, torch.autograd.grad(loss.sum(), logp)[0]]
    if axis == "aggregation":
        num, den = fn(mask_BT, group_B)
        return [num, den, num / den.clamp(min=1)]
    if axis == "kl":
        kl = fn(logp, old)
        return [kl, torch.autograd.grad(kl.sum(), logp)[0]]
    if axis == "is_correction":
        weight, keep, metrics = fn(old, rollout, mask_BT)
        assert not (keep & ~mask_BT).any()
        return [weight, metrics]
    if axis == "policy_mask":
        adv = torch.where(mask_BT, torch.randn(B, 1, generator=g).expand(B, T), torch.zeros(()))
        entropy = torch.rand(B, T, generator=g)
        gate, metrics = fn(logp, old, rollout, adv, mask_BT, entropy)
        assert gate.shape == (B, T) and (gate[~mask_BT] == 0).all() and not gate.requires_grad
        return [gate, metrics]
    if axis == "loss_mask":
        keep = fn(mask_BT, torch.tensor([True, False, False, True]))
        assert keep.dtype == torch.bool and not (keep & ~mask_BT).any()
        return []
    if axis == "reward_shaping":
        return [fn(rewards_B, mask_BT.sum(-1), torch.zeros(B, dtype=torch.bool))]
    keep = fn(rewards_B > 0.5, rewards_B, group_B)
    assert keep.dtype == torch.bool and keep.shape == (B,)
    return []


@pytest.mark.filterwarnings("ignore:advantages")
@pytest.mark.parametrize("kind", ["group_of_one", "zero_std", "empty_response", "fully_masked"])
@pytest.mark.parametrize("axis,name", ENTRIES)
def test_edge_cases_are_finite(axis, name, kind):
    rewards, groups, mask = scenario(kind)
    fn = ALL[axis].build(name, {k: REQUIRED[k] for k in ALL[axis].required_of(name)}, context=CONTEXT)
    outputs = run_axis(axis, fn, torch.tensor(rewards), torch.tensor(groups), torch.tensor(mask, dtype=torch.bool))
    finite(*outputs)
