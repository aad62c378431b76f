"""The config's value rules are declared on the knobs (`knob(range=..., choices=..., null=..., hint=...)`,
literl/config/schema.py) and `validate` walks the whole tree: every declared range and choice refuses a value
outside it with a message naming the key, the value and the fix; a typo in a declaration fails when the schema is
built; `literl config --explain` shows what each knob takes; and no rule left in validate compares a trick's name to
a string (those are declared where the trick registers)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from literl.config.errors import ConfigError
from literl.config.load import explain, load_config
from literl.config.schema import KNOB_RANGES, Config, TrickSpec, _parse_knob_ranges, knob

ROOT = Path(__file__).resolve().parents[1]


def _declared(node=None, prefix: str = ""):
    """(key, field, value) of every knob of the default tree; a list's dataclass items as key.0.field."""
    node = Config() if node is None else node
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if isinstance(value, TrickSpec):
            continue
        if dataclasses.is_dataclass(value):
            yield from _declared(value, f"{key}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            yield from _declared(value[0], f"{key}.0.")
        else:
            yield key, f, (type(node), f.name)


def _outside(op: str, bound: float, is_int: bool) -> float:
    """A value just outside `op bound`: >= 1 -> 0 (an int knob) or 0.5; > 0 -> 0; <= 1 -> 2 or 1.5; < 1 -> 1."""
    step = 1 if is_int else 0.5
    return {">=": bound - step, ">": bound, "<=": bound + step, "<": bound}[op]


RANGE_CASES = [(key, op, bound, "int" in str(f.type) and "float" not in str(f.type))
               for key, f, where in _declared() for op, bound in KNOB_RANGES.get(where, ())
               if not isinstance(bound, str)]
CHOICE_CASES = [(key, isinstance(f.default_factory(), list) if f.default_factory is not dataclasses.MISSING
                 else False) for key, f, _ in _declared() if f.metadata.get("choices")]


def test_the_walk_covers_the_knobs_of_every_section():
    """The cases below come from the declarations: at least one per section that has rules, 50 numeric bounds and
    the 20 enumerations (the 16 of the old CHOICES table, vllm.weight_sync, reward fn convention, trainer.trackers,
    micro_batch_tokens' auto)."""
    assert len(RANGE_CASES) >= 50 and len(CHOICE_CASES) == 20
    sections = {key.rsplit(".", 1)[0] for key, *_ in RANGE_CASES}
    assert {"rollout", "rollout.vllm", "reward", "algorithm", "optim", "trainer", "eval", "cluster",
            "model.lora", "data"} <= sections


@pytest.mark.parametrize("key, op, bound, is_int", RANGE_CASES, ids=[f"{c[0]}{c[1]}{c[2]:g}" for c in RANGE_CASES])
def test_every_declared_bound_refuses_a_value_just_outside_it(key, op, bound, is_int):
    value = _outside(op, bound, is_int)
    value = int(value) if is_int else value
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}={re.escape(repr(value if is_int else float(value)))}"
                                          rf" must be "):
        load_config(overrides=[f"{key}={value}"])


@pytest.mark.parametrize("key, is_list", CHOICE_CASES, ids=[c[0] for c in CHOICE_CASES])
def test_every_declared_choice_refuses_another_string(key, is_list):
    override = f"{key}=[no_such_choice]" if is_list else f"{key}=no_such_choice"
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}.*'no_such_choice'.*(is not one of|must be)"):
        load_config(overrides=[override])


