"""docs/algorithms.md is the reference the code cites: every `algorithms.md §N` citation in literl/, tests/, docs/,
benchmarks/ and README.md names a heading it has, and every registered trick and parameter is documented in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from literl.algorithm.tricks import ALL

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
SCANNED = ["literl", "tests", "docs", "benchmarks", "README.md"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".html", ".sh"}

HEADING = re.compile(r"^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?[ \t]", re.M)
ONE = r"§\s?\d+(?:\.\d+)*(?:\s?[–-]\s?\d+(?:\.\d+)*)?"
# "algorithms.md §2.2–2.4", "algorithms.md §3, §9.7", "algorithms.md §1.1 and §1.4"
CITED = re.compile(rf"algorithms\.md\s?({ONE}(?:\s?(?:,|and|;)\s?{ONE})*)")
# A bare "§N" in code and tests means algorithms.md when it opens a parenthesis, a comment, or follows a comma or a
# semicolon ("(§1.7)", "(§2.8, §9.8)"); a § after a word cites something else ("style.md §3.5", "LitePPO §4.3").
BARE = re.compile(rf"(?:^|[(,;#])[ \t]*({ONE})", re.M)
ITEM = re.compile(r"§\s?(\d+(?:\.\d+)*)(?:\s?[–-]\s?(\d+(?:\.\d+)*))?")


def doc_sections() -> set[str]:
    return set(HEADING.findall(DOC.read_text(encoding="utf-8")))


def sections_of(chain: str) -> list[str]:
    """'§2.2–2.4, §9.7' → ['2.2', '2.4', '9.7']; a short range end replaces the tail ('§8.2.6–7' → 8.2.6, 8.2.7)."""
    out = []
    for start, end in ITEM.findall(chain):
        out.append(start)
        if end:
            head = start.split(".")
            tail = end.split(".")
            out.append(".".join(head[: max(len(head) - len(tail), 0)] + tail))
    return out


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                      and "__pycache__" not in p.parts]
    return files


def citations(pattern: re.Pattern, files, root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file relative to `root`, line, section) for every section cited by a match of `pattern` in `files`."""
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            for section in sections_of(match.group(1)):
                found.append((str(path.relative_to(root)), line, section))
    return found


def test_the_doc_has_the_sections_the_spec_numbering_promises():
    """The numbering the code was written against: §0.3 notation … §9 tests, with the subsections cited most."""
    sections = doc_sections()
    expected = {"0", "0.3", "1", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "2", "2.1", "2.2", "2.3", "2.4",
                "2.5", "2.6", "2.7", "2.8", "3", "4", "4.1", "4.2", "4.3", "5", "6", "7", "8", "8.1", "8.2",
                "8.2.4", "8.2.7", "9", "9.3", "9.7"}
    assert not expected - sections, f"docs/algorithms.md lacks headings {sorted(expected - sections, key=_order)}"


def test_every_algorithms_md_citation_resolves():
    cited = citations(CITED, scanned_files())
    assert len(cited) > 50, "the citation scan found almost nothing: has the pattern broken?"
    sections = doc_sections()
    missing = [f"{file}:{line}: algorithms.md §{section}" for file, line, section in cited if section not in sections]
    assert not missing, "citations with no heading in docs/algorithms.md:\n" + "\n".join(missing)


def test_bare_section_references_in_code_and_tests_resolve():
    """Docstrings and tests also write "(§2.8, §9.8)" for algorithms.md sections; those must exist too."""
    files = [p for p in scanned_files() if p.relative_to(ROOT).parts[0] in ("literl", "tests")]
    sections = doc_sections()
    missing = [f"{file}:{line}: §{section}" for file, line, section in citations(BARE, files)
               if section not in sections]
    assert not missing, "section references with no heading in docs/algorithms.md:\n" + "\n".join(missing)


@pytest.mark.parametrize("chain,expected", [("§7.", ["7"]), ("§2.2–2.4", ["2.2", "2.4"]),
                                            ("§3, §9.7", ["3", "9.7"]), ("§8.2.6–7", ["8.2.6", "8.2.7"])])
def test_citation_chains_parse(chain, expected):
    assert sections_of(chain) == expected


def test_an_unknown_section_is_reported_with_its_file_and_line(tmp_path):
    """The scan must be able to fail: a file citing a section the doc lacks is found, by file and line."""
    bad = tmp_path / "bad.py"
    cite = "algorithms.md " + "§"      # split so that this file does not cite the missing section itself
    bad.write_text(f'"""ok ({cite}1.1)\nbroken: {cite}42.1, {cite}2.2–2.4"""\n', encoding="utf-8")
    assert citations(CITED, [bad], root=tmp_path) == [("bad.py", 1, "1.1"), ("bad.py", 2, "42.1"),
                                                      ("bad.py", 2, "2.2"), ("bad.py", 2, "2.4")]
    assert "42.1" not in doc_sections() and {"1.1", "2.2", "2.4"} <= doc_sections()


@pytest.mark.parametrize("axis", sorted(ALL))
def test_every_registered_trick_and_parameter_is_documented(axis):
    text = DOC.read_text(encoding="utf-8")
    for name in ALL[axis].names():
        assert f"`{name}`" in text, f"docs/algorithms.md does not document {axis} '{name}' (write it as `{name}`)"
        for param in ALL[axis].params_of(name):
            assert re.search(rf"`{re.escape(param)}(?:`|=)", text), \
                f"docs/algorithms.md does not name parameter '{param}' of {axis}.{name} (as `{param}`)"


def _order(section: str) -> tuple[int, ...]:
    return tuple(int(x) for x in section.split("."))
