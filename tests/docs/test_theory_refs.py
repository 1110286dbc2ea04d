"""Every reference to a section of docs/theory.md resolves to a numbered heading.

Scanned: the Markdown pages under ``docs/``, README.md and the Python files of ``widelimit/``,
``benchmarks/`` (not the generated ``benchmarks/results/``) and ``tests/``. A reference is

* ``theory.md §5``, ``docs/theory.md §5.3``, ``theory.md section 5``;
* a Markdown link to the page followed by a section: ``[theory](theory.md) §7``,
  ``[finite width](../theory.md) §7``, ``[docs/theory.md](docs/theory.md) §5``;
* a range or a list after either form: ``§3-4``, ``§5.3-§5.5``, ``§2, §5.6``, ``§3 and §4`` (every
  item is checked);

and any of these may be broken across lines, also inside ``#`` comments. Besides, every bare
``§N`` anywhere in the scanned files (theory.md's own cross-references, ``(§5.2)`` in a docstring
that cites theory.md above) must name a section of theory.md, except the citations of other
works listed in ``EXTERNAL``.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THEORY = ROOT / "docs" / "theory.md"
HEADING = re.compile(r"^#{2,4} §(\d+(?:\.\d+)*) \S", re.M)

_NUM = r"(\d+(?:\.\d+)*)"
# whitespace that may include one line break, with the next line's indentation and comment marker
_SP = r"[ \t]*(?:\n[ \t]*(?:#+[ \t]*)?)?"
# the page: "theory", "theory.md", "docs/theory.md"; then optionally the rest of a Markdown link
# whose text or target it is: "[theory](theory.md)", "[docs/theory.md](docs/theory.md)", "(../theory.md)"
_PAGE = r"theory(?:\.md)?(?:\]\([^)\s]*\)|\))?"
_FIRST = r"(?:§|section" + _SP + ")" + _NUM
# further items: a range ("-", "–"; the second "§" optional) or a list (", ", "; ", " and ", " or ")
_MORE = r"(?:" + _SP + r"[-–]" + _SP + r"§?" + r"|" + _SP + r"(?:,|;|,?" + _SP + r"and|,?" + _SP + r"or)" + _SP + r"§)"
REF = re.compile(_PAGE + _SP + _FIRST + r"(?:" + _MORE + _NUM + r")*")
ITEM = re.compile(r"(?:§|section\s+(?:#+\s*)?)" + _NUM + r"|[-–]\s*(?:#+\s*)?" + _NUM)
BARE = re.compile(r"§" + _NUM)

#: "§" that cite another work, not theory.md: file -> exact text (removed before the bare scan)
EXTERNAL = {
    "docs/theory.md": ["2nd ed., §2.2", "Lemma 3.1 and §4.2"],  # Higham, Accuracy and Stability
    "widelimit/exact/median_bound.py": ["(Higham, §3.1)"],
}


def _headings():
    return set(HEADING.findall(THEORY.read_text(encoding="utf-8")))


def _sources():
    files = (list((ROOT / "docs").rglob("*.md")) + list((ROOT / "widelimit").rglob("*.py"))
             + [p for p in (ROOT / "benchmarks").rglob("*.py") if "results" not in p.relative_to(ROOT).parts]
             + list((ROOT / "tests").rglob("*.py")) + [ROOT / "README.md"])
    this = Path(__file__).resolve()  # its docstring and examples hold references on purpose
    return sorted(f for f in files if f.is_file() and f.resolve() != this)


def _items(ref_text):
    """The section numbers of one matched reference, in order."""
    return [a or b for a, b in ITEM.findall(ref_text)]


def find_refs(text):
    """``(line, [numbers])`` for every reference to theory.md in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, _items(m.group(0))) for m in REF.finditer(text)]


def find_bare(text, external=()):
    """``(line, number)`` for every ``§N`` in ``text`` outside theory.md's headings and ``external``."""
    text = HEADING.sub(lambda m: m.group(0).replace("§", "#"), text)  # headings define, they don't cite
    for quote in external:
        assert quote in text, f"stale EXTERNAL entry: {quote!r}"
        text = text.replace(quote, "x" * len(quote))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BARE.finditer(text)]


def unresolved(files, heads, root=ROOT):
    """``path:line: §N`` for every reference or bare section number in ``files`` that is not a heading.

    Also returns how many references were read. ``root`` is the folder the paths are relative to
    (and the keys of ``EXTERNAL`` are).
    """
    bad, seen = [], 0
    for f in files:
        rel = f.relative_to(root).as_posix()
        text = f.read_text(encoding="utf-8")
        for ln, nums in find_refs(text):
            seen += 1
            bad += [f"{rel}:{ln}: §{n}" for n in nums if n not in heads]
        bad += [f"{rel}:{ln}: bare §{n}" for ln, n in find_bare(text, EXTERNAL.get(rel, ())) if n not in heads]
    return bad, seen


