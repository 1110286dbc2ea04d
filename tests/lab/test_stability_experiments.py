"""The stability and finite-width experiments (quick runs) against independent computations."""

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

import widelimit as wl
from widelimit.data import datasets
from widelimit.lab import experiments


def _huber(r, lam):
    r = np.abs(r)
    return np.where(r <= lam, r * r, 2 * lam * r - lam * lam)


def _one_atom_1d(x, lam, sign):
    """min_b mean over points of min_{z>=0} (z*sign + b - x)^2 + 2 lam z, by a bounded scalar search."""
    def f(b):
        r = sign * (x - b)  # what the code can explain along the atom
        return float(np.mean(np.where(r > lam, 2 * lam * r - lam * lam, r * r)))
    grid = np.linspace(x.min() - 1, x.max() + 1, 4001)
    b0 = grid[int(np.argmin([f(b) for b in grid]))]
    return minimize_scalar(f, bounds=(b0 - 1e-3, b0 + 1e-3), method="bounded", options={"xatol": 1e-12}).fun


def test_finite_width_antipodal_cells_match_a_1d_brute_force(quick_experiment):
    res = quick_experiment("finite-width")[0]
    lam, n = 0.5, 20
    s_all = np.random.default_rng(0).uniform(1.0, 3.0, n)  # the experiment's data, rebuilt
    assert [c["p"] for c in res["antipodal"]] == [0.2, 0.5, 0.8]
    for cell in res["antipodal"]:
        m = cell["n_active"]
        x = np.concatenate([s_all[:m], np.zeros(n - m)])
        k1 = min(_one_atom_1d(x, lam, +1), _one_atom_1d(x, lam, -1))
        k2 = minimize_scalar(lambda b: float(np.mean(_huber(x - b, lam))), bounds=(x.min(), x.max()),
                             method="bounded", options={"xatol": 1e-12}).fun  # +u and -u: the 1-D wide limit
        assert cell["k1"]["value"] == pytest.approx(k1, rel=1e-6)
        assert cell["k2"]["value"] == pytest.approx(k2, rel=1e-6)
    for cell in res["hierarchical"]:
        assert cell["lower_bound"] <= cell["value"] <= cell["lower_bound"] * (1 + 1e-6)
        assert cell["gradient_value"] >= cell["lower_bound"] * (1 - 1e-9)  # no run beats a certified bound


def test_stability_experiment_against_closed_forms_and_the_wide_limit(quick_experiment):
    res = quick_experiment("stability")[0]
    lam, K = res["lam"], 4
    ex = res["exclusive"]
    # exclusive categories at their closed-form optimum: every code margin is lam K / (K - 1)
    np.testing.assert_allclose(ex["code_margin"], lam * K / (K - 1), rtol=1e-12)
    assert ex["unstable"] == []
    # the hierarchical witnesses: lower than the dictionary, never below the certified wide-limit bound
    X, _ = datasets.hierarchical(3, 10, 10, parent_scale=2.0, child_scale=(1.0, 2.0), n_parent_only=10, seed=1)
    bound = wl.solve(X, lam=lam).lower_bound
    h = res["hierarchical"]
    assert h["n_points"] == X.shape[0]
    assert sorted(int(d) for d in h["witnesses"]) == h["unstable"]
    for w in h["witnesses"].values():
        assert bound <= w["value"] < h["value"]
        assert w["value"] == pytest.approx(h["value"] - w["decrease"], abs=1e-12)
