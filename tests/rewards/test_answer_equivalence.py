"""Agreement of literl's answer checking with the verdicts of the shared answer-equivalence cases.

Cases: ../shared/data/answer-equivalence/ (Math-Verify's own test cases and the MATH grader's). Protocol:
a `pred` that holds a `\\boxed{}` goes through the reward's pipeline (its last box, then `is_equivalent`);
any other `pred` is given to `is_equivalent` as the answer string. Each case's Math-Verify options
(`precision` → float_rounding, `strict`, `allow_set_relation_comp`) are honoured; its `match_types` are
not, because literl always tries LaTeX and then plain expressions.

Every disagreement must be listed, with its reason, in answer_equivalence_disagreements.json; a listed
case that now agrees fails too, so the list stays honest.
"""

from __future__ import annotations

import json
from pathlib import Path

from literl.rewards.math_answer import extract_final_answer, is_equivalent

DISAGREEMENTS = Path(__file__).with_name("answer_equivalence_disagreements.json")
CASE_FILES = ("math_verify_cases.jsonl", "hendrycks_math_equivalence_cases.jsonl")


def literl_verdict(case: dict) -> bool:
    config = case["config"]
    options = {}
    if "precision" in config:
        options = {"float_rounding": config["precision"], "strict": config["strict"],
                   "allow_set_relation_comp": config["allow_set_relation_comp"]}
    boxed = extract_final_answer(case["pred"])
    return is_equivalent(case["pred"] if boxed is None else boxed, case["gold"], **options)


def test_agreement_with_expected_verdicts(shared_data):
    cases = [json.loads(line) for name in CASE_FILES
             for line in (shared_data / "answer-equivalence" / name).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    known = json.loads(DISAGREEMENTS.read_text(encoding="utf-8"))
    disagreeing = {c["id"] for c in cases if literl_verdict(c) != c["expected"]}
    rate = 1 - len(disagreeing) / len(cases)
    print(f"answer-equivalence agreement: {len(cases) - len(disagreeing)}/{len(cases)} = {100 * rate:.1f}%")
    unexplained = sorted(disagreeing - set(known))
    now_agreeing = sorted(set(known) - disagreeing)
    assert not unexplained, f"new disagreements, not in {DISAGREEMENTS.name}: {unexplained}"
    assert not now_agreeing, f"listed in {DISAGREEMENTS.name} but now agree (remove them): {now_agreeing}"
    assert all(reason.strip() for reason in known.values())
