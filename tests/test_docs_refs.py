"""Every ``theory.md §N`` reference in the docs, docstrings and README resolves to a numbered heading."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^#{2,4} §(\d+(?:\.\d+)*) \S", re.M)
# "theory.md §5", "theory.md §5.3", "theory.md §3-4", "theory.md §3-§4"; a bare "theory §N" is a reference too
REF = re.compile(r"theory(?:\.md)? §(\d+(?:\.\d+)*)(?:\s*[-–]\s*§?(\d+(?:\.\d+)*))?")


def _headings():
    return set(HEADING.findall((ROOT / "docs" / "theory.md").read_text()))


def _sources():
    files = list((ROOT / "docs").rglob("*.md")) + list((ROOT / "widelimit").rglob("*.py")) + [ROOT / "README.md"]
    return [f for f in files if f.is_file()]


def test_theory_sections_are_numbered_in_order():
    nums = HEADING.findall((ROOT / "docs" / "theory.md").read_text())
    top = [int(n) for n in nums if "." not in n]
    assert top == list(range(1, len(top) + 1))
    assert len(nums) == len(set(nums))  # no section number used twice


def test_every_reference_resolves():
    heads = _headings()
    bad, seen = [], 0
    for f in _sources():
        for ln, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in REF.finditer(line):
                seen += 1
                for ref in filter(None, m.groups()):
                    if ref not in heads:
                        bad.append(f"{f.relative_to(ROOT)}:{ln}: §{ref}")
    assert seen >= 60  # the references exist (the pattern is not silently matching nothing)
    assert not bad, "unresolved theory.md references:\n" + "\n".join(bad)


def test_bare_references_name_the_file():
    """``theory §N`` without ``.md`` is ambiguous once there are several theory pages."""
    bare = []
    for f in _sources():
        for ln, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"theory §\d", line):
                bare.append(f"{f.relative_to(ROOT)}:{ln}")
    assert not bare, "\n".join(bare)


def test_pattern_catches_a_dangling_reference():
    heads = _headings()
    refs = [g for m in REF.finditer("see theory.md §99 and theory.md §3-§98") for g in m.groups() if g]
    assert refs == ["99", "3", "98"]
    assert [r for r in refs if r not in heads] == ["99", "98"]
