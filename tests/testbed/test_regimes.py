"""The testbed regimes of the seed studies (docs/testbed.md, "Regimes"): the long tier, recipes that continue a
built variant, MoE routers with shrunk margins, and the folder names of the existing variants left as they were."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from literl.testbed import ensure_testbed, read_manifest
from literl.testbed.build import flatten_routers
from literl.testbed.recipes import (LONG, LONG_ALIGNED, MICRO, MOE, MOE_FLAT, VARIANTS, MeasureSettings,
                                    TestbedRecipe, recipe_for)
from literl.testbed.tasks import TIERS, heldout_problems, train_problems
from literl.testbed.warmup import SFTPhase

TINY_PHASE = SFTPhase(steps=3, lr=1e-3, slip_rate=0.0, batch_size=4, warmup_steps=1)


def test_the_existing_variants_keep_their_folders():
    """New recipe fields enter the hash only when set: the shipped base weights and every cached aligned, moe and
    micro folder (and the measurements made on them) stay valid."""
    assert {name: VARIANTS[name].folder_name() for name in ("base", "aligned", "micro", "moe")} == {
        "base": "base-21a54a34f58b", "aligned": "aligned-0853c5463de4", "micro": "micro-bc03e0fbbde0",
        "moe": "moe-342941ae1eb7"}


def test_the_new_fields_feed_the_hash_when_set():
    base = recipe_for("base")
    variations = [dataclasses.replace(base, parent=MICRO), dataclasses.replace(MOE, router_scale=0.5),
                  dataclasses.replace(base, measure=dataclasses.replace(base.measure, tier="long"))]
    hashes = {base.recipe_hash(), MOE.recipe_hash()} | {v.recipe_hash() for v in variations}
    assert len(hashes) == 2 + len(variations)
    assert LONG_ALIGNED.to_dict()["parent"] == LONG.to_dict(), "a parent is hashed by its whole recipe"


def test_the_long_tier_spans_one_to_twelve_operations_and_7x_in_length():
    records = train_problems(1200, tier="long", seed=3)
    assert {r["num_ops"] for r in records} == set(range(1, 13))
    lengths = [len(r["solution"]) + 1 for r in records]          # + EOS: the response the model writes
    assert max(lengths) / min(lengths) >= 6
    assert statistics.pstdev(lengths) / statistics.mean(lengths) > 0.4, "mixed is ~0.3"
    mixed = [len(r["solution"]) + 1 for r in train_problems(1200, tier="mixed", seed=3)]
    assert statistics.pstdev(mixed) / statistics.mean(mixed) < 0.35


def test_the_long_tier_labels_its_difficulty_in_buckets_of_three_operations():
    spec = TIERS["long"]
    assert [spec.difficulty(k) for k in (1, 3, 4, 9, 10, 12)] == [
        "1-3_ops", "1-3_ops", "4-6_ops", "7-9_ops", "10-12_ops", "10-12_ops"]
    assert TIERS["mixed"].difficulty(3) == "3_ops"
    assert {r["difficulty"] for r in heldout_problems(200, tier="long")} == {
        "1-3_ops", "4-6_ops", "7-9_ops", "10-12_ops"}


def test_the_long_tier_held_out_split_is_a_benchmark():
    from literl.data.problems import load_problems

    rows = load_problems("testbed_long")
    assert [r["problem"] for r in rows] == [r["problem"] for r in heldout_problems(200, tier="long")]
    assert [r["problem"] for r in load_problems("testbed")] == [r["problem"] for r in heldout_problems(200)]


def test_a_recipe_continues_its_parent_and_a_chain_builds_in_order(tmp_path):
    """micro → micro_long (long tier, measured on it) → micro_long_clean: each continues the folder before it."""
    first = dataclasses.replace(MICRO, variant="micro_long", parent=MICRO,
                                measure=dataclasses.replace(MICRO.measure, tier="long", max_new_tokens=24),
                                alignment=dataclasses.replace(TINY_PHASE, tier="long", slip_rate=0.1))
    second = dataclasses.replace(first, variant="micro_long_clean", parent=first, alignment=TINY_PHASE)
    folder = ensure_testbed(second, cache_dir=tmp_path, progress=False)
    testbeds = tmp_path / "testbeds"
    assert read_manifest(folder)["base"]["folder"] == first.folder_name()
    assert read_manifest(testbeds / first.folder_name())["base"]["folder"] == MICRO.folder_name()
    assert read_manifest(testbeds / first.folder_name())["recipe"]["measure"]["tier"] == "long"
    assert "tier" not in read_manifest(testbeds / MICRO.folder_name())["recipe"]["measure"]


def test_flattened_routers_keep_every_choice_and_shrink_every_margin():
    from transformers import Qwen3MoeForCausalLM

    from tests.conftest import tiny_qwen3_moe_config

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(tiny_qwen3_moe_config())
    gates = [layer.mlp.gate for layer in model.get_decoder().layers]
    h = torch.randn(64, gates[0].weight.shape[1], generator=torch.Generator().manual_seed(0))
    before = [h @ g.weight.detach().T.clone() for g in gates]
    frozen = flatten_routers(model, 0.125)
    for gate, logits in zip(gates, before):
        after = h @ gate.weight.T
        k = gate.top_k
        assert torch.equal(after.topk(k).indices, logits.topk(k).indices), "the same experts are chosen"
        torch.testing.assert_close(after, logits * 0.125)
    assert all(not p.requires_grad for p in frozen) and len(frozen) == len(gates)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        from tests.conftest import build_tiny_qwen3

        flatten_routers(build_tiny_qwen3(), 0.5)


def test_the_regime_recipes_are_what_docs_testbed_md_says():
    assert LONG.parent == recipe_for("base") and LONG.alignment.tier == "long" and LONG.measure.tier == "long"
    assert LONG.alignment.slip_rate == 0.1 and LONG_ALIGNED.alignment.slip_rate == 0.0
    assert LONG_ALIGNED.parent == LONG and LONG_ALIGNED.base_recipe() == LONG
    assert MOE_FLAT.parent == MOE and MOE_FLAT.router_scale == 1 / 64 and MOE_FLAT.experts is not None
    assert isinstance(LONG.measure, MeasureSettings) and LONG.measure.max_new_tokens == 160
    assert isinstance(MOE_FLAT, TestbedRecipe)


def test_varied_solutions_are_the_canonical_ones_in_equivalent_forms():
    """Same problems, answers and values; only the operand order of + and * and the spacing change."""
    from literl.testbed.tasks import problem_stream

    varied, canonical = problem_stream(split="train", seed=4, style="varied"), problem_stream(split="train", seed=4)
    forms = set()
    for _ in range(300):
        v, c = next(varied), next(canonical)
        assert (v["problem"], v["answer"]) == (c["problem"], c["answer"])
        for line_v, line_c in zip(v["solution"].split("\n"), c["solution"].split("\n")):
            compact = line_v.replace(" ", "")
            if "=" not in line_c:
                assert line_v == line_c          # the boxed answer
                continue
            lhs_v, rhs_v = compact.split("=")
            lhs_c, rhs_c = line_c.split("=")
            assert rhs_v == rhs_c
            op = next(ch for ch in "+-*" if ch in lhs_c[1:])
            a, b = lhs_c.split(op, 1)
            assert lhs_v in ({f"{a}{op}{b}", f"{b}{op}{a}"} if op in "+*" else {f"{a}{op}{b}"})
            forms.add((" " in line_v, lhs_v != lhs_c))
    assert forms == {(False, False), (False, True), (True, False), (True, True)}, "every form occurs"
    with pytest.raises(ValueError, match="solution style"):
        next(problem_stream(split="train", seed=0, style="fancy"))


def test_the_style_field_enters_the_hash_only_when_set():
    from literl.testbed.recipes import ALIGNED, ALIGNED_VARIED

    assert "style" not in ALIGNED.to_dict()["alignment"] and "style" not in ALIGNED.to_dict()["warmup"]
    assert ALIGNED_VARIED.to_dict()["alignment"]["style"] == "varied"
    assert ALIGNED_VARIED.base_recipe() == ALIGNED


def test_looping_solutions_are_the_canonical_ones_with_their_last_step_line_written_again():
    """Same problems, answers and slips; a looping solution is its canonical text with its last step line (the one
    before the boxed answer) repeated r >= 1 times right after itself, in about half of the solutions."""
    from literl.testbed.tasks import problem_stream

    looping = problem_stream(split="train", tier="long", seed=5, slip_rate=0.1, style="end_loop")
    canonical = problem_stream(split="train", tier="long", seed=5, slip_rate=0.1)
    repeats_seen = []
    for _ in range(2000):
        lo, ca = next(looping), next(canonical)
        assert (lo["problem"], lo["answer"]) == (ca["problem"], ca["answer"])
        lines_lo, lines_ca = lo["solution"].split("\n"), ca["solution"].split("\n")
        r = len(lines_lo) - len(lines_ca)
        if r == 0:
            assert lines_lo == lines_ca
            continue
        assert 1 <= r <= 36
        assert lines_lo == lines_ca[:-1] + [lines_ca[-2]] * r + lines_ca[-1:], (lo["solution"], ca["solution"])
        assert lines_lo[-1].startswith("\\boxed{")
        repeats_seen.append(r)
    # LOOP_SOLUTION_RATE 0.5: 1000 expected of 2000, sd 22
    assert 900 <= len(repeats_seen) <= 1100
    # geometric with continuation 0.9, capped at 36: mean (1 - 0.9^36) / 0.1 = 9.78, P(r = 1) = 0.1, P(r >= 12) = 0.9^11
    # = 0.31 (standard errors over ~1000 loops: 0.3, 0.01, 0.015)
    assert 8.8 <= statistics.mean(repeats_seen) <= 10.8
    assert 0.06 <= sum(r == 1 for r in repeats_seen) / len(repeats_seen) <= 0.14
    assert 0.25 <= sum(r >= 12 for r in repeats_seen) / len(repeats_seen) <= 0.37


def test_looping_long_tier_solutions_run_past_a_160_token_budget_and_fit_the_model():
    """Half the solutions loop, and a loop of >= 12 repeats of a ~8-character line carries a ~60-character solution
    past 160 tokens: 0.5 x 0.9^11 = 0.157 of them (measured 0.149 on seed 0); the
    longest example (prompt, solution, EOS) stays within the model's 512 positions."""
    from literl.testbed.model import ModelShape
    from literl.testbed.tasks import problem_stream

    stream = problem_stream(split="train", tier="long", seed=0, slip_rate=0.1, style="end_loop")
    records = [next(stream) for _ in range(4000)]
    over = sum(len(r["solution"]) + 1 > 160 for r in records) / len(records)
    assert 0.12 <= over <= 0.18
    assert max(len(r["problem"]) + len(r["solution"]) + 1 for r in records) <= ModelShape().max_positions