def test_the_messages_name_the_other_key_its_value_the_null_meaning_and_the_hint():
    """minibatches' bound names rollout.prompts_per_step (8 here); step_timeout_s' names its sibling timeout_s
    (5.0 by default); top_p's two numeric bounds read as an interval; the fix hints come from the declarations."""
    cases = {
        ("trainer.minibatches=64", "rollout.prompts_per_step=8"):
            "trainer.minibatches=64 must be >= 1 and <= rollout.prompts_per_step=8 (mini-batches hold whole groups)",
        ("reward.step_timeout_s=1",):
            "reward.step_timeout_s=1.0 must be >= reward.timeout_s=5.0 (the step's budget holds at least one full "
            "check)",
        ("rollout.top_p=1.5",):
            "rollout.top_p=1.5 must be in (0, 1], or null for the profile's (1.0 disables nucleus sampling)",
        ("optim.max_grad_norm=-1",): "optim.max_grad_norm=-1.0 must be >= 0 (0 disables clipping)",
        ("model.lora.dropout=1",): "model.lora.dropout=1.0 must be in [0, 1)",
        ("trainer.micro_batch_tokens=0",):
            "trainer.micro_batch_tokens=0 must be >= 1, or auto (16384 on CPU, sized from free GPU memory on CUDA)",
        ("trainer.trackers=[mlflow]",): "trainer.trackers holds 'mlflow', which is not one of: tensorboard, wandb",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_config(overrides=list(overrides))
        assert str(caught.value) == message
    # The documented 'off' and null values stay valid, and a choice inside a range knob too.
    load_config(overrides=["trainer.minibatches=8", "rollout.prompts_per_step=8", "reward.step_timeout_s=5",
                           "rollout.top_p=1.0", "optim.max_grad_norm=0", "trainer.micro_batch_tokens=auto",
                           "trainer.micro_batch_tokens=1", "trainer.trackers=[wandb]", "rollout.top_p=null"])


def test_a_typo_in_a_knob_declaration_fails_when_the_schema_is_built():
    """An operand must be a number, a key of the same section or a full key; an operator one of < <= > >=."""

    @dataclasses.dataclass
    class Section:
        low: float = knob(0.0, "low end", range=">= 0")
        high: float = knob(1.0, "high end", range="> low and <= 10")

    @dataclasses.dataclass
    class Typo:
        low: float = knob(0.0, "low end")
        high: float = knob(1.0, "high end", range="> lwo")

    @dataclasses.dataclass
    class BadOperator:
        x: int = knob(1, "x", range="=> 0")

    assert _parse_knob_ranges(Section()) == {(Section, "low"): [(">=", 0.0)],
                                             (Section, "high"): [(">", "low"), ("<=", 10.0)]}
    with pytest.raises(ValueError, match="high: range operand 'lwo' is neither a number nor a parameter"):
        _parse_knob_ranges(Typo())
    with pytest.raises(ValueError, match="x: bad range clause '=> 0'"):
        _parse_knob_ranges(BadOperator())


def test_explain_shows_each_knobs_range_and_choices():
    text = explain()
    assert re.search(r"^  optim\.max_grad_norm = 1\.0    # .*  \[valid: >= 0\]$", text, re.M)
    assert re.search(r"^  model\.dtype = 'float32'    # .*  \[valid: float32, bfloat16\]$", text, re.M)
    assert re.search(r"^  rollout\.top_p = None    # .*  \[valid: > 0 and <= 1, or null\]$", text, re.M)
    assert re.search(r"^  trainer\.micro_batch_tokens = 'auto'    # .*  \[valid: auto, or a number >= 1\]$", text,
                     re.M)
    assert re.search(r"^  trainer\.minibatches = 1    # .*  \[valid: >= 1 and <= rollout\.prompts_per_step\]$",
                     text, re.M)
    assert not re.search(r"^  data\.size = 20000    # .*\[valid", text, re.M)      # no rule declared


def test_no_rule_in_validate_compares_a_trick_name_to_a_string():
    """Trick compatibility lives on the trick's registration; rules.py compares no string that names a trick."""
    from literl.algorithm.tricks import ALL

    trick_names = {name for registry in ALL.values() for name in registry.names()}
    tree = ast.parse((ROOT / "literl/config/rules.py").read_text())
    compared = {node.value for compare in ast.walk(tree) if isinstance(compare, ast.Compare)
                for node in ast.walk(compare) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert compared and not compared & trick_names, compared & trick_names
