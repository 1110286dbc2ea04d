"""widelimit experiment trained-predictions: its numbers against independent computations.

The planted control's threshold p* against a bisection on a 1-D minimisation (scipy), its certified optimum
against the 1-D Huber median, the absorption gains against a brute-force minimisation over codes, and the
lam calibration and the direction table on hand-built SAEs whose answers are known in closed form.
"""

import numpy as np
import pytest
from scipy import optimize

from widelimit.data import datasets
from widelimit.lab.experiments import trained_predictions as tp
from widelimit.sae.model import SAE


def _h(r, lam):
    return np.where(r <= lam, r * r, 2 * lam * r - lam * lam)


def _bias_1d(s, p, lam):
    """argmin_beta (1 - p) h(|beta|) + p mean h(|s - beta|) (zeros with weight 1 - p), by scipy."""
    f = lambda bt: (1 - p) * _h(abs(bt), lam) + p * _h(np.abs(s - bt), lam).mean()  # noqa: E731
    return optimize.minimize_scalar(f, bounds=(-1.0, float(s.max()) + 1), method="bounded",
                                    options={"xatol": 1e-13}).x


def _threshold_by_bisection(s, lam):
    """The activity at which the zeros leave the lam-ball around the optimal bias (-> the atom -u)."""
    lo, hi = 0.01, 0.99
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _bias_1d(s, mid, lam) > lam else (mid, hi)
    return 0.5 * (lo + hi)


def _min_code_cost(t, lam):
    """min_{z >= 0} (t - z)^2 + 2 lam z, by scipy (one coordinate along a unit atom)."""
    r = optimize.minimize_scalar(lambda z: (t - z) ** 2 + 2 * lam * z, bounds=(0.0, max(t, 0.0) + 1.0),
                                 method="bounded", options={"xatol": 1e-12})
    return min(r.fun, t * t)


def test_trained_predictions_quick(quick_experiment):
    pytest.importorskip("sae_lens")
    res, out = quick_experiment("trained-predictions")
    # planted control: p* of the sample against a bisection on the 1-D problem; all s >= 2 lam gives 1/2
    for c in res["control"]:
        X, truth = datasets.sparse_variable(c["n_points"], 8, n_active=int(round(c["p"] * c["n_points"])),
                                            low=1.0, high=3.0, seed=c["seed"])
        s = truth["values"][truth["values"] > 0]
        assert c["pstar"] == pytest.approx(_threshold_by_bisection(s, c["lam"]), abs=1e-6)
        assert c["pstar"] == 0.5
        # the certified optimum is the 1-D Huber median's value (theory.md §3, §6.1); the SAE cannot beat it
        allv = truth["values"]
        beta = _bias_1d(s, c["p"], c["lam"])
        assert c["optimum"] == pytest.approx(_h(np.abs(allv - beta), c["lam"]).mean(), rel=1e-7)
        assert c["sae_objective"] >= c["optimum"] * (1 - 1e-6)
        assert c["optimum_width"] == (2 if c["p"] > c["pstar"] else 1)
        assert c["predicted"] == (c["p"] > c["pstar"])
    by_p = {c["p"]: c for c in res["control"]}
    assert by_p[0.8]["found"] and by_p[0.8]["min_cos"] < -0.99      # the trained SAE learns the pair above p*
    assert not by_p[0.3]["found"]                                    # and not below
    # the absorption gains: brute force over codes for the two orthonormal atoms vs the one atom along the point
    ex = res["gain_examples"]
    lam = ex["lam"]
    assert len(ex["gain"]) == 20 and sum(g > 0 for g in ex["gain"]) >= 5     # not vacuous: real cases, some gains
    for a, c, g in zip(ex["a"], ex["c"], ex["gain"]):
        a, c = max(a, 0.0), max(c, 0.0)
        brute = _min_code_cost(a, lam) + _min_code_cost(c, lam) - _min_code_cost(np.hypot(a, c), lam)
        assert g == pytest.approx(brute, abs=1e-8)
    # bookkeeping the docs quote: the confusion counts every live direction once; p* >= 1/2 caps the predictions
    conf = res["confusion"]
    assert conf["n_directions"] == sum(r["n_live"] for r in res["saes"])
    assert conf["none_none"] + conf["predicted_found"] + conf["predicted_not_found"] + conf["found_not_predicted"] \
        == conf["n_directions"]
    for r in res["saes"]:
        assert r["n_predicted"] <= r["n_p_above_half"]
        if r["arch"] == "standard":      # the SAE read back from SAELens carries its training lam
            assert r["lam"] == pytest.approx(r["sparsity"], rel=1e-6)
    assert res["absorption"]["n_cases"] == sum(r["absorption"]["n_cases"] for r in res["saes"])


