"""Phenomena experiments: each key claim checked against an independent computation."""

import json

import numpy as np
import pytest
from scipy import integrate, optimize

import widelimit as wl
from widelimit.coding.fixed_dictionary import fixed_dictionary_objective
from widelimit.data import datasets
from widelimit.lab.experiments import antipodal, get, names
from widelimit.exact.objective import huber_h


# ---------------------------------------------------------------- antipodal


@pytest.mark.parametrize("p, width", [(0.3, 1), (0.7, 2)])
def test_antipodal_width_at_p(p, width):
    lam = 0.1  # well below the active values (>= 1)
    X, t = datasets.sparse_variable(400, 8, n_active=int(p * 400), low=1.0, high=3.0, seed=0)
    sol = wl.solve(X, lam=lam)
    assert sol.width == width and sol.certified
    u = t["direction"]
    if width == 2:
        assert sol.dictionary[0] @ sol.dictionary[1] == pytest.approx(-1.0, abs=1e-12)
    else:
        assert sol.dictionary[0] @ u == pytest.approx(1.0, abs=1e-12)
    # independent 1-D computation of b*: minimise (1/N) sum h(|s - beta|) with scipy
    s = t["values"]
    res = optimize.minimize_scalar(lambda bt: huber_h(np.abs(s - bt), lam=lam).mean(), bounds=(-1, 3),
                                   method="bounded", options={"xatol": 1e-12})
    assert sol.bias @ u == pytest.approx(res.x, abs=1e-6)
    assert np.linalg.norm(sol.bias - (sol.bias @ u) * u) < 1e-9
    if p < 0.5:
        assert sol.bias @ u == pytest.approx(antipodal.bias_below_threshold(p, lam), rel=1e-10)
    assert wl.solve(X, lam=lam, signed=True).width == 1


def test_uniform_threshold_closed_form_matches_quadrature():
    low, high = 1.0, 3.0
    for lam in (0.1, 0.5, 0.7, 1.0, 1.3, 1.6, 2.5):
        g, _ = integrate.quad(lambda s: np.clip(s / lam - 1, -1, 1), low, high, points=[lam, 2 * lam])
        g /= high - low
        expect = 1 / (1 + g) if g > 0 else np.inf
        assert antipodal.uniform_threshold(lam, low, high) == pytest.approx(expect, rel=1e-10)
    assert antipodal.uniform_threshold(0.4, low, high) == 0.5                        # all s >= 2 lam
    assert antipodal.uniform_threshold(1.6, low, high) == pytest.approx(1.6 / 2.0)  # all s <= 2 lam: lam / E s


def test_antipodal_threshold_is_exact_on_a_sample():
    # zeros added one by one flip the antipodal atom exactly where p crosses 1/(1+g)
    rng = np.random.default_rng(5)
    values = rng.uniform(0.6, 2.0, 40)
    lam = 0.7
    pstar = antipodal.antipodal_threshold(values, lam)
    assert 0.5 < pstar < 1
    u = np.array([0.6, 0.8])
    for z in range(20, 60):
        X = np.vstack([values[:, None] * u, np.zeros((z, 2))])
        sol = wl.solve(X, lam=lam)
        p = 40 / (40 + z)
        assert bool(np.any(sol.dictionary @ u < 0)) == (p > pstar), z


def _line_optimum(s, lam):
    """The wide limit of collinear data x_i = s_i u, by a 1-D computation: min_beta mean h(|s_i - beta|).

    Returns ``(beta*, value, atoms)`` with ``atoms`` the set of signs (+1: +u, -1: -u) of the narrowest
    optimum (a point beyond lam above beta* needs +u, one beyond lam below needs -u), or ``None`` when
    a point sits within 1e-7 of lam from beta* (then the 1-D answer is not decisive).
    """
    def h(r):  # the per-point wide-limit cost ``h_lam`` (theory.md §3), written out here
        return np.where(r <= lam, r * r, 2 * lam * r - lam * lam)

    res = optimize.minimize_scalar(lambda bt: h(np.abs(s - bt)).mean(), bounds=(s.min() - 1, s.max() + 1),
                                   method="bounded", options={"xatol": 1e-12})
    r = s - res.x
    if np.any(np.abs(np.abs(r) - lam) < 1e-7):
        return res.x, res.fun, None
    return res.x, res.fun, {sign for sign, hit in ((1, np.any(r > lam)), (-1, np.any(r < -lam))) if hit}


