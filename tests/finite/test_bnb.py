"""Finite-width global optimum (widelimit.finite): node bounds, certified optima, SCIP cross-check, errors."""

from __future__ import annotations

import json
import math

import cvxpy as cp
import numpy as np
import pytest
import scipy.optimize as so

import widelimit as wl
from widelimit.finite import node_lower_bound
from widelimit.finite.bnb import _polish, box_cap, face_directions

from fixtures.optima import fixed_dictionary_optimum as _fixed_dictionary_optimum


def _data(seed, N, n, scale=2.0):
    return np.random.default_rng(seed).standard_normal((N, n)) * scale


def _relaxation_cvxpy(X, lam, caps):
    """The node relaxation (theory.md §7.2) as an SOCP in cvxpy (Clarabel)."""
    N, n = X.shape
    Ys = [cp.Variable((N, n)) for _ in caps]
    b = cp.Variable(n)
    cons = []
    for Y, (c, th) in zip(Ys, caps):
        c = np.asarray(c, float) / np.linalg.norm(c)
        cons.append(cp.norm(Y, 2, axis=1) * math.cos(th) <= Y @ c)
    R = sum(Ys) + np.ones((N, 1)) @ cp.reshape(b, (1, n), order="C") - X
    obj = (cp.sum_squares(R) + 2 * lam * sum(cp.sum(cp.norm(Y, 2, axis=1)) for Y in Ys)) / N
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return prob.value


def _random_caps(rng, k, n, max_angle):
    caps = []
    for _ in range(k):
        c = rng.standard_normal(n)
        caps.append((c / np.linalg.norm(c), rng.uniform(0.02, max_angle)))
    return caps


def _in_cap(rng, c, th):
    """A random unit vector within angle ``th`` of ``c``."""
    while True:
        v = c + rng.uniform(-1, 1, c.size) * math.tan(th)
        v /= np.linalg.norm(v)
        if v @ c >= math.cos(th):
            return v


@pytest.mark.parametrize("seed,n,k", [(0, 2, 1), (1, 2, 2), (2, 3, 2), (3, 3, 3)])
def test_node_bound_is_the_relaxation_value(seed, n, k):
    rng = np.random.default_rng(seed)
    X = _data(seed, 7, n)
    caps = _random_caps(rng, k, n, 1.2)
    dual, primal = node_lower_bound(X, 0.4, caps, tol_abs=1e-12)
    ref = _relaxation_cvxpy(X, 0.4, caps)
    assert dual <= ref + 1e-8 * abs(ref)  # a lower bound of the relaxation (up to Clarabel's accuracy)
    assert primal >= ref - 1e-8 * abs(ref)
    assert abs(dual - ref) <= 1e-6 * abs(ref)  # and tight: the dual is the relaxation's value


@pytest.mark.parametrize("seed,n,k", [(4, 2, 2), (5, 3, 2)])
def test_node_bound_below_every_dictionary_in_the_caps(seed, n, k):
    rng = np.random.default_rng(seed)
    X = _data(seed, 6, n)
    caps = _random_caps(rng, k, n, 0.5)
    dual, _ = node_lower_bound(X, 0.3, caps)
    vals = []
    for _ in range(6):
        W = np.array([_in_cap(rng, c, th) for c, th in caps])
        vals.append(_fixed_dictionary_optimum(X, W, 0.3))
    assert dual <= min(vals) + 1e-9
    # the bound tightens as the caps shrink to the dictionary's directions
    W = np.array([_in_cap(rng, c, th) for c, th in caps])
    tiny = [(w, 1e-7) for w in W]
    d_tiny, _ = node_lower_bound(X, 0.3, tiny, tol_abs=1e-13)
    exact = _fixed_dictionary_optimum(X, W, 0.3)
    assert d_tiny <= exact + 1e-9 and exact - d_tiny <= 1e-5 * exact


def test_box_cap_contains_the_box_directions():
    rng = np.random.default_rng(0)
    for n in (2, 3):
        for _ in range(20):
            face = int(rng.integers(2 * n))
            lo = rng.uniform(-1, 0.9, n - 1)
            hi = np.minimum(lo + rng.uniform(0.001, 1.0, n - 1), 1.0)
            c, th = box_cap(face, lo, hi, n)
            P = lo + rng.uniform(0, 1, (500, n - 1)) * (hi - lo)
            ang = np.arccos(np.clip(face_directions(face, P, n) @ c, -1, 1))
            assert ang.max() <= th
            corners = face_directions(face, np.array([lo, hi]), n)
            assert np.arccos(np.clip(corners @ c, -1, 1)).max() >= th - 1e-6 or n == 3


