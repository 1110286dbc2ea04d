"""widelimit.lab.sup_ltilde and the sup-ltilde experiment, against independent computations.

The hand-written m = 3 objective is compared with exhaustive enumeration of every Rademacher input and
with the cumulant code of widelimit.lab.superposition (a separate derivation); its gradient with central
finite differences; the search with the p -> 0 optimum d(d+2)(d+4)/15 at d = 2 (a regular 7-gon).
"""

import itertools

import numpy as np
import pytest

from widelimit.lab import superposition as sp
from widelimit.lab import sup_ltilde as sl
from widelimit.lab import frames as fr
from widelimit.lab.experiments.sup_ltilde import block_bound


def _enumerate_rademacher(W, p):
    """(A, B) for m = 3 by summing over all 3^n inputs x in {-1, 0, 1}^n (probabilities p/2, 1-p, p/2)."""
    M = W.T @ W
    n = M.shape[0]
    A = B = 0.0
    for x in itertools.product((-1.0, 0.0, 1.0), repeat=n):
        x = np.array(x)
        k = np.count_nonzero(x)
        prob = (p / 2) ** k * (1 - p) ** (n - k)
        f = (M @ x) ** 3
        A += prob * (x @ f)
        B += prob * (f @ f)
    return A, B


@pytest.mark.parametrize("p", [0.07, 0.5, 1.0])
def test_objective_equals_exhaustive_enumeration(p):
    W = np.random.default_rng(1).standard_normal((3, 6)) * 0.6
    A, B = _enumerate_rademacher(W, p)
    v, a, b = sl.ltilde3(W, p, "rademacher")
    assert a == pytest.approx(A, rel=1e-12) and b == pytest.approx(B, rel=1e-12)
    assert v == pytest.approx(2 * A - B, rel=1e-11, abs=1e-12)


@pytest.mark.parametrize("law", ["gaussian", "laplace", "uniform"])
@pytest.mark.parametrize("p", [0.003, 0.2, 1.0])
def test_objective_equals_the_cumulant_code(law, p):
    W = np.random.default_rng(2).standard_normal((4, 11)) * 0.5
    r = sp.ltilde(W, p, 3, law)
    v, a, b = sl.ltilde3(W, p, law)
    assert (a, b) == (pytest.approx(r.A, rel=1e-12), pytest.approx(r.B, rel=1e-12))
    assert v == pytest.approx(r.value, rel=1e-11)


@pytest.mark.parametrize("law", ["rademacher", "gaussian", "laplace"])
@pytest.mark.parametrize("p", [0.01, 0.3, 1.0])
def test_gradient_equals_central_finite_differences(law, p):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((3, 5)) * 0.5
    mu = sl.law_moments(law)
    _, g = sl.ltilde3_grad(W, p, mu)
    h = 1e-5
    fd = np.zeros_like(W)
    for idx in np.ndindex(*W.shape):
        E = np.zeros_like(W)
        E[idx] = h
        fd[idx] = (sl.ltilde3(W + E, p, law)[0] - sl.ltilde3(W - E, p, law)[0]) / (2 * h)
    # central differences err by O(h^2 f''') ~ 1e-10 relative here
    assert np.max(np.abs(g - fd)) <= 1e-7 * np.max(np.abs(g))
    assert sl.ltilde3_grad(W, p, mu)[0] == sl.ltilde3(W, p, law)[0]


def test_block_diagonal_value_is_the_sum_of_the_blocks():
    rng = np.random.default_rng(4)
    W1, W2 = rng.standard_normal((2, 5)) * 0.7, rng.standard_normal((3, 4)) * 0.6
    W = sl.block_diagonal(W1, W2)
    assert W.shape == (5, 9)
    for law in ("rademacher", "laplace"):
        parts = sp.ltilde(W1, 0.2, 3, law).value + sp.ltilde(W2, 0.2, 3, law).value
        assert sp.ltilde(W, 0.2, 3, law).value == pytest.approx(parts, rel=1e-12)


def test_rescale_is_the_best_scale():
    W = np.random.default_rng(5).standard_normal((3, 7))
    mu = sl.law_moments("gaussian")
    Wc, v = sl.rescale(W, 0.1, mu)
    assert sp.ltilde(Wc, 0.1, 3, "gaussian").value == pytest.approx(v, rel=1e-12)
    for c in (0.999, 1.001, 0.9, 1.1):
        assert sp.ltilde(c * Wc, 0.1, 3, "gaussian").value < v