def _json(path):
    return json.loads(path.read_text(), parse_constant=pytest.fail)


def test_antipodal_experiment_quick(quick_experiment):
    """The experiment's JSON against 1-D computations on the same data and the threshold by quadrature."""
    _, tmp_path = quick_experiment("antipodal")
    res = _json(tmp_path / "antipodal.json")
    assert (tmp_path / "antipodal.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    st, g = res["setting"], res["grid"]
    N, dim, low, high = g["n_points"], st["dim"], st["low"], st["high"]
    checked = 0
    for a, lam in enumerate(g["lams"]):
        for j, p in enumerate(g["ps"]):
            _, t = datasets.sparse_variable(N, dim, n_active=int(round(p * N)), low=low, high=high, seed=1)
            _, _, atoms = _line_optimum(t["values"], lam)
            if atoms is None:
                continue
            checked += 1
            assert g["width"][a][j] == len(atoms), (lam, p)
            assert g["antipodal"][a][j] == (-1 in atoms), (lam, p)
            assert g["signed_width"][a][j] == min(1, len(atoms)), (lam, p)  # one line carries both signs
    assert checked >= 0.9 * len(g["lams"]) * len(g["ps"])
    assert g["pair_cosine_max_dev"] < 1e-12 and g["max_rel_gap_or_signed_value_diff"] < 1e-9
    # the threshold: the bisection's bracket of adjacent zero counts holds p* = 1/(1+g), g by numpy here
    values = np.random.default_rng(7).uniform(low, high, 200)
    for row in res["threshold"]:
        lam = row["lam"]
        pstar = 1.0 / (1.0 + np.mean(np.clip(values / lam - 1.0, -1.0, 1.0)))
        p_lo, p_hi = row["numeric_bracket"]
        assert p_lo <= pstar <= p_hi
        assert (200 / p_lo - 200) - (200 / p_hi - 200) == pytest.approx(1.0)  # adjacent numbers of zeros
        gq = integrate.quad(lambda v: np.clip(v / lam - 1, -1, 1), low, high, points=[lam, 2 * lam])[0] / (high - low)
        assert row["analytic_population"] == pytest.approx(1 / (1 + gq), rel=1e-9)
    # the bias along u: the 1-D optimum, and p lam / (1 - p) below the threshold
    b = res["bias"]
    for p, beta in zip(b["ps"], b["beta"]):
        _, t = datasets.sparse_variable(N, dim, n_active=int(round(p * N)), low=low, high=high, seed=1)
        beta1d, _, atoms = _line_optimum(t["values"], b["lam"])
        if atoms is not None:
            assert beta == pytest.approx(beta1d, abs=1e-6), p
        if t["p"] * b["lam"] / (1 - t["p"]) <= b["lam"]:
            assert beta == pytest.approx(t["p"] * b["lam"] / (1 - t["p"]), rel=1e-9), p
    # a dense symmetric variable: the pair (-u, +u) with nonnegative codes, one line with signed codes; same value
    d = res["dense_symmetric"]
    _, td = datasets.dense_symmetric(200, dim, seed=2)
    _, value1d, atoms = _line_optimum(td["values"], d["lam"])
    assert atoms == {1, -1} and d["width"] == 2 and d["signed_width"] == 1
    assert d["pair_cosine"] == pytest.approx(-1.0, abs=1e-12)
    assert d["value"] == pytest.approx(value1d, rel=1e-9) and d["signed_value"] == pytest.approx(value1d, rel=1e-9)


# ---------------------------------------------------------------- exclusive and rays


def test_exclusive_experiment_quick(quick_experiment):
    """The experiment's JSON against the closed-form optimum of exclusive categories.

    The closed form is that of theory.md §3 (one atom per ray, code ``r - lam``); its consequences for
    exclusive categories are derived in docs/experiments/exclusive.md.

    At b* = c with the category directions as atoms, an active point c + s u_j has code s - lam and
    residual lam u_j, so its cost is h(s) = 2 lam s - lam^2 and <u_d, r> = -lam/(K-1) for d != j; an
    inactive point has residual 0. Hence the code margin lam K/(K-1) (lam with inactive points) and
    the smallest off-support dual entry (lam/N) min(K/(K-1), 1 if inactive points).
    """
    _, tmp_path = quick_experiment("exclusive")
    res = _json(tmp_path / "exclusive.json")
    assert (tmp_path / "exclusive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lam = res["lam"]
    assert len(res["instances"]) == 6
    for r in res["instances"]:
        K, n_in = r["K"], r["n_inactive"]
        ppc = (r["n_points"] - n_in) // K
        _, t = datasets.exclusive_categories(K, max(12, K), ppc, n_inactive=n_in, seed=K)
        s = t["magnitudes"]
        value = np.where(s > 0, 2 * lam * s - lam**2, 0.0).mean()
        assert r["width"] == K
        assert r["value"] == pytest.approx(value, rel=1e-12)
        assert value * (1 - 1e-9) <= r["lower_bound"] <= value * (1 + 1e-12)
        assert r["bias_error"] < 1e-9 and r["max_atom_direction_error"] < 1e-12
        margin = lam if n_in else lam * K / (K - 1)
        assert r["code_margin"] == pytest.approx(margin, rel=1e-9)
        assert r["dual_offsupport_min"] == pytest.approx(lam / r["n_points"] * min(K / (K - 1), 1 if n_in else 2),
                                                         rel=1e-9)
        foc = r["stationarity"]
        assert max(foc["code_active_error"], foc["atom_gradient"], foc["bias_residual"]) < 1e-9
    a = res["asymmetric"]  # category 0 keeps one ray, every other point is its own
    assert a["certified"] and a["width"] == 1 + a["n_points"] - a["n_category0"]


def test_rays_experiment_quick(quick_experiment):
    res, tmp_path = quick_experiment("rays")
    assert res["width"] == res["n_rays_true"] == 6 and res["certified"] and res["core_codes_zero"]
    assert res["bias_error"] < 1e-9 and res["atoms_match_rays_max_error"] < 1e-12
    assert res["huber_vs_geometric_distance"] > 0.1
    # independent: geometric median by scipy, Huber median at large lam = mean
    X, _ = datasets.balanced_rays2d(1.0)
    gm = optimize.minimize(lambda b: np.linalg.norm(X - b, axis=1).sum(), X.mean(axis=0), method="Nelder-Mead",
                           options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 5000}).x
    assert np.allclose(res["geometric_median"], gm, atol=1e-5)
    assert res["path_large_lam_to_mean"] < 1e-9 and res["path_small_lam_to_geometric_median"] < 1e-2
    assert res["path_max_rel_gap"] < 1e-9
    assert (tmp_path / "rays.png").exists()


def test_experiments_registered():
    assert {"antipodal", "absorption", "splitting", "exclusive", "rays"} <= set(names())


# ---------------------------------------------------------------- absorption (exact parts)


def _cvxpy_codes_value(X, W, b, lam):
    """Independent: optimal nonnegative codes for fixed (W, b) by cvxpy, mean objective."""
    import cvxpy as cp

    Z = cp.Variable((X.shape[0], W.shape[0]), nonneg=True)
    obj = cp.sum_squares(Z @ W + np.ones((X.shape[0], 1)) @ b[None, :] - X) + 2 * lam * cp.sum(Z)
    prob = cp.Problem(cp.Minimize(obj / X.shape[0]))
    prob.solve(solver=cp.CLARABEL)
    return prob.value


def test_absorbed_dictionary_beats_hierarchical_with_certified_codes():
    from widelimit.lab.experiments import absorption as A

    lam, a, c = 0.5, 2.0, 1.5
    X, t = datasets.hierarchical(3, 6, 6, parent_scale=a, child_scale=(c, c), n_parent_only=6, n_inactive=6, seed=0)
    b0 = np.zeros(X.shape[1])
    Wh, Wa = A.hierarchical_dictionary(t), A.absorbed_dictionary(X, t)
    assert np.allclose(Wa[1:] @ t["parent"], a / np.hypot(a, c))         # absorbed atoms carry the parent
    rh = fixed_dictionary_objective(X, Wh, b0, lam=lam)
    ra = fixed_dictionary_objective(X, Wa, b0, lam=lam)
    # certified: the gaps are far below the difference, so L_abs < L_hier is proven
    assert rh["gap"] < 1e-8 and ra["gap"] < 1e-8
    assert ra["value"] + ra["gap"] < rh["value"] - rh["gap"]
    # independent computations: closed form and cvxpy
    frac = np.mean(t["labels"] >= 0)
    assert rh["value"] - ra["value"] == pytest.approx(frac * float(A.absorption_gain(a, c, lam)), rel=1e-7)
    assert rh["value"] == pytest.approx(_cvxpy_codes_value(X, Wh, b0, lam), rel=1e-6)
    assert ra["value"] == pytest.approx(_cvxpy_codes_value(X, Wa, b0, lam), rel=1e-6)
    # the parent fires on every child point with the hierarchical atoms, on none with the absorbed ones
    assert A._parent_firing(rh["codes"], 0, t) == 1.0 and A._parent_firing(ra["codes"], 0, t) == 0.0


def test_fixed_dictionary_objective_with_optimal_bias_is_certified():
    import cvxpy as cp
    from widelimit.lab.experiments import absorption as A

    lam = 0.5
    X, t = datasets.hierarchical(2, 4, 5, child_scale=(1.0, 2.0), n_parent_only=4, n_inactive=3, seed=1)
    W = A.absorbed_dictionary(X, t)
    r = fixed_dictionary_objective(X, W, lam=lam)
    # independent: SCS on the joint convex problem (different solver than the one used inside)
    N, n = X.shape
    Z = cp.Variable((N, W.shape[0]), nonneg=True)
    b = cp.Variable(n)
    obj = cp.sum_squares(Z @ W + np.ones((N, 1)) @ cp.reshape(b, (1, n), order="C") - X) + 2 * lam * cp.sum(Z)
    prob = cp.Problem(cp.Minimize(obj / N))
    prob.solve(solver=cp.SCS, eps=1e-9)
    assert r["gap"] <= 1e-7 * r["value"]
    assert r["value"] - r["gap"] <= prob.value + 1e-6 and r["value"] == pytest.approx(prob.value, rel=1e-5)
    # the bias step leaves zero-mean residuals
    R = X - r["bias"] - r["codes"] @ W
    assert np.allclose(R.mean(axis=0), 0, atol=1e-12)


def test_absorption_gain_closed_form():
    from widelimit.lab.experiments import absorption as A

    a, c = 2.0, 1.5
    lam = np.linspace(0.05, 1.4, 50)  # a, c > lam: gain = 2 lam (a + c - sqrt(a^2 + c^2)) - lam^2 > 0
    assert np.allclose(A.absorption_gain(a, c, lam), 2 * lam * (a + c - np.hypot(a, c)) - lam**2)
    rng = np.random.default_rng(0)
    aa, cc, ll = rng.uniform(0, 3, (3, 2000))
    g = A.absorption_gain(aa, cc, ll)
    assert g.min() >= -1e-12                                   # absorption never loses at bias 0
    r = np.hypot(aa, cc)
    assert np.all(g[r > ll * (1 + 1e-6)] > 0) and np.allclose(g[r <= ll], 0, atol=1e-12)
    assert A.absorption_gain(1.0, 1.0, 1.5) == pytest.approx(0, abs=1e-12) and A.absorption_gain(1.0, 1.0, 1.2) > 0


# ---------------------------------------------------------------- experiments using the gradient solver


def test_absorption_experiment_quick(quick_experiment):
    res, tmp_path = quick_experiment("absorption")
    assert res["max_abs_err_delta_b0"] < 1e-8 and res["max_certified_gap"] < 1e-8
    for x in res["cells"]:
        assert x["delta_b0"] >= -1e-9                      # absorption never loses at bias 0
        if x["wide_limit"]["width"] > 0:
            # sparse features: the wide-limit optimum and the learned width-(K+1) dictionary are absorbed,
            # and the parent stops firing on child points
            assert x["wide_limit"]["kind"] == "absorbed" and x["learned"]["kind"] == "absorbed"
            assert x["learned"]["parent_firing_on_children"] == 0.0
            assert x["exact"]["hierarchical"]["parent_firing_b0"] == 1.0
        assert x["wide_limit"]["learned_rel_gap"] >= -1e-9   # nothing beats the certified bound
    assert (tmp_path / "absorption.png").exists()


def test_splitting_frontier_quick(quick_experiment):
    res, tmp_path = quick_experiment("splitting")
    fr = res["hierarchical"]["frontier"]
    v, lb = np.array(fr["values"]), fr["lower_bound"]
    assert np.all(np.diff(v) <= 1e-9 * v[:-1])               # non-increasing in width
    assert np.all(v >= lb * (1 - 1e-9))                       # never below the certified bound
    k = fr["widths"].index(fr["n_rays"])
    assert v[k] - lb <= 1e-8 * v[k]                           # meets the bound at the ray count
    assert v[k - 1] - lb > 1e-3 * v[k - 1]                    # and not one atom earlier
    assert fr["saturation_width"] == fr["n_rays"]
    assert res["hierarchical"]["atoms_from_frontier_fits"]   # the atoms shown are the frontier's fits
    # independent: the bound is the Huber value at the certified median; the exact solution attains it
    X, t = datasets.hierarchical(3, 7, 6, parent_scale=2.0, child_scale=(1.5, 1.5), n_parent_only=6,
                                 n_inactive=48, seed=1)
    sol = wl.solve(X, lam=0.5)
    assert sol.width == fr["n_rays"] and sol.value == pytest.approx(lb, rel=1e-10)
    d = res["digits"]["frontier"]
    assert all(x >= d["lower_bound"] * (1 - 1e-9) for x in d["values"]) and d["values"][-1] < d["values"][0]
    assert (tmp_path / "splitting.png").exists()


def test_cli_experiment_json_and_listing(tmp_path, capsys):
    from widelimit.cli import main

    assert main(["experiment", "exclusive", "--quick", "--json", "--out", str(tmp_path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["all_widths_equal_K"]
    assert main(["experiment"]) == 0
    listed = capsys.readouterr().out
    assert all(n in listed for n in ("antipodal", "absorption", "splitting", "exclusive", "rays"))
    assert main(["experiment", "nonexistent"]) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_bias_formula_and_its_condition_against_a_1d_minimisation():
    """theory.md §6.1: beta* = p lam/(1-p) iff p <= 1/2 and every active s >= lam/(1-p) (uniform [1, 3] values)."""
    def beta_star(p, lam):
        h = lambda r: np.where(r <= lam, r * r, 2 * lam * r - lam * lam)
        def H(beta):
            act = integrate.quad(lambda s: float(h(abs(s - beta))), 1.0, 3.0, points=[beta - lam, beta, beta + lam],
                                 epsabs=1e-14, epsrel=1e-13)[0] / 2.0
            return (1 - p) * float(h(abs(beta))) + p * act
        return optimize.minimize_scalar(H, bounds=(-lam, 3.0), method="bounded", options={"xatol": 1e-11}).x
    assert beta_star(0.6, 1.3) == pytest.approx(1.1555, abs=1e-4)      # not 0.6 * 1.3 / 0.4 = 1.95
    assert 0.6 < antipodal.uniform_threshold(1.3, 1.0, 3.0)             # although below the threshold
    n_holds = 0
    for lam in (0.2, 0.45, 0.8, 1.3):
        for p in (0.1, 0.3, 0.45, 0.5, 0.6):
            if p >= antipodal.uniform_threshold(lam, 1.0, 3.0):
                continue
            holds = bool(antipodal.bias_formula_holds(p, lam, 1.0))
            err = abs(beta_star(p, lam) - float(antipodal.bias_below_threshold(p, lam)))
            assert (err < 1e-7) == holds, (lam, p, err)
            n_holds += holds
    assert 0 < n_holds < 20
