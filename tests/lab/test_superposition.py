"""Tests for widelimit.lab.superposition and widelimit.lab.frames (tied-weight power-activation autoencoder)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from widelimit.lab import frames as fr
from widelimit.lab import superposition as sp
from widelimit.lab import superposition_train as spt

LAWS = ["rademacher", "gaussian", "uniform", "laplace"]


# ---------------------------------------------------------------------------------------
# independent oracles
# ---------------------------------------------------------------------------------------


def m3_by_pairing(W, p, law):
    """Ltilde for m = 3 written out by pairing indices (docs/superposition.md), not via cumulants."""
    law = sp.get_law(law)
    mu2, mu4, mu6 = law.moment(2), law.moment(4), law.moment(6)
    M = W.T @ W
    dg = np.diag(M)
    s2, s4, s6 = (M**2).sum(1), (M**4).sum(1), (M**6).sum(1)
    A = p * mu4 * np.sum(dg**3) + 3 * p * p * mu2**2 * np.sum(dg * (s2 - dg**2))
    B = np.sum(
        p * mu6 * s6
        + 15 * p**2 * mu4 * mu2 * (s4 * s2 - s6)
        + 15 * p**3 * mu2**3 * (s2**3 - 3 * s2 * s4 + 2 * s6)
    )
    return 2 * A - B


def brute_force_rademacher(W, p, m):
    """Exact expectation by enumerating all 3^n inputs x in {-1, 0, 1}^n."""
    M = W.T @ W
    n = M.shape[0]
    tot = 0.0
    for x in itertools.product((-1.0, 0.0, 1.0), repeat=n):
        x = np.array(x)
        pr = np.prod(np.where(x == 0, 1 - p, p / 2))
        f = (M @ x) ** m
        tot += pr * (2 * x @ f - f @ f)
    return tot


def random_W(seed, d=3, n=6, scale=0.6):
    return np.random.default_rng(seed).standard_normal((d, n)) * scale


# ---------------------------------------------------------------------------------------
# exact formulas
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 5, 7])
def test_exact_matches_enumeration(m):
    W = random_W(m, d=3, n=5)
    for p in (0.07, 0.5, 1.0):
        assert sp.ltilde(W, p, m).value == pytest.approx(brute_force_rademacher(W, p, m), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("law", LAWS)
def test_m3_cumulants_equal_pairing_formula(law):
    for seed in range(3):
        W = random_W(seed, d=4, n=9)
        for p in (1e-3, 0.2, 1.0):
            assert sp.ltilde(W, p, 3, law).value == pytest.approx(m3_by_pairing(W, p, law), rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("law", LAWS)
def test_m1_closed_form(law):
    W = random_W(5, d=3, n=7)
    M = W.T @ W
    p = 0.3
    want = p * sp.get_law(law).moment(2) * (2 * np.trace(M) - np.sum(M * M))
    assert sp.ltilde(W, p, 1, law).value == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    "m,law,p",
    [(1, "rademacher", 0.3), (1, "gaussian", 0.5), (3, "rademacher", 0.2), (3, "gaussian", 0.3),
     (3, "uniform", 0.5), (3, "laplace", 0.1), (5, "uniform", 0.4)],
)
def test_exact_agrees_with_monte_carlo(m, law, p):
    W = random_W(100 + m, d=3, n=6, scale=0.5)
    ex = sp.ltilde(W, p, m, law)
    mc = sp.ltilde(W, p, m, law, method="mc", n_samples=60_000, batch_size=30_000, seed=7, device="cpu")
    assert mc.stderr > 0
    assert abs(mc.value - ex.value) <= 4 * mc.stderr, (ex.value, mc.value, mc.stderr)
    assert ex.loss == pytest.approx(W.shape[1] * p * sp.get_law(law).moment(2) - ex.value)


def test_float32_and_torch_input():
    import torch

    W = random_W(3)
    v = sp.ltilde(W, 0.2, 3).value
    assert sp.ltilde(W.astype(np.float32), 0.2, 3).value == pytest.approx(v, rel=1e-5)
    assert sp.ltilde(torch.tensor(W), 0.2, 3).value == pytest.approx(v, rel=1e-12)


def test_chunked_rows_equal_full():
    W = random_W(4, d=4, n=11)
    law = sp.get_law("gaussian")
    full = sp._exact_AB_numpy(W, 0.2, 3, law)
    chunked = sp._exact_AB_numpy(W, 0.2, 3, law, rows=3)
    assert np.allclose(full, chunked, rtol=1e-13)


def test_gram_power_sums_reused_across_p_and_laws():
    W = random_W(11, d=4, n=10)
    g = sp.gram_power_sums(W, 3)
    for law in ("rademacher", "laplace"):
        for p in (1e-6, 0.3):
            c, v = sp.best_scaled_value(g, p, 3, law)
            r = sp.optimal_scale(W, p, 3, law)
            assert (c, v) == pytest.approx((r.c, r.value), rel=1e-12)


def test_torch_exact_matches_numpy():
    import torch

    W = random_W(9, d=4, n=8)
    val = sp.ltilde_exact_torch(torch.tensor(W), 0.1, 3, "uniform")[0]
    assert float(val) == pytest.approx(sp.ltilde(W, 0.1, 3, "uniform").value, rel=1e-12)


# ---------------------------------------------------------------------------------------
# rescaling and baselines
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,law", [(1, "rademacher"), (3, "gaussian"), (3, "uniform"), (5, "rademacher")])
def test_optimal_rescaling_is_optimal(m, law):
    W = random_W(20 + m, d=3, n=7)
    p = 0.1
    r = sp.optimal_scale(W, p, m, law)
    assert r.c > 0
    assert r.value == pytest.approx(sp.ltilde(r.W, p, m, law).value, rel=1e-10)
    assert r.value >= r.value_at_1 - 1e-15
    for f in (0.9, 0.99, 0.999, 1.001, 1.01, 1.1):
        assert sp.ltilde(f * r.W, p, m, law).value < r.value
        assert r.at(f * r.c, m) < r.value


def test_rescaling_zero_when_A_nonpositive():
    c, v = sp._best_scale(-1.0, 2.0, 3)
    assert (c, v) == (0.0, 0.0)


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("d,n", [(2, 2), (3, 10), (4, 6)])
def test_linear_optimum_attained_and_not_exceeded(law, d, n):
    p = 0.37
    opt = sp.linear_optimum(p, d, law, n=n)
    assert opt == pytest.approx(p * d * sp.get_law(law).moment(2))
    Q, _ = np.linalg.qr(np.random.default_rng(d * n).standard_normal((n, d)))  # orthonormal columns
    assert sp.ltilde(Q.T, p, 1, law).value == pytest.approx(opt, abs=1e-8)
    for s in range(5):
        assert sp.optimal_scale(random_W(s, d, n), p, 1, law).value <= opt + 1e-12


def test_m1_trained_optimum_equals_p_d_mu2():
    for law in ("rademacher", "uniform"):
        res = spt.train(3, 9, 0.2, 1, law, restarts=1, steps=150, lr=0.05, seed=1)
        assert abs(res.value - 0.2 * 3 * sp.get_law(law).moment(2)) <= 1e-8


@settings(max_examples=25, deadline=None)
@given(
    W=st.lists(st.floats(-2, 2), min_size=12, max_size=12),
    p=st.floats(1e-4, 1.0),
)
def test_m1_never_beats_linear_optimum(W, p):
    W = np.array(W).reshape(3, 4)
    assert sp.ltilde(W, p, 1).value <= sp.linear_optimum(p, 3) + 1e-9


@pytest.mark.parametrize("m,law", [(1, "gaussian"), (3, "rademacher"), (3, "gaussian"), (5, "uniform")])
def test_unsuperposed_optimum(m, law):
    d, n, p = 3, 5, 0.2
    mu = sp.get_law(law)
    W = np.zeros((d, n))
    W[np.arange(d), np.arange(d)] = (mu.moment(m + 1) / mu.moment(2 * m)) ** (1 / (2 * m))
    best = sp.unsuperposed_optimum(p, d, m, law, n=n)
    assert sp.ltilde(W, p, m, law).value == pytest.approx(best, rel=1e-12)
    if law == "gaussian" and m == 3:
        assert best == pytest.approx(d * p * 9 / 15)
    # any diagonal M (orthogonal columns, arbitrary norms) does no better
    rng = np.random.default_rng(0)
    for _ in range(10):
        Wd = np.zeros((d, n))
        Wd[np.arange(d), rng.permutation(n)[:d]] = rng.uniform(0, 2, d)
        assert sp.ltilde(Wd, p, m, law).value <= best + 1e-12


def test_sparse_limit_ceiling_holds_for_small_p():
    m, p = 3, 1e-9
    for seed in range(5):
        d, n = 3, 12
        v = sp.optimal_scale(random_W(seed, d, n), p, m).value / p
        assert v <= sp.sparse_limit_ceiling(d, m, n=n) + 1e-6
    ff = sp.finite_field_optimum(5, 5 - 1, p, m)
    assert ff["value"] / p <= sp.sparse_limit_ceiling(25, m) * (1 + 1e-6)
    assert sp.sparse_limit_ceiling(4, 3) == pytest.approx(4 * 6 * 8 / 15, rel=1e-15)  # not C(6, 3) = 20


def _welch_ratio_max(d, m, n, seed):
    """Maximise (sum_i ||w_i||^{2m})^2 / sum_ij <w_i, w_j>^{2m} over W (d x n) by L-BFGS (analytic gradient)."""
    from scipy.optimize import minimize

    def f(x):
        W = x.reshape(d, n)
        G = W.T @ W
        s = np.diag(G)
        a, b = np.sum(s**m), np.sum(G ** (2 * m))
        ga = 2 * m * W * s ** (m - 1)
        gb = 4 * m * W @ G ** (2 * m - 1)
        return -a * a / b, -(2 * a / b * ga - a * a / b**2 * gb).ravel()

    x0 = np.random.default_rng(seed).standard_normal(d * n)
    return -minimize(f, x0, jac=True, method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-12, "ftol": 1e-15}).fun


@pytest.mark.parametrize("d, expected", [(2, 3.2), (3, 7.0), (4, 12.8)])
def test_real_frames_reach_d_d2_d4_over_15_and_never_more(d, expected):
    """docs/superposition.md: the p -> 0 constant is d(d+2)...(d+2m-2)/(2m-1)!!, not C(d+m-1, m)."""
    m = 3
    assert sp.sphere_moment_constant(d, m) == pytest.approx(expected, rel=1e-15)
    assert expected < math.comb(d + m - 1, m)
    vals = [_welch_ratio_max(d, m, 4 * d * d, seed) for seed in range(4)]
    assert max(vals) <= expected * (1 + 1e-9)            # never exceeded
    assert max(vals) >= expected * (1 - 1e-6)            # and reached
    # E[u_1^{2m}] of a uniform unit vector by Monte Carlo: the moment identity behind the constant
    u = np.random.default_rng(0).standard_normal((400_000, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    assert 1 / np.mean(u[:, 0] ** (2 * m)) == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("m", [3, 5])
def test_a_spherical_design_attains_the_constant_in_the_plane(m):
    """A regular N-gon with N >= 2m + 1 is a spherical 2m-design of the circle: it attains 2.4...(2m)/(2m-1)!!,
    and so does the lab's exact Ltilde/p at tiny p, after the best rescaling."""
    N = 2 * m + 1
    t = 2 * np.pi * np.arange(N) / N
    V = np.vstack([np.cos(t), np.sin(t)])
    G = V.T @ V
    ratio = N * N / np.sum(G ** (2 * m))
    const = math.prod(range(2, 2 * m + 1, 2)) / math.prod(range(1, 2 * m, 2))
    assert ratio == pytest.approx(const, rel=1e-12) and sp.sphere_moment_constant(2, m) == pytest.approx(const)
    p = 1e-12
    assert sp.optimal_scale(V, p, m).value / p == pytest.approx(sp.sparse_limit_ceiling(2, m), rel=1e-6)