def test_the_long_loopy_recipe_continues_long_with_its_slips_and_loops():
    from literl.testbed.recipes import LONG_LOOPY

    assert LONG_LOOPY.parent == LONG and LONG_LOOPY.base_recipe() == LONG
    assert (LONG_LOOPY.alignment.style, LONG_LOOPY.alignment.tier, LONG_LOOPY.alignment.slip_rate) == (
        "end_loop", "long", LONG.alignment.slip_rate)
    assert LONG_LOOPY.measure.max_new_tokens == 160 and LONG_LOOPY.measure.tier == "long"
    assert LONG_LOOPY.to_dict()["alignment"]["style"] == "end_loop"
    assert len({LONG_LOOPY.recipe_hash(), LONG.recipe_hash(), LONG_ALIGNED.recipe_hash()}) == 3


def test_every_testbed_variant_is_a_choice_of_model_testbed():
    """A recipe added without its config choice could not be selected (and a choice without a recipe would fail
    only at build time)."""
    import dataclasses

    from literl.config.schema import ModelConfig

    testbed = next(f for f in dataclasses.fields(ModelConfig) if f.name == "testbed")
    assert set(testbed.metadata["choices"]) == set(VARIANTS)


def test_skewed_solutions_are_canonical_85_percent_of_the_time_and_otherwise_another_valid_form():
    """Same problems, answers and values as the canonical stream. A + or * line has 3 other forms (swapped, spaced,
    both), a - line 1 (spaced): over N lines the canonical share is 0.85 (sd sqrt(0.85 * 0.15 / N) = 0.006 at
    N ~ 3,500), and each of a + / * line's other forms 0.15 / 3 = 0.05."""
    from literl.testbed.recipes import SKEWED_ALIGNED, VARIED
    from literl.testbed.tasks import problem_stream

    skewed, canonical = problem_stream(split="train", seed=6, style="skewed"), problem_stream(split="train", seed=6)
    forms = {"+*": [], "-": []}
    for _ in range(1500):
        s, c = next(skewed), next(canonical)
        assert (s["problem"], s["answer"]) == (c["problem"], c["answer"])
        for line_s, line_c in zip(s["solution"].split("\n"), c["solution"].split("\n")):
            if "=" not in line_c:
                assert line_s == line_c
                continue
            lhs_c, rhs_c = line_c.split("=")
            op = next(ch for ch in "+-*" if ch in lhs_c[1:])
            a, b = lhs_c.split(op, 1)
            if a == b:
                continue          # a swap does not show
            form = {f"{a}{op}{b}={rhs_c}": "canonical", f"{b}{op}{a}={rhs_c}": "swapped",
                    f"{a} {op} {b} = {rhs_c}": "spaced", f"{b} {op} {a} = {rhs_c}": "both"}.get(line_s)
            assert form is not None, (line_s, line_c)
            if op == "-":
                assert form in ("canonical", "spaced")
            forms["-" if op == "-" else "+*"].append(form)
    lines = forms["+*"] + forms["-"]
    assert abs(lines.count("canonical") / len(lines) - 0.85) < 0.025
    for other in ("swapped", "spaced", "both"):
        assert 0.03 <= forms["+*"].count(other) / len(forms["+*"]) <= 0.07, other
    assert abs(forms["-"].count("spaced") / len(forms["-"]) - 0.15) < 0.04
    assert SKEWED_ALIGNED.parent == VARIED and SKEWED_ALIGNED.alignment.style == "skewed"
    assert SKEWED_ALIGNED.alignment.slip_rate == 0.0


