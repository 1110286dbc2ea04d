"""One vocabulary (issue 27): every public parameter and result field is in docs/api.md's glossary, every
certified result carries the shared fields, and every public parameter has a constraint (widelimit/_params.py)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import widelimit as wl
from widelimit._params import constraints_of
from widelimit.results import SHARED_FIELDS, CertifiedResult

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "api.md"
CERTIFIED = ("WideLimitSolution", "FiniteSolution", "Certificate", "MedianResult", "CodingResult", "DNNResult",
             "RelaxationResult", "SAECertificate")


def _glossary() -> set[str]:
    text = GLOSSARY.read_text()
    part = text[text.index("## Glossary"):text.index("## The front door")]
    names = set()
    for line in part.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`", line.split(" | ")[0]))
    return names


def _public():
    """(qualified name, function) of every public function and method, and the public result classes."""
    funcs, results = [], []
    for name in wl.__all__:
        obj = getattr(wl, name)
        if name == "relax":
            from widelimit.relax.cones import relax as obj
        elif inspect.ismodule(obj) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
            continue
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            results.append((name, obj))
        elif inspect.isclass(obj):
            funcs += [(f"{name}.{m}", f) for m, f in inspect.getmembers(obj, inspect.isfunction)
                      if not m.startswith("_") or m == "__init__"]
        else:
            funcs.append((name, obj))
    return funcs, results


def _params(fn):
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_every_public_name_is_in_the_glossary():
    known = _glossary()
    funcs, results = _public()
    missing = sorted({f"{q}({p})" for q, f in funcs for p in _params(f) if p not in known}
                     | {f"{n}.{f.name}" for n, c in results for f in dataclasses.fields(c) if f.name not in known})
    assert missing == [], f"names outside docs/api.md's glossary: {missing}"
    assert set(SHARED_FIELDS) | {"as_dict"} <= known


@pytest.mark.parametrize("name", CERTIFIED)
def test_certified_results_carry_the_shared_fields(name):
    cls = getattr(wl, name)
    assert issubclass(cls, CertifiedResult)
    fields = {f.name for f in dataclasses.fields(cls)}
    lacking = [s for s in SHARED_FIELDS if s not in fields and not hasattr(cls, s)]
    assert lacking == [], f"{name} lacks {lacking}"


def test_the_old_names_are_gone():
    """The renames of issue 27: none of the old names is a public parameter or a result field."""
    old = {"rel_tol", "max_iters", "max_steps", "max_rounds", "max_nodes", "max_time", "num_threads", "elapsed",
           "seconds", "certified_optimal", "converged", "n_tokens", "n_nodes", "n_steps", "N", "n", "iterations"}
    funcs, results = _public()
    used = {p for _, f in funcs for p in _params(f)} | {f.name for _, c in results for f in dataclasses.fields(c)}
    assert used & old == set()


def test_every_public_parameter_has_a_constraint():
    funcs, _ = _public()
    skip = {"SAE", "ActivationSource"}  # a model and a data object: their methods take what their fields are
    lacking = []
    for q, f in funcs:
        if q.split(".")[0] in skip or (q.startswith("Problem.") and q.endswith("n_points")):
            continue
        c = constraints_of(f)
        if c is None:
            lacking.append(q)
            continue
        lacking += [f"{q}({p})" for p in _params(f) if p not in c]
    assert lacking == [], f"public parameters without a constraint (widelimit/_params.py): {lacking}"


def test_results_as_dict_hold_the_shared_fields():
    import numpy as np

    X = np.random.default_rng(0).standard_normal((30, 2))
    sol = wl.solve(X, lam=0.5)
    fin = wl.solve(X, lam=0.5, width=1, max_iter=50)
    for r in (sol, fin, sol.certificate, fin.certificate, sol.median,
              wl.optimal_codes(X, sol.dictionary, sol.bias, lam=0.5, device="cpu")):
        d = r.as_dict()
        assert set(SHARED_FIELDS) <= set(d), type(r).__name__
        assert d["certified"] == bool(r.certified) and d["value"] == r.value
    # a finite solution's shared fields are its search's; its certificate speaks about the same (W, Z, b)
    assert fin.certificate.value == pytest.approx(fin.value, rel=1e-12)
    assert fin.certificate.lower_bound == sol.lower_bound and fin.lower_bound >= sol.lower_bound - 1e-12