def _k1_brute_force(X, lam, n_angles=3600):
    """Width 1 in 2-D: for each direction w the bias problem is convex (min_b mean ||r||^2 - (<r,w>-lam)_+^2)."""

    def f_b(b, w):
        r = X - b
        t = r @ w
        return np.mean(np.sum(r * r, axis=1) - np.maximum(t - lam, 0.0) ** 2)

    def f(phi):
        w = np.array([math.cos(phi), math.sin(phi)])
        res = so.minimize(f_b, X.mean(axis=0), args=(w,), method="BFGS", options={"gtol": 1e-12})
        return res.fun

    phis = np.linspace(0, 2 * math.pi, 360, endpoint=False)
    vals = np.array([f(p) for p in phis])
    best = math.inf
    for p0 in phis[np.argsort(vals)[:4]]:
        r = so.minimize_scalar(f, bounds=(p0 - 0.02, p0 + 0.02), method="bounded", options={"xatol": 1e-12})
        best = min(best, r.fun)
    return best


@pytest.mark.parametrize("seed", [0, 1])
def test_width_one_matches_brute_force(seed):
    X = _data(seed, 9, 2)
    sol = wl.solve(X, lam=0.5, width=1)
    ref = _k1_brute_force(X, 0.5)
    assert sol.certified and sol.status == "optimal"
    assert sol.lower_bound <= ref + 1e-9
    assert abs(sol.value - ref) <= 1e-6 * ref


def test_one_dimensional_data_both_signs():
    X = _data(3, 12, 1) + 0.5
    sol = wl.solve(X, lam=0.3, width=1)
    ref = min(_fixed_dictionary_optimum(X, np.array([[s]]), 0.3) for s in (1.0, -1.0))
    assert sol.certified
    assert abs(sol.value - ref) <= 1e-7 * ref


def _check_triple(X, lam, sol):
    W, Z, b = sol.dictionary, sol.codes, sol.bias
    assert W.shape == (sol.width, X.shape[1]) and Z.shape == (X.shape[0], sol.width)
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), 1.0, rtol=0, atol=1e-12)
    assert Z.min() >= 0
    assert wl.sae_objective(X, W, Z, b, lam=lam).value == sol.value  # re-evaluates exactly
    assert sol.lower_bound <= sol.value
    assert sol.gap == sol.value - sol.lower_bound


def test_matches_multistart_and_reevaluates():
    X = _data(1, 6, 2)
    lam = 0.3
    sol = wl.solve(X, lam=lam, width=2)
    assert sol.certified and sol.rel_gap <= 1e-6
    _check_triple(X, lam, sol)
    lbs = [h[1] for h in sol.history]
    assert lbs[-1] == sol.lower_bound and sol.history[-1][2] == sol.value
    assert all(a <= b for a, b in zip(lbs, lbs[1:]))  # the certified bound only rises
    rng = np.random.default_rng(0)
    best = math.inf
    for _ in range(300):
        W0 = rng.standard_normal((2, 2))
        W0 /= np.linalg.norm(W0, axis=1, keepdims=True)
        best = min(best, _polish(X, lam, W0, X.mean(axis=0) + rng.standard_normal(2), 300)[0])
    assert best >= sol.lower_bound - 1e-12  # no local optimum beats the certified bound
    assert sol.value <= best + 1e-9  # and the search finds at least the best multistart value


@pytest.mark.parametrize("seed,k", [(1, 1), (1, 2)])
def test_agrees_with_scip(seed, k):
    pytest.importorskip("pyscipopt")
    from widelimit.finite.scip import solve_scip

    X = _data(seed, 6, 2)
    sol = wl.solve(X, lam=0.3, width=k)
    ref = solve_scip(X, 0.3, k, time_limit=math.inf, max_iter=100_000)  # a node budget, not a time limit
    assert ref.status == "optimal" and sol.certified
    assert sol.lower_bound <= ref.value + 1e-12 and ref.lower_bound <= sol.value + 1e-12
    assert abs(sol.value - ref.value) <= 2e-6 * ref.value