def test_the_varied_stream_is_unchanged_by_the_skewed_style():
    """`varied` and `varied_aligned` are cached by recipe hash, not by their data: their stream must stay as it was
    built (the first solutions of seed 0, written down when the skewed style was added)."""
    from literl.testbed.tasks import problem_stream

    stream = problem_stream(split="train", seed=0, style="varied")
    first = [next(stream)["solution"] for _ in range(3)]
    assert first == ["9+5=14\n\\boxed{14}", "6*3=18\n18 + 53 = 71\n7+71=78\n78+3=81\n\\boxed{81}",
                     "5 - 3 = 2\n2-2=0\n0+6=6\n\\boxed{6}"]


def test_a_checked_solution_writes_every_step_and_its_check_without_slips():
    """Hand case 7*2-1*1: products first (7*2=14, 1*1=1), then 14-1=13, each line followed by its check."""
    from literl.testbed.tasks import checked_solution_text, is_correct

    text = checked_solution_text([7, 2, 1, 1], ["*", "-", "*"])
    assert text == "7*2=14\ncheck 7*2=14\n1*1=1\ncheck 1*1=1\n14-1=13\ncheck 14-1=13\n\\boxed{13}"
    assert is_correct(text, 13)
    with pytest.raises(ValueError, match="leaves 0-99"):
        checked_solution_text([9, 99], ["*"])


