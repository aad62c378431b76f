"""Check that moving the lab record out of the docs lost nothing: every line of the docs at a base commit (default
b8e3f16, the last commit before the move) appears in today's docs/, results/, README.md or CHANGELOG.md.

    python results/check_record.py              # from the repository root; exit 1 when something is lost
    python results/check_record.py --show-reworded

A line counts as kept when its text appears anywhere in the new pages (whitespace collapsed and link targets
dropped, so re-wrapped paragraphs and re-pointed links match); a table row counts cell by cell, since long cells became
paragraphs. A line that is not kept
verbatim is "reworded" when every number in it still appears in the new pages, and "lost" otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"[−+-]?\d[\d,.]*\d|\d")
TRIVIAL = re.compile(r"^[\s|:\-`#*>]*$")


LINK_TARGET = re.compile(r"\]\([^)\s]*\)")


def _collapse(text: str) -> str:
    """Whitespace collapsed and link targets dropped: a paragraph re-wrapped, or a link re-pointed because its
    page moved ("[x](docs/x.md)" → "[x](x.md)"), is the same text."""
    return " ".join(LINK_TARGET.sub("]", text).split())


def old_pages(base: str) -> dict[str, str]:
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", base, "docs/"], check=True,
                           capture_output=True, text=True).stdout.split()
    names = [n for n in names if n.endswith(".md")] + ["README.md"]
    return {n: subprocess.run(["git", "-C", str(ROOT), "show", f"{base}:{n}"], check=True, capture_output=True,
                              text=True).stdout for n in names}


def new_corpus() -> str:
    paths = [*ROOT.joinpath("docs").rglob("*.md"), *ROOT.joinpath("results").rglob("*.md"),
             ROOT / "README.md", ROOT / "CHANGELOG.md"]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths if p.is_file())


def pieces(line: str) -> list[str]:
    """The units that must survive: a table row's cells, or the line itself."""
    text = line.strip()
    if text.startswith("|") and text.endswith("|"):
        return [cell.strip() for cell in text.strip("|").split(" | ") if not TRIVIAL.match(cell)]
    return [] if TRIVIAL.match(text) else [text]


def compare(old: dict[str, str], corpus: str) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]], int]:
    """(reworded, lost, count) for the lines of `old` ({page: text}) against `corpus`, the new pages' text.

    A number counts as kept when it appears anywhere in the corpus, so "reworded" is a weak guarantee for short
    numbers; it is there to find lines whose figures vanished, and `--show-reworded` lists the rest to read."""
    corpus = _collapse(corpus)
    numbers = set(NUMBER.findall(corpus))
    reworded, lost, total = [], [], 0
    for name, text in old.items():
        for number, line in enumerate(text.splitlines(), start=1):
            for piece in pieces(line):
                total += 1
                if _collapse(piece) in corpus:
                    continue
                missing = [n for n in NUMBER.findall(piece) if n not in numbers]
                (lost if missing else reworded).append((name, number, piece))
    return reworded, lost, total


def check(base: str) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]], int]:
    return compare(old_pages(base), new_corpus())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="b8e3f16", help="the commit whose docs must survive (default b8e3f16)")
    parser.add_argument("--show-reworded", action="store_true", help="also list lines kept only by their numbers")
    args = parser.parse_args()
    reworded, lost, total = check(args.base)
    if args.show_reworded:
        for name, number, piece in reworded:
            print(f"reworded  {name}:{number}: {piece[:160]}")
    for name, number, piece in lost:
        print(f"LOST      {name}:{number}: {piece[:160]}")
    print(f"{total} lines and cells of {args.base}'s docs: {total - len(reworded) - len(lost)} kept verbatim, "
          f"{len(reworded)} reworded with every number kept, {len(lost)} lost")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
