"""feature_stability (theory.md §5): margins against closed forms, witnesses recomputed in plain numpy."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

import widelimit as wl
from widelimit.exact import stability as stab

from fixtures.stability import check_witnesses, plain_objective, two_shared_rays


def hierarchical(lam=0.5):
    X, t = wl.datasets.hierarchical(3, 10, 20, parent_scale=2.0, child_scale=(1.0, 2.0), n_parent_only=20, seed=1)
    W = np.vstack([t["parent"], t["children"]])
    b = np.zeros(10)
    Z = wl.optimal_codes(X, W, b, lam=lam, tol=1e-12, dtype="float64", device="cpu").codes
    return X, W, Z, b, t


def test_hierarchical_parent_child_is_unstable_and_the_witness_absorbs():
    lam = 0.5
    X, W, Z, b, t = hierarchical(lam)
    res = wl.feature_stability(X, W, Z, b, lam=lam)
    # parent d = 0: every child e is active only where the parent is, so delta_0 >= 1 - <w_0, w_e> = 1
    assert res.ff_lower[0] == pytest.approx(1.0, abs=1e-12)
    assert res.ff_partner[0] in (1, 2, 3)
    # a child's support contains no other feature's support: its co-occurrence bound is 0
    assert np.all(res.ff_lower[1:] == 0.0)
    assert set(res.unstable.tolist()) == {0, 1, 2, 3}
    assert res.witness_moves[0] == "absorb"
    check_witnesses(res, X, W, Z, b, lam)
    # the absorbing witness turned the partner child toward the parent
    e = res.ff_partner[0]
    W2 = res.witnesses[0][0]
    assert W2[e] @ t["parent"] > 0.1 and abs(W[e] @ t["parent"]) < 1e-12


def exclusive_exact(K=4, lam=0.5, n_inactive=0):
    X, t = wl.datasets.exclusive_categories(K, 8, 15, n_inactive=n_inactive, seed=3)
    W = t["directions"]
    Z = np.zeros((X.shape[0], K))
    lab = t["labels"]
    on = lab >= 0
    Z[np.flatnonzero(on), lab[on]] = t["magnitudes"][on] - lam  # closed-form optimum (theory.md §3)
    return X, W, Z, t["centre"]


@pytest.mark.parametrize("n_inactive", [0, 10])
def test_exclusive_categories_are_stable_with_the_predicted_margins(n_inactive):
    K, lam = 4, 0.5
    X, W, Z, b = exclusive_exact(K, lam, n_inactive)
    res = wl.feature_stability(X, W, Z, b, lam=lam)
    assert res.verdict == ("stable",) * K and res.unstable.size == 0 and not res.witnesses
    margin = lam if n_inactive else lam * K / (K - 1)  # <u_d, lam u_e> = -lam/(K-1); residual 0 at inactive points
    np.testing.assert_allclose(res.code_margin, margin, rtol=1e-12)
    # (FF) holds with the weights it predicts: nu = 1 + 1/(K-1) = t_de on every other category
    assert np.all(res.ff_upper <= 1e-12) and np.all(res.ff_lower == 0)
    # curvature (2/N) sum z (z + lam): the residuals lam u_d have no component ⟂ u_d
    N = X.shape[0]
    np.testing.assert_allclose(res.curvature, (2 / N) * np.sum(Z * (Z + lam), axis=0), rtol=1e-10)


def test_wide_limit_optimum_is_stable_and_ff_holds_with_its_weights():
    X, _ = wl.datasets.symmetric_rays(6, 6, 8, seed=2)
    lam = 0.4
    sol = wl.solve(X, lam=lam)
    res = wl.feature_stability(X, sol.dictionary, sol.sparse_codes, sol.bias, lam=lam)
    assert res.unstable.size == 0
    assert np.nanmax(res.ff_upper) <= 1e-9


def test_spurious_stationary_point_with_a_dead_atom_is_found_by_reaiming_it():
    lam = 0.5
    X, W, Z, b = two_shared_rays(0.1, lam=lam)
    assert wl.first_order_conditions(X, W, Z, b, lam=lam).holds(1e-12)  # the first-order test is silent
    res = wl.feature_stability(X, W, Z, b, lam=lam)
    assert res.max_residual == pytest.approx(math.hypot(lam, 3.0 * math.sin(0.1)), rel=1e-12)
    # every first-order margin holds and the curvature is positive, but a slot is free (theory.md §5.4):
    # the dead atom is re-aimed at the longest residual, each live feature splits into it
    assert np.all(res.curvature[:2] > 0) and np.all(res.code_margin > 0)
    assert res.verdict == ("unstable",) * 3
    assert res.witness_moves == {0: "split", 1: "split", 2: "reaim"}
    # the re-aimed atom alone lowers N L by (||r|| - lam)^2; re-optimising the codes can only add to that
    gain = (res.max_residual - lam) ** 2 / 4
    assert res.value - res.witness_values[2] >= gain * (1 - 1e-9)
    check_witnesses(res, X, W, Z, b, lam)
    # verify tells it from the optimum
    assert wl.verify(X, W, Z, b, lam=lam).gap > 1e-3
    # without the dead atom the second-order test passes: phi small gives positive curvature
    X2, W2, Z2, b2 = two_shared_rays(0.1, lam=lam, dead=False)
    res2 = wl.feature_stability(X2, W2, Z2, b2, lam=lam)
    assert res2.verdict == ("stable", "stable")


def test_curvature_matches_a_finite_difference_and_its_witness():
    lam, rho, phi = 0.5, 1.0, 0.6
    X, W, Z, b = two_shared_rays(phi, rho=rho, lam=lam, dead=False)
    assert wl.first_order_conditions(X, W, Z, b, lam=lam).holds(1e-12)
    res = wl.feature_stability(X, W, Z, b, lam=lam)
    # closed form: (2/N) sum_{A_d} (z (z + lam) - <r, v>^2) with v = e2, <r_i, v> = +-rho sin phi
    z = rho * math.cos(phi) - lam
    pred = (2 / 4) * 2 * (z * (z + lam) - (rho * math.sin(phi)) ** 2)
    assert res.curvature[0] == pytest.approx(pred, rel=1e-12)
    # finite difference of the plain objective, turning atom 0 by theta toward e2, its codes 1-D optimal
    def along(th):
        u = np.array([math.cos(th), math.sin(th), 0.0])
        W2 = W.copy(); W2[0] = u
        Z2 = Z.copy()
        rho_ = X[:2] - b
        Z2[:2, 0] = np.maximum(rho_ @ u - lam, 0)
        return plain_objective(X, W2, Z2, b, lam)
    h = 1e-4
    fd = (along(h) - 2 * along(0) + along(-h)) / h**2
    assert fd == pytest.approx(pred, rel=1e-5)
    # rho cos(2 phi) < lam cos(phi) decides the sign (theory.md §5.4)
    assert (pred < 0) == (rho * math.cos(2 * phi) < lam * math.cos(phi))
    assert pred < 0 and set(res.unstable.tolist()) == {0, 1}
    assert res.witness_moves[0] == "curvature"
    check_witnesses(res, X, W, Z, b, lam)


def test_ff_distance_lp_against_cvxpy_and_the_bracket():
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    N, n, k, lam = 40, 6, 5, 0.3
    X = rng.standard_normal((N, n))
    W = rng.standard_normal((k, n))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    Z = sp.csr_array(np.where(rng.random((N, k)) < 0.3, rng.random((N, k)), 0.0))
    b = np.zeros(n)
    Wu, Zs = stab._normalise(W, Z)
    S = np.asarray(Zs.sum(axis=0)).ravel()
    live = S > 0
    Gm = Wu @ Wu.T
    low, _ = stab._ff_lower(Zs, Gm, live)
    for d in range(k):
        val = stab._ff_lp(Zs, S, Gm, live, d)
        others = [e for e in range(k) if e != d]
        inact = Zs.toarray()[:, d] == 0
        Q = Zs.toarray()[inact][:, others] / S[others]
        mu = cp.Variable(Q.shape[0], nonneg=True)
        prob = cp.Problem(cp.Minimize(cp.norm_inf(1 - Gm[d, others] - Q.T @ mu)))
        prob.solve(solver=cp.CLARABEL)
        assert val == pytest.approx(prob.value, abs=1e-7)
        assert low[d] <= val + 1e-12
        lo_n, up_n = stab._ff_nnls(Zs, S, Gm, live, d)  # the NNLS screening brackets the LP's value
        assert lo_n <= val + 1e-9 and val <= up_n + 1e-9
        # feature_stability with tol inside the bracket settles it to the same value
        if lo_n < up_n:
            tol = 0.5 * (max(lo_n, low[d]) + up_n)
            r = wl.feature_stability(X, W, Z, b, lam=lam, tol=tol, witnesses=False)
            assert r.ff_lower[d] <= val + 1e-9 <= r.ff_upper[d] + 2e-9
    # a feature whose support contains another's: the bound is attained
    Zc = Zs.toarray()
    Zc[:, 1] = np.where(Zc[:, 0] > 0, 0.5, 0.0)  # A_1 = A_0
    Zc[:, 2] = np.where(Zc[:, 0] > 0, Zc[:, 2], 0.0)  # A_2 ⊆ A_0
    Zs2 = sp.csr_array(Zc)
    S2 = Zc.sum(axis=0)
    low2, part2 = stab._ff_lower(Zs2, Gm, S2 > 0)
    assert part2[0] in (1, 2) and low2[0] == pytest.approx(max(1 - Gm[0, 1], 1 - Gm[0, 2]), abs=1e-14)
    assert stab._ff_lp(Zs2, S2, Gm, S2 > 0, 0) >= low2[0] - 1e-9


def test_stability_rows_hook_and_same_width_witness():
    lam = 0.5
    X, W, Z, b, _ = hierarchical(lam)
    rows, summary = stab.stability_rows(X, W, Z, b, lam=lam, max_witnesses=2)
    assert len(rows) == 4 and {r["feature"] for r in rows} == {0, 1, 2, 3}
    assert sum(r["verdict"] == "unstable" for r in rows) == summary["counts"]["unstable"] == 2
    assert rows[0]["ff_partner"] in (1, 2, 3)
    from widelimit.learn.same_width import same_width_witness

    out = same_width_witness(X, W, b, lam=lam, max_iter=200)
    fit = out["fit"]
    assert out["lower"] and out["value_found"] < out["value_given"]
    assert plain_objective(X, fit.dictionary, fit.codes, fit.bias, lam) == pytest.approx(out["value_found"], rel=1e-10)
    assert out["value_found"] >= wl.solve(X, lam=lam).lower_bound - 1e-12  # the wide-limit bound brackets it


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="lam"):
        wl.feature_stability(np.ones((3, 2)), np.eye(2), np.zeros((3, 2)), np.zeros(2), lam=-1)


def test_certify_report_carries_the_stability_rows(tmp_path):
    import csv

    from widelimit.sae.certify import certify_sae, write_sae_certificate
    from widelimit.sae.model import SAE

    lam = 0.5
    X, W, Z, b, _ = hierarchical(lam)
    W_dec = W * np.array([[1.0], [2.0], [0.5], [1.0]])  # norms are folded in: same unit atoms
    sae = SAE(W_dec=W_dec, b_dec=b, W_enc=W_dec.T.copy(), b_enc=np.zeros(4), dtype="float64")
    cert = certify_sae(X, sae, lam=lam, device="cpu", coding_tol=1e-10, batch_size=25, stability=True,
                       stability_witnesses=4, same_width_steps=100)
    sw = cert.same_width
    assert sw["lower"] and sw["value_found"] < cert.optimal_code_objective and sw["width"] == 4
    assert sw["message"].startswith("a dictionary of the same width reaches")
    assert sw["value_given"] == pytest.approx(cert.optimal_code_objective, rel=1e-8)
    assert cert.stability["counts"]["unstable"] == 4
    assert list(cert.features["stability_verdict"]) == ["unstable"] * 4
    assert cert.features["stability_ff_lower"][0] == pytest.approx(1.0, abs=1e-9)
    # the same witnesses' values as feature_stability on the same decoder and (certified) optimal codes
    ref = wl.feature_stability(X, W, Z, b, lam=lam, keep_witnesses=False)
    got = {w["feature"]: w["value"] for w in cert.stability["witnesses"]}
    assert set(got) == set(ref.witness_values)
    for d, v in got.items():
        assert v < cert.optimal_code_objective
    files = write_sae_certificate(cert, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "features.csv")))
    assert [r["stability_verdict"] for r in rows] == ["unstable"] * 4
    assert float(rows[0]["stability_ff_lower"]) == pytest.approx(1.0, abs=1e-9)
    assert any(p.name == "certificate.json" for p in files)


def test_ff_distance_off_the_cone_without_containment():
    """Features 1 and 2 fire only together, in equal shares, where 0 is off: the cone is the ray (1, 1).

    ``t_0 = (1 - c_01, 1 - c_02) = (0.8, 0.4)``; its ``l_inf`` distance to the ray is ``|0.8 - 0.4| / 2 = 0.2``,
    and no support contains another, so the co-occurrence bound is 0 and the NNLS screening must do the work.
    """
    w0 = np.array([1.0, 0, 0])
    w1 = np.array([0.2, math.sqrt(1 - 0.04), 0])
    w2 = np.array([0.6, 0, 0.8])
    W = np.vstack([w0, w1, w2])
    alpha = np.array([1.0, 2.0, 0.5])
    Z = np.zeros((5, 3))
    Z[:2, 0] = [1.0, 2.0]
    Z[2:, 1] = Z[2:, 2] = alpha
    X = Z @ W + 0.3  # data and bias are irrelevant to (FF)'s geometry
    Wu, Zs = stab._normalise(W, sp.csr_array(Z))
    S = np.asarray(Zs.sum(axis=0)).ravel()
    Gm = Wu @ Wu.T
    low, partner = stab._ff_lower(Zs, Gm, S > 0)
    assert low[0] == 0 and partner[0] == -1
    assert stab._ff_lp(Zs, S, Gm, S > 0, 0) == pytest.approx(0.2, abs=1e-9)
    lo, up = stab._ff_nnls(Zs, S, Gm, S > 0, 0)
    assert lo == pytest.approx(0.2, abs=1e-12) and up == pytest.approx(0.2, abs=1e-12)
    res = wl.feature_stability(X, W, Z, np.full(3, 0.3), lam=0.1, witnesses=False)
    assert res.ff_lower[0] == pytest.approx(0.2, abs=1e-12) and res.ff_upper[0] == pytest.approx(0.2, abs=1e-12)
    assert res.verdict[0] == "violated"  # a failed condition without a witness search is not "unstable"


def test_cli_certify_stability_on_an_optimal_sae(tmp_path, capsys):
    """At a certified global optimum no witness can exist below the wide-limit lower bound."""
    import json

    from fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens
    from widelimit.cli import main

    LAM = 0.5
    X, sae = orthogonal_rays_sae(LAM, seed=9)
    save_saelens(sae, tmp_path / "sae")
    np.save(tmp_path / "acts.npy", X)
    rc = main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "sae"), "--lam", str(LAM), "--json",
               "--stability", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    st = d["stability"]
    assert sum(st["counts"].values()) == d["d_sae"]
    for w in st["witnesses"]:
        assert w["value"] >= d["lower_bound"] - 1e-12
    header = (tmp_path / "out" / "features.csv").read_text().splitlines()[0].split(",")
    assert {"stability_verdict", "stability_ff_lower", "stability_code_margin"} <= set(header)
    assert main(["certify", str(tmp_path / "acts.npy"), str(tmp_path / "sae"), "--lam", str(LAM), "--device", "cpu",
                 "--stability"]) == 0
    out = capsys.readouterr().out
    assert "feature stability" in out and "unstable" in out