def _beside_canonical(style: str, n: int = 2000):
    """The first `n` records of `style`'s stream (train split, seed 3, slips at 0.2), each with the canonical stream's
    record at the same place, after checking that both pose the same problem with the same answer."""
    from literl.testbed.tasks import problem_stream

    styled = problem_stream(split="train", seed=3, slip_rate=0.2, style=style)
    canonical = problem_stream(split="train", seed=3, slip_rate=0.2)
    for _ in range(n):
        record, ca = next(styled), next(canonical)
        assert (record["problem"], record["answer"], record["num_ops"]) == (ca["problem"], ca["answer"], ca["num_ops"])
        yield record, ca


def test_half_the_checked_stream_checks_every_step_and_is_always_right_the_rest_is_canonical():
    """Same problems and answers as the canonical stream; the unchecked solutions are the canonical text with the
    canonical slips, character for character; a checked one alternates step and check lines, each the same step worked
    right, and boxes the true value. CHECKED_SOLUTION_RATE 0.5 over 2000 solutions: sd 0.011. On the mixed tier a
    checked solution is 28-107 tokens (with EOS) and a canonical one 16-46, so a 64-token budget cuts checked
    solutions at 3-4 operations only (all but the shortest) and no canonical one."""
    from literl.testbed.recipes import BASE, CHECKED
    from literl.testbed.tasks import CHECK_PREFIX, _apply

    n_checked, over_64, at_least_3_ops = 0, 0, 0
    for ch, ca in _beside_canonical("checked"):
        if CHECK_PREFIX not in ch["solution"]:
            assert ch["solution"] == ca["solution"] and len(ch["solution"]) + 1 < 64
            continue
        n_checked += 1
        lines = ch["solution"].split("\n")
        assert len(lines) == 2 * ch["num_ops"] + 1 and lines[-1] == f"\\boxed{{{ch['answer']}}}"
        for step, check in zip(lines[:-1:2], lines[1:-1:2]):
            assert check.startswith(CHECK_PREFIX)
            lhs, result = check[len(CHECK_PREFIX):].split("=")
            op = next(c for c in "+-*" if c in lhs[1:])
            left, right = lhs.split(op, 1)
            assert int(result) == _apply(int(left), op, int(right))
            assert step == check[len(CHECK_PREFIX):]
        tokens = len(ch["solution"]) + 1
        assert (tokens >= 64) == (ch["num_ops"] >= 3), ch["solution"]
        over_64 += tokens > 64
        at_least_3_ops += ch["num_ops"] >= 3
    assert 0.46 <= n_checked / 2000 <= 0.54
    assert over_64 / at_least_3_ops > 0.95      # the shortest 3-operation one (all one-digit values) is 64 exactly
    assert CHECKED.parent == BASE and CHECKED.alignment.style == "checked" and CHECKED.alignment.slip_rate == 0.2
    assert CHECKED.measure.max_new_tokens == 128 and CHECKED.to_dict()["alignment"]["style"] == "checked"