def test_bound_orders():
    o = sp.bound_orders(np.array([1e-9, 1.0]), 10, 3)
    assert o["lower"][0] == pytest.approx(1e-9 * 1000)
    assert o["lower"][1] == pytest.approx(10)
    assert o["upper"][1] == pytest.approx(10)


# ---------------------------------------------------------------------------------------
# features, training
# ---------------------------------------------------------------------------------------


def test_feature_stats():
    W = np.zeros((3, 5))
    W[0, 0] = W[1, 1] = 1.0
    W[2, 2] = W[2, 3] = 1.0  # features 2 and 3 share a dimension
    s = spt.feature_stats(W, 3)
    assert np.allclose(s.dimensionality, [1, 1, 0.5, 0.5, 0])
    assert s.represented.tolist() == [True, True, False, False, False]
    assert s.n_represented == 2
    assert np.allclose(s.isolated_gain[:2], 1.0)


def test_training_finds_superposition_when_sparse():
    d, n, p = 3, 8, 0.01
    res = spt.train(d, n, p, 3, restarts=2, steps=150, seed=0)
    assert res.value > 1.2 * res.unsuperposed
    assert res.stats.n_represented > d
    assert len(res.restart_values) == 2
    assert res.value == pytest.approx(sp.ltilde(res.W, p, 3).value, rel=1e-12)
    assert res.value <= p * sp.sparse_limit_ceiling(d, 3, n=n) * 1.05
    assert spt.critical_point(res.W, p, 3).local_max  # Adam + L-BFGS ends at a second-order stationary point