def test_3d_bounds_bracket_scip():
    """3-D, where SCIP does not finish in CI time: after 200 of its nodes (a budget, so the same answer on any
    machine under any load) its incumbent (an independent feasible value) is above our certified lower bound,
    and its lower bound below our value; our optimum is at least as good."""
    pytest.importorskip("pyscipopt")
    from widelimit.finite.scip import solve_scip

    X = _data(2, 6, 3)
    sol = wl.solve(X, lam=0.3, width=2)
    ref = solve_scip(X, 0.3, 2, time_limit=math.inf, max_iter=200)
    assert ref.status == "nodelimit"
    assert sol.certified
    assert sol.lower_bound <= ref.value + 1e-12 and ref.lower_bound <= sol.value + 1e-12
    assert sol.value <= ref.value * (1 + 1e-6)


def test_closed_form_at_the_number_of_rays():
    X, _ = wl.datasets.rays2d()
    wide = wl.solve(X, lam=1.0)
    sol = wl.solve(X, lam=1.0, width=wide.width + 1)
    assert sol.status == "closed_form" and sol.certified and sol.n_iter == 0
    assert abs(sol.value - wide.value) <= 1e-12 * wide.value
    _check_triple(X, 1.0, sol)


def test_time_limit_returns_uncertified_best():
    X = _data(7, 20, 2)
    sol = wl.solve(X, lam=0.3, width=3, time_limit=0.0)
    assert sol.status == "time_limit" and not sol.certified
    assert sol.rel_gap > 1e-6
    _check_triple(X, 0.3, sol)
    # a limit of 0 bounds no node (the root's bound and the multistart used to run whatever the limit):
    # the certified bound is the wide limit's, exactly
    assert sol.n_iter == 0 and sol.lower_bound == wl.solve(X, lam=0.3).lower_bound


@pytest.mark.parametrize("width", [0, -2, 1.5, True, "2"])
def test_bad_width(width):
    with pytest.raises(ValueError, match=r"^width must be an integer >= 1 or None, got "):
        wl.solve(_data(0, 5, 2), lam=0.3, width=width)


def test_too_large_points_to_gradient_solver():
    X = _data(0, 30, 5)
    with pytest.raises(ValueError, match="gradient solver"):
        wl.solve(X, lam=0.1, width=2)