def test_a_direct_solution_is_the_boxed_answer_alone():
    """Hand case: the answer 23 is written "\\boxed{23}", nothing before it; it is graded right for 23 only."""
    from literl.testbed.tasks import direct_solution_text, is_correct

    assert direct_solution_text(23) == "\\boxed{23}"
    assert is_correct(direct_solution_text(23), 23) and not is_correct(direct_solution_text(23), 24)
    with pytest.raises(ValueError, match="leaves 0-99"):
        direct_solution_text(100)


def test_half_the_direct_stream_answers_at_once_and_right_the_rest_is_canonical():
    """Same problems and answers as the canonical stream; a direct solution is the true answer boxed (slips never
    reach it), the others are the canonical text with the canonical slips, character for character. DIRECT_SOLUTION_RATE
    0.5 over 2000 solutions: sd 0.011. Lengths (tokens with EOS, counted here over the stream): a direct solution is
    9-11 tokens; a worked one of 1-2 operations at most 30, of 4 operations at least 34, so finding_d's training budget
    of 32 cuts every worked 4-operation solution, most 3-operation ones and no direct or 1-2-operation one."""
    from literl.testbed.recipes import BASE, DIRECT

    n_direct, cut_3_ops, n_3_ops = 0, 0, 0
    for di, ca in _beside_canonical("direct"):
        tokens = len(di["solution"]) + 1
        if di["solution"] != ca["solution"]:
            n_direct += 1
            assert di["solution"] == f"\\boxed{{{di['answer']}}}" and 9 <= tokens <= 11
            continue
        assert "\n" in di["solution"]     # a worked solution writes at least one step line
        if di["num_ops"] <= 2:
            assert tokens <= 30
        elif di["num_ops"] == 4:
            assert tokens >= 34
        else:
            n_3_ops += 1
            cut_3_ops += tokens > 32
    assert 0.46 <= n_direct / 2000 <= 0.54
    assert 0.5 < cut_3_ops / n_3_ops < 0.95
    assert DIRECT.parent == BASE and DIRECT.alignment.style == "direct" and DIRECT.alignment.slip_rate == 0.2
    assert DIRECT.measure.max_new_tokens == 128 and DIRECT.to_dict()["alignment"]["style"] == "direct"


def test_the_canonical_stream_is_unchanged_by_the_checked_style():
    """`base` is shipped and cached by recipe hash, not by its data: the canonical stream must stay as it was built
    (the first solutions of seed 0 with slips, written down when the checked style was added)."""
    from literl.testbed.tasks import problem_stream

    stream = problem_stream(split="train", seed=0, slip_rate=0.2)
    first = [next(stream)["solution"] for _ in range(3)]
    assert first == ["5+9=14\n\\boxed{14}", "6*3=18\n18+53=71\n71+7=78\n78+3=81\n\\boxed{81}",
                     "5-3=2\n2-2=0\n0+6=6\n\\boxed{6}"]
