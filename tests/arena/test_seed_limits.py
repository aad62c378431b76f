"""Seeds are bounded where they are read (issue 59, R7 and R8): a seed outside int64 passed validation and failed
later with "Overflow when unpacking long long"; `seeds: 30000000` in a spec made `literl ablate --dry-run` print
nothing for 60 s while it grew to 2.3 GB."""

from __future__ import annotations

import sys
import time

import pytest
import yaml

from literl.arena.spec import MAX_SEEDS, parse_seed_list, parse_spec
from literl.cli import main
from literl.config.load import load_config
from literl.config.schema import MAX_SEED
from literl.config.errors import ConfigError
from literl.rollout.collector import PromptStream

MINIMAL = {"preset": "lite_ppo", "baseline": "a", "seeds": 2,
           "variants": {"a": {"algorithm.advantage.name": "grpo"}, "b": {"algorithm.advantage.name": "dr_grpo"}}}


@pytest.mark.parametrize("seed", [99999999999999999999, 2**32, -1])
def test_a_seed_outside_32_bits_is_refused_at_load_with_the_range(seed):
    with pytest.raises(ConfigError, match=rf"seed={seed} must be in \[0, 4294967295\]"):
        load_config(overrides=[f"seed={seed}"])


def test_literl_config_refuses_the_seed_in_one_line(capsys):
    assert main(["config", "seed=99999999999999999999"]) == 2
    err = capsys.readouterr().err
    assert "seed=99999999999999999999 must be in [0, 4294967295]" in err and "Traceback" not in err


def test_the_largest_seed_orders_the_data_without_overflow():
    """seed · 1,000,003 + epoch is about 4.3e15 at the largest seed: within int64, so every epoch's order is a
    permutation of the problems (10 problems, 3 passes)."""
    stream = PromptStream(10, seed=MAX_SEED)
    order = stream.take(30)
    assert [sorted(order[i:i + 10]) for i in (0, 10, 20)] == [list(range(10))] * 3


def test_a_spec_with_thirty_million_seeds_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"'seeds' asks for 30000000 seeds, above the limit of {MAX_SEEDS}"):
        parse_spec({**MINIMAL, "seeds": 30_000_000}, source="huge.yaml")
    assert time.monotonic() - start < 1.0, "refused before any list of seeds is built"


def test_a_seed_list_too_long_or_with_a_seed_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="asks for 1001 seeds, above the limit"):
        parse_spec({**MINIMAL, "seeds": list(range(1001))}, source="long.yaml")
    with pytest.raises(ConfigError, match=r"seed 4294967296 is outside 0..4294967295"):
        parse_spec({**MINIMAL, "seeds": [0, 2**32]}, source="big.yaml")


@pytest.mark.parametrize("text, message", [("0-30000000", "asks for 30000001 seeds, above the limit"),
                                           ("0,99999999999999999999", "seed 99999999999999999999 is outside")])
def test_command_line_seed_ranges_are_bounded_too(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_seed_list(text)


def test_ablate_dry_run_of_a_huge_seed_count_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**MINIMAL, "seeds": 30_000_000}))
    assert main(["ablate", str(spec), "--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "above the limit of 1000" in err and "Traceback" not in err