def test_cli_solve_width_json(tmp_path, capsys):
    from widelimit.cli import main

    X = _data(1, 6, 2)
    f = tmp_path / "x.npy"
    np.save(f, X)
    assert main(["solve", str(f), "--lam", "0.3", "--width", "1", "--json", "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main(["solve", str(f), "--lam", "0.3", "--json"]) == 0
    wide = json.loads(capsys.readouterr().out)
    for key in ("value", "lower_bound", "gap", "rel_gap", "certified", "width", "bias", "lam", "n_points", "dim"):
        assert key in d and key in wide
    sol = wl.solve(X, lam=0.3, width=1)
    assert d["width"] == 1 and d["certified"] is True and d["status"] == "optimal"
    assert abs(d["value"] - sol.value) <= 1e-12 * sol.value
    assert d["value"] >= wide["lower_bound"]
    for bad in ("0", "1.5"):
        assert main(["solve", str(f), "--lam", "0.3", "--width", bad]) == 2
        err = capsys.readouterr().err
        assert "--width must be a positive integer" in err and "Traceback" not in err


def test_cli_width_out_writes_the_solution_and_its_plot(tmp_path, capsys):
    """``solve --width --out`` writes solution.npz / .json / .png, as ``--out`` promises for every solve."""
    from matplotlib.image import imread

    from widelimit.cli import main

    X = _data(1, 6, 2)
    f = tmp_path / "x.npy"
    np.save(f, X)
    out = tmp_path / "o"
    assert main(["solve", str(f), "--lam", "0.3", "--width", "1", "--json", "--no-progress", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    names = ("solution.npz", "solution.json", "solution.png")
    assert [p.rsplit("/", 1)[-1] for p in d["files"]] == list(names)
    z = np.load(out / "solution.npz")
    again = wl.sae_objective(X, z["dictionary"], z["codes"], z["bias"], lam=0.3).value
    assert abs(again - d["value"]) <= 1e-12 * d["value"]
    assert json.loads((out / "solution.json").read_text())["value"] == d["value"]
    img = imread(out / "solution.png")
    assert img.shape[0] > 200 and img.shape[1] > 400 and float(img[..., :3].std()) > 0.05  # a drawn figure, not blank


def test_frontier_with_exact_widths(monkeypatch):
    import importlib

    mod = importlib.import_module("widelimit.exact.solve")
    medians = []
    real = mod._median
    monkeypatch.setattr(mod, "_median", lambda *a, **k: medians.append(1) or real(*a, **k))
    X = _data(1, 6, 2)
    ev = []
    fr = wl.frontier(X, lam=0.3, widths=[1, 2], n_restarts=1, exact_widths=True, max_iter=200, progress=ev.append)
    assert fr.exact_certified == [True, True]
    assert len(medians) == 1  # the exact widths reuse the wide solve's median
    # progress: the gradient widths, then each exact width's search, ending on its returned value and bound
    stages = [e.stage for e in ev]
    assert stages[:2] == ["width 1", "width 2"] and set(stages[2:]) == {"exact width 1", "exact width 2"}
    for w, v, lb in zip(fr.widths, fr.exact_values, fr.exact_lower_bounds):
        last = [e for e in ev if e.stage == f"exact width {w}"][-1]
        assert last.done and (last.value, last.lower_bound) == (v, lb)
    for w, v, e, lb in zip(fr.widths, fr.values, fr.exact_values, fr.exact_lower_bounds):
        assert lb <= e and (e - lb) <= 1e-6 * e
        assert v >= lb - 1e-12  # no gradient run beats the certified optimum at its width
        assert abs(e - wl.solve(X, lam=0.3, width=w).value) <= 1e-12 * e
    assert fr.exact_values[1] < fr.exact_values[0]


@pytest.mark.parametrize("kw,msg", [({"tol": 0.0}, r"^tol must be a finite number in \(0, 1\) with width="),
                                    ({"time_limit": -1.0}, r"^time_limit must be a number >= 0 or None, got -1$"),
                                    ({"tol": float("nan")}, r"^tol must be a finite number >= 0 or None, got nan"),
                                    ({"max_iter": 2.5}, r"^max_iter must be an integer >= 0 or None, got 2.5")])
def test_bad_search_options(kw, msg):
    with pytest.raises(ValueError, match=msg):
        wl.solve(_data(0, 6, 2), lam=0.3, width=1, **kw)


def test_search_options_without_width_are_refused():
    with pytest.raises(ValueError, match=r"^time_limit applies only with width="):
        wl.solve(_data(0, 6, 2), lam=0.3, time_limit=5.0)


def test_progress_events_of_the_search(monkeypatch):
    """solve(width=k, progress=cb): the wide solve's pass events, then the search's, whose bounds never
    pass the optimum and whose last event is the returned value and certified bound."""
    from widelimit.finite import bnb

    X = _data(1, 12, 2)
    ev = []
    sol = wl.solve(X, lam=0.3, width=2, progress=ev.append)
    assert sol.certified and sol.status == "optimal"
    stages = [e.stage for e in ev]
    first = stages.index("branch and bound")
    assert first > 0 and "branch and bound" not in stages[:first] and set(stages[first:]) == {"branch and bound"}
    bb = ev[first:]
    assert all(isinstance(e, wl.Progress) for e in bb)
    assert all(e.lower_bound <= sol.value for e in bb)  # a bound above the optimum would be a false certificate
    assert all(a.value >= b.value for a, b in zip(bb[:-1], bb[1:-1]))  # the best value only improves
    assert abs(bb[-1].value - bb[-2].value) <= 1e-13 * sol.value  # the last: that value re-evaluated
    assert all(a.rows_done <= b.rows_done for a, b in zip(bb, bb[1:]))
    assert [e.done for e in bb] == [False] * (len(bb) - 1) + [True]
    last = bb[-1]
    assert (last.value, last.lower_bound, last.rows_done) == (sol.value, sol.lower_bound, sol.n_iter)
    # one event each time the gap passes a power of ten (the history's marks), none in between here
    assert [(e.value, e.lower_bound) for e in bb[:-1]] == [(h[2], max(h[1], sol.wide_lower_bound))
                                                           for h in sol.history[:-1]]
    # and one every _PROGRESS_EVERY seconds: with 0, one per round of the search (a round bounds the children
    # of the best open nodes, at most _BATCH + 2n - 1 of them)
    monkeypatch.setattr(bnb, "_PROGRESS_EVERY", 0.0)
    ev0 = []
    sol0 = wl.solve(X, lam=0.3, width=2, progress=ev0.append)
    assert sol0.value == sol.value and sol0.n_iter == sol.n_iter
    rounds = len([e for e in ev0 if e.stage == "branch and bound"])
    assert rounds >= sol.n_iter // (bnb._BATCH + 2 * X.shape[1]) and rounds > len(bb)


def test_progress_closed_form_and_problem_reuses_its_median():
    X, _ = wl.datasets.rays2d()
    ev = []
    sol = wl.solve(X, lam=1.0, width=40, progress=ev.append)
    assert sol.status == "closed_form"
    assert ev[-1].stage == "branch and bound" and ev[-1].done and ev[-1].rows_done == 0
    assert (ev[-1].value, ev[-1].lower_bound) == (sol.value, sol.lower_bound)
    # Problem.solve(width=) hands the search's wide solve its cached median: no median passes
    Y = _data(1, 12, 2)
    p = wl.Problem(Y, lam=0.3)
    p.bound()
    seen = []
    got = p.solve(width=2, progress=seen.append)
    assert not {"mean", "newton"} & {e.stage for e in seen}
    assert got.value == wl.solve(Y, lam=0.3, width=2).value


def test_progress_display_counts_open_ended_work():
    """The CLI's display shows the search's node count and gap (rows_total 0: no bar, no 'of N')."""
    import io

    from rich.console import Console

    from widelimit.cli._common import progress_display

    buf = io.StringIO()
    with progress_display(Console(file=buf, force_terminal=True, width=200)) as cb:
        cb(wl.Progress("branch and bound", 1234, 1234, 0, value=2.0, lower_bound=1.5))
    out = buf.getvalue()
    assert "branch and bound: 1234" in out and "gap 5.00e-01 (relative 2.5e-01)" in out and "/0" not in out
    # an event with a value and no bound (an upper bound only) shows the value, not a crash on None
    buf = io.StringIO()
    with progress_display(Console(file=buf, force_terminal=True, width=200)) as cb:
        cb(wl.Progress("fit", 3, 3, 10, value=0.75))
    out = buf.getvalue()
    assert "value 0.75" in out and "bound" not in out


def test_cli_frontier_exact_reports_each_search(tmp_path, capsys, monkeypatch):
    """`frontier --exact`: the JSON's certified optima are the library's, and the status line shows each
    exact width's search with its certified bound."""
    from widelimit.cli import main
    from widelimit.cli import fit as cli_fit

    said = []
    monkeypatch.setattr(cli_fit._Progress, "say", lambda self, text: said.append(text))
    X = _data(1, 6, 2)
    f = tmp_path / "x.npy"
    np.save(f, X)
    assert main(["frontier", str(f), "--lam", "0.3", "--widths", "1,2", "--exact", "--max-iter", "100", "--json",
                 "--out", str(tmp_path / "fr")]) == 0
    d = json.loads(capsys.readouterr().out)
    for w, v, lb in zip(d["widths"], d["exact_values"], d["exact_lower_bounds"]):
        sol = wl.solve(X, lam=0.3, width=w)
        assert (v, lb) == (sol.value, sol.lower_bound)
        assert f"exact width {w}: {v:.8g}, certified bound {lb:.8g} ({sol.n_iter} nodes)" in said


def test_cli_frontier_table_says_which_exact_values_are_certified(tmp_path, capsys, monkeypatch):
    """An exact search stopped at its time limit is not called a certified optimum in the table."""
    from widelimit.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # one table row per line

    X = _data(3, 20, 2)
    f = tmp_path / "x.npy"
    np.save(f, X)
    base = ["frontier", str(f), "--lam", "0.3", "--widths", "2", "--max-iter", "100", "--out", str(tmp_path / "fr"),
            "--exact"]
    assert main(base + ["--exact-time-limit", "0"]) == 0
    stopped = " ".join(capsys.readouterr().out.split())
    sol = wl.solve(X, lam=0.3, width=2, time_limit=0)
    assert not sol.certified
    assert f"(not certified: optimum >= {sol.lower_bound:.10g})" in stopped and "(certified optimum)" not in stopped
    assert main(base) == 0
    done = " ".join(capsys.readouterr().out.split())
    assert f"{wl.solve(X, lam=0.3, width=2).value:.10g} (certified optimum)" in done and "not certified" not in done


def test_threads_give_the_same_search():
    """The children of a node are bounded on several threads against the same incumbent: the search,
    its node count and its answer do not depend on the number of threads."""
    X = _data(0, 14, 2)
    runs = [wl.solve(X, lam=0.3, width=3, threads=t) for t in (1, 2, 3)]
    ref = runs[0]
    assert ref.certified
    for s in runs[1:]:
        assert (s.value, s.lower_bound, s.n_iter) == (ref.value, ref.lower_bound, ref.n_iter)
        assert [h[1:] for h in s.history] == [h[1:] for h in ref.history]  # the same bounds at every mark
        assert np.array_equal(s.dictionary, ref.dictionary) and np.array_equal(s.codes, ref.codes)
    with pytest.raises(ValueError, match="threads"):
        wl.solve(X, lam=0.3, width=3, threads=0)


def test_memory_limit_returns_uncertified_best():
    """When the open nodes would pass FiniteLimits.max_queue_bytes the search stops like at a time limit:
    the best triple (re-evaluated) with a certified bound below the optimum."""
    from widelimit.finite import FiniteLimits

    X = _data(7, 20, 2)
    full = wl.solve(X, lam=0.3, width=3)
    sol = wl.solve(X, lam=0.3, width=3, limits=FiniteLimits(max_queue_bytes=200_000))
    assert full.certified and sol.status == "memory_limit" and not sol.certified
    assert sol.n_iter < full.n_iter and sol.rel_gap > 1e-6
    assert full.lower_bound >= sol.lower_bound >= full.wide_lower_bound  # a valid, weaker bound
    assert sol.value >= full.lower_bound
    _check_triple(X, 0.3, sol)


@pytest.mark.parametrize("e", [-510, 510])
def test_search_on_data_far_from_unit_scale_is_the_search_on_their_exact_rescaling(e):
    """Data near 1e-153 were judged against an absolute 1e-300 (every node closed at the root: "optimal" at a 34%
    gap, the value 15.6% above the optimum) and data near 1e154 overflowed the atoms' norms (a NaN incumbent, then
    a crash at the time limit). The search now runs on the data brought to unit scale by a power of two: the
    search of 2^e X0 is that of X0, number for number, and its events are in X's units."""
    X0 = _data(0, 6, 2)
    X0 = X0 / (np.abs(X0).max() * 1.01)  # largest entry in [0.5, 1): searched as it is
    s = 2.0**e
    ref = wl.solve(X0, lam=0.1, width=2)
    seen = []
    got = wl.solve(X0 * s, lam=0.1 * s, width=2, progress=seen.append)
    assert ref.certified and got.certified and got.status == ref.status == "optimal"
    assert (got.value, got.lower_bound, got.gap) == (ref.value * s * s, ref.lower_bound * s * s, ref.gap * s * s)
    assert got.rel_gap == ref.rel_gap and got.n_iter == ref.n_iter
    np.testing.assert_array_equal(got.dictionary, ref.dictionary)
    np.testing.assert_array_equal(got.bias, ref.bias * s)
    np.testing.assert_array_equal(got.codes, ref.codes * s)
    assert [(lb, v) for _, lb, v in got.history] == [(lb * s * s, v * s * s) for _, lb, v in ref.history]
    last = [ev for ev in seen if ev.stage == "branch and bound"][-1]
    assert last.done and (last.value, last.lower_bound) == (got.value, got.lower_bound)
    assert wl.sae_objective(X0 * s, got.dictionary, got.codes, got.bias, lam=0.1 * s).value == got.value


def test_a_closed_search_above_tol_is_not_called_optimal():
    """tol 1e-15 is below the objective's rounding: every node closes, the gap stays near 1e-12, and the
    status said "optimal" beside certified False."""
    sol = wl.solve(_data(0, 6, 2), lam=0.1, width=1, tol=1e-15, time_limit=math.inf, max_iter=100_000)  # ~4000
    assert sol.rel_gap > 1e-15 and not sol.certified and sol.status == "resolution_limit"
