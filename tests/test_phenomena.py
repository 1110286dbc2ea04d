"""Phenomena experiments: each key claim checked against an independent computation."""

import json

import numpy as np
import pytest
from scipy import integrate, optimize

import widelimit as wl
from widelimit import datasets
from widelimit.experiments import antipodal, exclusive, get, names
from widelimit.objective import huber_h


# ---------------------------------------------------------------- antipodal


@pytest.mark.parametrize("p, width", [(0.3, 1), (0.7, 2)])
def test_antipodal_width_at_p(p, width):
    lam = 0.1  # well below the active values (>= 1)
    X, t = datasets.sparse_variable(400, 8, n_active=int(p * 400), low=1.0, high=3.0, seed=0)
    sol = wl.solve(X, lam)
    assert sol.width == width and sol.certified
    u = t["direction"]
    if width == 2:
        assert sol.dictionary[0] @ sol.dictionary[1] == pytest.approx(-1.0, abs=1e-12)
    else:
        assert sol.dictionary[0] @ u == pytest.approx(1.0, abs=1e-12)
    # independent 1-D computation of b*: minimise (1/N) sum h(|s - beta|) with scipy
    s = t["values"]
    res = optimize.minimize_scalar(lambda bt: huber_h(np.abs(s - bt), lam).mean(), bounds=(-1, 3),
                                   method="bounded", options={"xatol": 1e-12})
    assert sol.bias @ u == pytest.approx(res.x, abs=1e-6)
    assert np.linalg.norm(sol.bias - (sol.bias @ u) * u) < 1e-9
    if p < 0.5:
        assert sol.bias @ u == pytest.approx(antipodal.bias_below_threshold(p, lam), rel=1e-10)
    assert wl.solve(X, lam, signed=True).width == 1


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
        sol = wl.solve(X, lam)
        p = 40 / (40 + z)
        assert bool(np.any(sol.dictionary @ u < 0)) == (p > pstar), z


def test_antipodal_experiment_quick(tmp_path):
    res = get("antipodal")(tmp_path, quick=True)
    g = res["grid"]
    assert g["n_mismatch"] == 0 and g["signed_width_equals_lines"]
    assert g["pair_cosine_max_dev"] < 1e-12 and g["max_rel_gap_or_signed_value_diff"] < 1e-9
    assert all(d["analytic_in_bracket"] for d in res["threshold"])
    assert res["bias"]["max_abs_err_below_threshold"] < 1e-10
    assert res["dense_symmetric"]["width"] == 2 and res["dense_symmetric"]["signed_width"] == 1
    assert (tmp_path / "antipodal.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "antipodal.json").read_text())["grid"]["n_mismatch"] == 0


# ---------------------------------------------------------------- exclusive and rays


def test_exclusive_experiment_quick(tmp_path):
    res = get("exclusive")(tmp_path, quick=True)
    assert res["all_widths_equal_K"] and res["all_certified"]
    for r in res["instances"]:
        assert r["bias_error"] < 1e-9 and r["max_atom_direction_error"] < 1e-12 and r["foc_hold"]
        assert r["code_margin"] == pytest.approx(r["code_margin_predicted"], rel=1e-9)
        assert r["dual_offsupport_min"] == pytest.approx(r["dual_offsupport_predicted"], rel=1e-9)
    a = res["asymmetric"]  # category 0 keeps one ray, every other point is its own
    assert a["certified"] and a["width"] == 1 + a["n_points"] - a["n_category0"]
    assert (tmp_path / "exclusive.png").exists() and (tmp_path / "exclusive.json").exists()


def test_rays_experiment_quick(tmp_path):
    res = get("rays")(tmp_path, quick=True)
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