def test_block_bound_is_the_best_assembly_by_brute_force():
    values = {5: 1.0, 10: 2.5, 20: 4.0}
    for d in (10, 20, 35, 50):
        bound, parts = block_bound(values, d)
        brute = max(sum(values[k] for k in combo)
                    for r in range(1, 11) for combo in itertools.combinations_with_replacement(
                        [k for k in values if k < d], r) if sum(combo) <= d)
        assert bound == pytest.approx(brute) and sum(parts) <= d and all(k < d for k in parts)
        assert bound == pytest.approx(sum(values[k] for k in parts))


def test_search_reaches_the_p_to_0_optimum_at_d_2():
    """d = 2: sup_W lim_{p->0} Ltilde/p = 2 * 4 * 6 / 15 = 3.2 (Rademacher), attained by a regular 7-gon;
    at p = 1e-8 the O(p^2) terms change Ltilde/p by < 1e-6."""
    p = 1e-8
    res = sl.search(2, p, "rademacher", ns=(7, 9), restarts=3, max_iter=400, seed=0)
    assert res.value / p == pytest.approx(sp.sparse_limit_ceiling(2, 3, "rademacher"), rel=1e-5)
    assert res.value / p <= sp.sparse_limit_ceiling(2, 3, "rademacher") * (1 + 1e-9)
    assert res.value >= sp.unsuperposed_optimum(p, 2, 3, "rademacher")
    assert len(res.runs) == 1 + 6 and res.as_dict()["best_start"] == "random"


def test_certify_agrees_with_monte_carlo():
    W = np.random.default_rng(6).standard_normal((3, 6)) * 0.6
    Wc, v = sl.rescale(W, 0.3, sl.law_moments("laplace"))
    c = sl.certify(Wc, 0.3, "laplace", n_samples=20_000, seed=1)
    assert c["value"] == pytest.approx(v, rel=1e-12) and c["rel_diff_cumulant"] < 1e-12
    assert abs(c["mc_z"]) < 4 and c["mc_stderr"] > 0 and c["n_samples"] == 20_000


def test_sup_ltilde_experiment_quick(quick_experiment):
    res, out = quick_experiment("sup-ltilde")
    cfg = res["config"]
    weights = np.load(out / "sup-ltilde-weights.npz")
    assert len(res["rows"]) == len(cfg["laws"]) * len(cfg["ds"]) * len(cfg["ps"])
    for r in res["rows"]:
        W = weights[f"{r['law']}_d{r['d']}_p{r['p']:g}"].astype(np.float64)
        assert W.shape == (r["d"], r["n"])
        # the stored weights reach the reported value (cumulant code, independent of the search's formula)
        assert sp.ltilde(W, r["p"], 3, r["law"]).value == pytest.approx(r["value"], rel=1e-12)
        assert abs(r["certificate"]["mc_z"]) < 4.5
        # the unsuperposed optimum is one of the starts, and float32 rounding costs at most ~1e-6
        assert r["value"] >= sp.unsuperposed_optimum(r["p"], r["d"], 3, r["law"]) * (1 - 1e-5)
        assert r["n_runs"] == len(r["runs"]) and max(x["value"] for x in r["runs"]) == r["value_search"]
        col = {c["d"]: c["value"] for c in res["rows"] if c["law"] == r["law"] and c["p"] == r["p"]}
        smaller = [v for d, v in col.items() if d < r["d"]]
        assert r["block_bound"] >= max(smaller, default=0.0)           # embedding a smaller d is a block
        assert r["block_ok"] == (r["value"] >= r["block_bound"] * (1 - 1e-9))
    # the random-frame check, recomputed with the pairing formula (the experiment uses the cumulant code)
    for r in res["rows"]:
        best = max(sl.rescale(fr.random_frame(r["d"], f * r["d"], seed=r["d"] * 1000 + f).vectors, r["p"],
                              sl.law_moments(r["law"]))[1] for f in cfg["frame_factors"])
        assert r["frame_value"] == pytest.approx(best, rel=1e-10)
        assert r["frame_ok"] == (r["value"] >= r["frame_value"] * (1 - 1e-9))
        assert r["trusted"] == all(c["block_ok"] and c["frame_ok"] and not c["uses_cap"] for c in res["rows"]
                                   if c["law"] == r["law"] and c["p"] == r["p"])
    # Rademacher at p = 1: the unsuperposed value d is what the search finds at these sizes
    for r in res["rows"]:
        if r["law"] == "rademacher" and r["p"] == 1.0:
            assert r["value"] == pytest.approx(r["d"], rel=1e-9)
    assert res["summary"]["n_searches"] == sum(r["n_runs"] for r in res["rows"])