def _soft_threshold_sae(d, lam):
    """Orthonormal atoms e_1..e_d, encoder max(x - lam, 0): exactly the optimal L1 codes (theory.md §5.2)."""
    eye = np.eye(d)
    return SAE(W_dec=eye, b_dec=np.zeros(d), W_enc=eye, b_enc=np.full(d, -lam), architecture="standard")


def test_calibrated_lam_is_exact_for_optimal_codes():
    rng = np.random.default_rng(0)
    X = rng.exponential(1.0, (300, 5)) * (rng.random((300, 5)) < 0.4)
    for lam in (0.1, 0.7):
        sae = _soft_threshold_sae(5, lam)
        F = sae.encode(X)
        assert tp.calibrated_lam(X, sae, F) == pytest.approx(lam, abs=1e-12)


def test_direction_table_on_a_known_antipodal_pair():
    # 1-D data s u: latent 0 = +u fires on the active points, latent 1 = -u on the zeros; known p and p*
    rng = np.random.default_rng(1)
    n_act, n_zero, lam = 140, 60, 0.7
    s = np.concatenate([rng.uniform(1.0, 3.0, n_act), np.zeros(n_zero)])
    u = np.array([0.6, 0.8, 0.0])
    X = s[:, None] * u
    W = np.vstack([u, -u, [0.0, 0.0, 1.0]])
    sae = SAE(W_dec=W, b_dec=np.zeros(3), W_enc=W.T.copy(), b_enc=np.array([-0.5, 0.5, -1.0]), architecture="standard")
    F = sae.encode(X)
    tab = tp.direction_table(X, sae, F, lam)
    assert tab["latent"].tolist() == [0, 1]                          # the third atom never fires
    assert tab["p"].tolist() == [n_act / 200, n_zero / 200]
    g = np.mean(np.clip(s[:n_act] / lam - 1, -1, 1))                 # zeros at 0: s itself
    assert tab["pstar"][0] == pytest.approx(1 / (1 + g), rel=1e-12)
    assert tab["found"].tolist() == [True, True] and tab["min_cos"][0] == pytest.approx(-1.0)
    assert tab["predicted"][0] == (0.7 > 1 / (1 + g))


def test_absorption_cases_on_a_known_parent_and_child():
    # parent atom e1 (fires when x1 > 1), child atom 0.6 e1 + 0.8 e2 (fires when x2 > 0.5); b_dec = 0, so the
    # child's atom made orthogonal to the parent's is e2 and a, c are the coordinates x1, x2
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.uniform(-1, 3, 400), rng.uniform(-1, 3, 400), np.zeros(400)])
    X[:300, 0] = rng.uniform(1.5, 3, 300)                 # the parent is the more frequent latent
    W = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]])
    W_enc = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    sae = SAE(W_dec=W, b_dec=np.zeros(3), W_enc=W_enc, b_enc=np.array([-1.0, -0.5]), architecture="standard")
    F = sae.encode(X)
    lam = 0.4
    cases = tp.absorption_cases(X, sae, F, lam)
    child = X[:, 1] > 0.5
    assert cases["n_pairs"] == 1 and cases["gain"].size == child.sum()
    np.testing.assert_allclose(cases["a"], X[child, 0], atol=1e-12)
    np.testing.assert_allclose(cases["c"], X[child, 1], atol=1e-12)
    assert cases["absorbed"].tolist() == (X[child, 0] <= 1.0).tolist()
    assert cases["baseline"][0] == pytest.approx(np.mean(X[:, 0] <= 1.0))
    a, c = np.maximum(X[child, 0], 0), X[child, 1]
    brute = [_min_code_cost(s, lam) + _min_code_cost(t, lam) - _min_code_cost(np.hypot(s, t), lam) for s, t in zip(a, c)]
    np.testing.assert_allclose(cases["gain"], brute, atol=1e-8)