@pytest.mark.parametrize("p", [0.3, 0.001])
def test_unsuperposed_optimum_is_a_local_max(p):
    d, n, m = 3, 5, 3
    W = np.zeros((d, n))
    W[np.arange(d), np.arange(d)] = 1.0  # Rademacher: ||W_i||^(2m) = mu_4/mu_6 = 1
    st = spt.critical_point(W, p, m)
    assert st.grad_norm < 1e-12 and st.local_max
    assert st.n_flat == d * (d - 1) // 2  # only the rotations W -> U W are flat
    # a random point is not stationary; a perturbation off the rotations lowers Ltilde
    assert not spt.critical_point(random_W(0, d, n), p, m).local_max
    D = np.zeros((d, n))
    D[:, d:] = 1e-2 * np.random.default_rng(0).standard_normal((d, n - d))
    assert sp.ltilde(W + D, p, m).value < sp.ltilde(W, p, m).value


def test_training_on_monte_carlo_objective(one_torch_thread):
    """Adam on fresh Monte Carlo batches climbs the exact Ltilde nearly as far as Adam on the exact formula.

    Same start, steps and learning rate (no L-BFGS polish): measured 0.92 of the exact-objective run and
    2.65 times the value after one step. A wrong sign, law or mask in the Monte Carlo objective fails.
    """
    d, n, p = 3, 6, 0.1
    kw = dict(restarts=1, lr=0.05, seed=0, device="cpu", polish=False)
    mc = spt.train(d, n, p, 3, objective="mc", steps=300, batch_size=4096, **kw)
    start = spt.train(d, n, p, 3, objective="mc", steps=1, batch_size=4096, **kw)
    exact = spt.train(d, n, p, 3, objective="exact", steps=300, **kw)
    assert mc.value == pytest.approx(sp.ltilde(mc.W, p, 3).value, rel=1e-12)  # reported value is exact
    assert mc.value >= 0.85 * exact.value
    assert mc.value >= 2.0 * start.value


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"m": 2}, "odd"),
        ({"m": 0}, "odd"),
        ({"m": 3.0}, "odd"),
        ({"p": 0.0}, r"\(0, 1\]"),
        ({"p": 1.5}, r"\(0, 1\]"),
        ({"p": float("nan")}, r"\(0, 1\]"),
        ({"p": "x"}, r"\(0, 1\]"),
        ({"xi": "cauchy"}, "unknown law"),
        ({"method": "quad"}, "method"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"W": random_W(0), "p": 0.1, "m": 3, "xi": "rademacher"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sp.ltilde(**args)


def test_bad_weights():
    W = random_W(0)
    W[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"non-finite value at \[1, 2\]"):
        sp.ltilde(W, 0.1, 3)
    with pytest.raises(ValueError, match="2-D"):
        sp.ltilde(np.ones(4), 0.1, 3)
    with pytest.raises(ValueError, match="non-finite"):
        sp.optimal_scale(np.full((2, 2), np.inf), 0.1, 1)
    with pytest.raises(ValueError, match="odd"):
        spt.train(2, 3, 0.1, 4)
    with pytest.raises(ValueError, match="too many"):
        spt.critical_point(np.ones((50, 100)), 0.1, 3)
    with pytest.raises(ValueError, match="W0 has shape"):
        spt.train(2, 3, 0.1, 3, W0=np.ones((3, 2)))
    with pytest.raises(ValueError, match="prime power"):
        fr.finite_field_frame(6, 2)
    with pytest.raises(ValueError, match=r"\[0, q-1\]"):
        fr.finite_field_frame(5, 5)
    with pytest.raises(ValueError, match="zero column"):
        fr.coherence(np.zeros((2, 3)))


def test_custom_law_by_moments():
    law = sp.Law.from_moments("two-point", [1.0, 1.0, 1.0])  # moments of Rademacher up to order 6
    W = random_W(2)
    assert sp.ltilde(W, 0.2, 3, law).value == pytest.approx(sp.ltilde(W, 0.2, 3).value, rel=1e-13)
    with pytest.raises(ValueError, match="not given"):
        sp.ltilde(W, 0.2, 5, law)
    with pytest.raises(ValueError, match="sampler"):
        sp.ltilde(W, 0.2, 3, law, method="mc")
    with pytest.raises(ValueError, match="must be finite and > 0"):
        sp.ltilde(W, 0.2, 1, sp.Law.from_moments("bad", [-1.0]))


# ---------------------------------------------------------------------------------------
# GPU, experiments
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_monte_carlo_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    W = random_W(1, d=8, n=32, scale=0.3)
    ex = sp.ltilde(W, 0.1, 3, "gaussian")
    mc = sp.ltilde(W, 0.1, 3, "gaussian", method="mc", n_samples=2_000_000, batch_size=200_000, device="cuda")
    assert abs(mc.value - ex.value) <= 4 * mc.stderr
    res = spt.train(4, 16, 0.01, 3, restarts=1, steps=100, device="cuda")
    assert np.isfinite(res.value)


def test_experiments_quick(quick_experiment):
    """The five experiments' JSON numbers against closed forms and theorems, computed here independently."""
    from widelimit.lab import experiments

    names = experiments.names()
    todo = ["superposition-linear", "superposition-sparse-growth", "superposition-p-sweep",
            "superposition-gd", "superposition-frames"]
    out = {}
    for name in todo:
        assert name in names
        tmp_path = quick_experiment(name)[1]
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        out[name] = json.loads((tmp_path / f"{name}.json").read_text(), parse_constant=pytest.fail)
    mu = {"rademacher": {2: 1.0, 4: 1.0, 6: 1.0}, "gaussian": {2: 1.0, 4: 3.0, 6: 15.0}}  # E xi^k
    # m = 1: sup Ltilde = p d mu_2, and a frame V at its best scale has p mu_2 (tr G)^2 / ||G||_F^2, G = V^T V
    for r in out["superposition-linear"]["rows"]:
        opt = r["p"] * r["d"] * mu[r["law"]][2]
        assert r["optimum"] == pytest.approx(opt, rel=1e-12)
        assert r["trained"] == pytest.approx(opt, rel=1e-6)
        G = (lambda V: V.T @ V)(fr.random_frame(r["d"], r["n"], seed=r["n"]).vectors)
        assert r["random_frame"] == pytest.approx(r["p"] * mu[r["law"]][2] * np.trace(G) ** 2 / np.sum(G * G), rel=1e-9)
        assert r["random_frame"] <= opt * (1 + 1e-12)
    # very sparse regime, Rademacher: the p -> 0 ceiling is d(d+2)...(d+2m-2)/(2m-1)!!, the unsuperposed value d
    growth = out["superposition-sparse-growth"]
    for m in (1, 3):
        pts = growth[f"m={m}"]["points"]
        for t in pts:
            assert t["ceiling_over_p"] == pytest.approx(
                math.prod(t["d"] + 2 * j for j in range(m)) / math.prod(range(1, 2 * m, 2)), rel=1e-12)
            assert t["unsuperposed_over_p"] == pytest.approx(t["d"], rel=1e-12)
            if m == 1:  # the best-scaled finite-field frame, by the m = 1 closed form
                V = fr.finite_field_frame(t["q"], t["r"]).vectors
                G = V.T @ V
                assert t["value_over_p"] == pytest.approx(np.trace(G) ** 2 / np.sum(G * G), rel=1e-9)
        big = pts[len(pts) // 2:]
        fit = np.polyfit(np.log([t["d"] for t in big]), np.log([t["value_over_p"] for t in big]), 1)[0]
        assert growth[f"m={m}"]["slope_frames"] == pytest.approx(fit, rel=1e-9)
    assert growth["m=3"]["slope_frames"] > 2.0 and growth["m=1"]["slope_frames"] < 1.3  # d^m growth vs d
    # p-sweep: the unsuperposed optimum is d p mu_4^2 / mu_6 (m = 3); sparse inputs gain from superposition
    sweep = out["superposition-p-sweep"]
    for law, v in sweep["laws"].items():
        ps, d = np.array(sweep["p"]), sweep["d"]
        np.testing.assert_allclose(v["unsuperposed"], d * ps * mu[law][4] ** 2 / mu[law][6], rtol=1e-12)
        assert min(v["best_over_unsuperposed"][:4]) > 10  # p <= 1e-5: an order of magnitude above
    # Adam: the unsuperposed point is a local maximum whose only flat directions are the d(d-1)/2 rotations
    gd = out["superposition-gd"]
    d = gd["d"]
    for r in gd["rows"]:
        assert r["unsuperposed"] == pytest.approx(d * r["p"], rel=1e-12)
        pt = r["unsuperposed_point"]
        assert pt["grad_norm"] <= 1e-12 and pt["max_eigenvalue_rel"] <= 1e-12 and pt["n_flat"] == d * (d - 1) // 2
        assert r["from_unsuperposed_start"] == pytest.approx(r["unsuperposed"], rel=1e-6)  # Adam stays there
    sparse = min(gd["rows"], key=lambda r: r["p"])
    assert sparse["best"] > 1.5 * sparse["unsuperposed"] and sparse["n_represented"] > d
    # frames: finite-field coherence r / q (by numpy here), Welch bounds hold for every frame
    for r in out["superposition-frames"]["rows"]:
        d, n = r["d"], r["n"]
        assert r["welch"] == pytest.approx(math.sqrt((n - d) / (d * (n - 1))), abs=1e-15)
        assert r["ff_coherence_measured"] == pytest.approx(r["r"] / r["q"], abs=1e-12)
        if n <= 200:
            G = (lambda V: V.T @ V)(fr.finite_field_frame(r["q"], r["r"]).vectors)
            assert np.abs(G - np.diag(np.diag(G))).max() == pytest.approx(r["r"] / r["q"], abs=1e-12)
        assert r["random_coherence"] >= r["welch"] * (1 - 1e-12)
        assert min(r[f"ff_sum_ratio_m{m}"] for m in (1, 2, 3)) >= 1 - 1e-12
        assert min(r[f"random_sum_ratio_m{m}"] for m in (1, 2, 3)) >= 1 - 1e-12
