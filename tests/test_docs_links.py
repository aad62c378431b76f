"""Every relative link in the user docs and the results record resolves: the file exists, and a `#anchor` names a
heading of that file (GitHub's anchor rule). Moving text between docs/ and results/ cannot leave a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def pages() -> list[Path]:
    found = [*sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "results").rglob("*.md"))]
    return found + [p for p in (ROOT / "README.md", ROOT / "CHANGELOG.md") if p.is_file()]


def anchor(heading: str) -> str:
    """GitHub's slug: lower case, markup and punctuation dropped (letters, digits, '-', '_' and spaces kept),
    spaces to '-'."""
    text = re.sub(r"`|\*\*|\*", "", heading).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = anchor(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_the_anchor_rule_matches_githubs_on_hand_cases():
    """'The default job (`./run.sh train`), measured' → the-default-job-runsh-train-measured: backticks, '.', '/',
    '(', ')' and ',' dropped, spaces to '-'; an apostrophe goes too ("evaluation's" → evaluations)."""
    assert anchor("The default job (`./run.sh train`), measured") == "the-default-job-runsh-train-measured"
    assert anchor("How much of the spread is the evaluation's sampling") == (
        "how-much-of-the-spread-is-the-evaluations-sampling")
    assert anchor("Findings: the seed studies on the testbed") == "findings-the-seed-studies-on-the-testbed"


def test_every_relative_link_in_the_docs_and_results_resolves():
    broken = []
    for page in pages():
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)} → {target}"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{where}: no heading with that anchor")
    assert len(pages()) > 30, "the page scan found almost nothing: has docs/ or results/ moved?"
    assert not broken, "broken links:\n" + "\n".join(broken)
