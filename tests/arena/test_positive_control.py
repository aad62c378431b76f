"""The shipped positive control runs in the shipped specs' setting and differs from its baseline only in a
learning rate ten times the testbed's tuned one (its result is in results/findings/positive_control.md)."""

from __future__ import annotations

import pytest

from literl.arena.spec import check_configs, load_spec
from literl.config.load import TESTBED_LR, load_config


def test_the_positive_control_has_the_shipped_budget_and_a_tenfold_learning_rate():
    control, shipped = load_spec("positive_control"), load_spec("advantage_norm")
    assert control.base == shipped.base and control.preset == shipped.preset and control.seeds == [0, 1, 2]
    assert set(check_configs(control)) == {("lr_tuned", "default"), ("lr_x10", "default")}
    (tuned,) = [v for v in control.variants if v.name == control.baseline]
    (x10,) = [v for v in control.variants if v.name != control.baseline]
    lr = {arm.name: load_config(preset=control.preset, overrides=[*control.base, *arm.overrides]).optim.lr
          for arm in (tuned, x10)}
    assert lr["lr_tuned"] == pytest.approx(TESTBED_LR) and lr["lr_x10"] == pytest.approx(10 * TESTBED_LR)