def test_theory_sections_are_numbered_in_order():
    nums = HEADING.findall(THEORY.read_text(encoding="utf-8"))
    top = [int(n) for n in nums if "." not in n]
    assert top == list(range(1, len(top) + 1))
    assert len(nums) == len(set(nums))  # no section number used twice


def test_every_reference_resolves():
    bad, seen = unresolved(_sources(), _headings())
    assert seen >= 150  # the references exist (the pattern is not silently matching nothing)
    assert not bad, "unresolved theory.md references:\n" + "\n".join(bad)


def test_bare_references_name_the_file():
    """``theory §N`` without ``.md`` is ambiguous once there are several theory pages."""
    bare = []
    for f in _sources():
        for ln, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"theory §\d", line):
                bare.append(f"{f.relative_to(ROOT)}:{ln}")
    assert not bare, "\n".join(bare)


def test_pattern_reads_every_form():
    text = ("see theory.md §99 and theory.md §3-§98; docs/theory.md §5.3-5.5,\n"
            "[theory](theory.md) §7, [finite width](../theory.md) §7.6 and\n"
            "[docs/theory.md](docs/theory.md) §5 \u2014 a list (theory.md §2, §5.6 and §97),\n"
            "split: the objective of theory.md\n    §1 (see theory.md\n    # §3), theory.md section 5,\n"
            "[theory.md](theory.md) §3 and §4, (docs/theory.md §4.1; §8.2) and theory.md §3 or §96.\n")
    assert find_refs(text) == [
        (1, ["99"]), (1, ["3", "98"]), (1, ["5.3", "5.5"]), (2, ["7"]), (2, ["7.6"]), (3, ["5"]),
        (3, ["2", "5.6", "97"]), (4, ["1"]), (5, ["3"]), (6, ["5"]), (7, ["3", "4"]), (7, ["4.1", "8.2"]),
        (7, ["3", "96"])]
    # numbers that follow a reference but are not sections are not read as sections
    assert find_refs("theory.md §3, 4 points and theory.md §7 in 2-D") == [(1, ["3"]), (1, ["7"])]


def test_a_broken_reference_of_each_form_fails(tmp_path):
    """Break one reference of each form in a scratch copy of a real file: ``unresolved`` must name it."""
    heads = _headings()
    forms = [  # (file, a reference in it, the same reference broken)
        ("widelimit/exact/newton.py", "theory.md §4.2", "theory.md §4.9"),  # plain, in the package
        ("benchmarks/exact_vs_cvxpy.py", "theory.md §3", "theory.md §33"),  # benchmarks/
        ("tests/exact/test_stationarity.py", "theory.md §5", "theory.md §55"),  # tests/
        ("widelimit/lab/experiments/minilm_sae.py", "theory.md\n§1", "theory.md\n§11"),  # split across lines
        ("docs/api.md", "[theory](theory.md) §7", "[theory](theory.md) §77"),  # link form
        ("docs/index.md", "[finite width](theory.md) §7", "[finite width](theory.md) §77"),  # link, other text
        ("docs/experiments/spurious.md", "theory.md §2, §5.6", "theory.md §2, §5.9"),  # second list item
        ("docs/relaxation_benchmark.md", "§3 and §4", "§3 and §44"),  # "and" list
        ("docs/sae_certification.md", "theory.md §5.3-§5.5", "theory.md §5.3-§5.9"),  # range end
        ("docs/theory.md", "ordering of §7.4", "ordering of §7.9"),  # bare, inside theory.md
        ("widelimit/exact/stability.py", "(§5.2)", "(§5.9)"),  # bare, in a docstring
    ]
    scratch = tmp_path / "scratch"
    for rel, good, broken in forms:
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert good in text, (rel, good)
        copy = scratch / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text.replace(good, broken, 1), encoding="utf-8")
        bad, _ = unresolved([copy], heads, root=scratch)
        wrong = "§" + BARE.findall(broken)[-1]
        assert bad and all(b.startswith(rel + ":") and b.endswith(wrong) for b in bad), (rel, bad)
    # "theory.md section N" (the form of the help text of widelimit/cli/certify.py), also split
    for text, wrong in [("help (theory.md section 55) x", ["55"]), ("see theory.md section\n# 55", ["55"]),
                        ("help (theory.md section 5) x", [])]:
        assert [n for _, nums in find_refs(text) for n in nums if n not in heads] == wrong
