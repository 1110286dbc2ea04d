"""Every registered experiment runs in its quick mode, and what it computes is checked (independently).

One parametrised test over the registry (``widelimit.lab.experiments.names()``). Each experiment's quick
run is shared, per session, with the tests that check its numbers (``quick_experiment`` in conftest.py);
an experiment registered without a check here fails this test.
"""

import json

import numpy as np
import pytest

from widelimit.lab.experiments import names

from lab import test_experiments as _phen
from lab import test_stability_experiments as _finite
from lab import test_superposition as _sup
from lab import test_trained_predictions as _tp
from lab import test_sup_ltilde as _supl


def _huber_value(X, b, lam):
    """(1/N) sum_i h_lam(||x_i - b||), theory.md §3, in plain numpy."""
    r = np.linalg.norm(X - b, axis=1)
    return float(np.mean(np.where(r <= lam, r * r, 2 * lam * r - lam * lam)))


def check_spurious(res, out):
    from widelimit.lab.experiments.stability import spurious_data
    from widelimit.relax.families import make_bench_instance

    X, lam, R = spurious_data(quick=True)
    inst = make_bench_instance("rays", X.shape[0], seed=0, dim=3, lam=lam, n_rays=R)
    # the certified optimum is the family's closed form H(c) (theory.md §3), computed here from the centre
    assert res["optimum"] == pytest.approx(_huber_value(X, inst.truth["centre"], lam), rel=1e-9)
    assert res["optimum_width"] == R and max(res["widths"]) <= res["N"]   # widths from the ray count to N
    for r in res["runs"]:
        assert r["above_optimum"] >= -1e-9 * res["optimum"]            # nothing beats the certified optimum
        assert r["verify_gap"] >= r["above_optimum"] - 1e-9             # verify's gap bounds the distance
        if "joint" in r["witness_moves"]:                              # a joint witness is a verified descent
            assert r["joint_curvature"] < 0 and r["best_witness_decrease"] > 0
    tol = 1e-6 * res["optimum"]
    assert res["n_spurious"] == sum(r["above_optimum"] > tol for r in res["runs"])
    assert res["spurious_not_certified"] == res["n_spurious"]


def check_minilm_sae(res, out):
    from safetensors.numpy import load_file

    X = np.load(out / "minilm_layer3.npy").astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in load_file(out / "sae" / "sae_weights.safetensors").items()}
    cfg = json.loads((out / "sae" / "cfg.json").read_text())
    xin = X - w["b_dec"] if cfg.get("apply_b_dec_to_input", True) else X
    Z = np.maximum(xin @ w["W_enc"] + w["b_enc"], 0.0)                 # SAELens' ReLU encoder
    R = Z @ w["W_dec"] + w["b_dec"] - X
    lam = res["lam"]
    value = np.mean(np.sum(R * R, axis=1)) + 2 * lam * np.mean(Z @ np.linalg.norm(w["W_dec"], axis=1))
    cert = res["certificate"]
    assert cert["sae_objective"] == pytest.approx(value, rel=1e-5)
    assert cert["n_points"] == X.shape[0] and cert["d_sae"] == res["width"]
    # the lower bound is min_b H(b) <= H(mean), and the optimal codes can only help
    assert cert["lower_bound"] <= _huber_value(X, X.mean(axis=0), lam) * (1 + 1e-9)
    assert cert["lower_bound"] <= cert["optimal_code_objective"] <= cert["sae_objective"] * (1 + 1e-9)


def _dedicated(fn):
    """A check that lives with the experiment's other tests (same cached run)."""
    return lambda res, out, qe: fn(qe)


CHECKS = {
    "spurious": check_spurious,
    "minilm-sae": check_minilm_sae,
}
DEDICATED = {
    "antipodal": _phen.test_antipodal_experiment_quick,
    "exclusive": _phen.test_exclusive_experiment_quick,
    "rays": _phen.test_rays_experiment_quick,
    "absorption": _phen.test_absorption_experiment_quick,
    "splitting": _phen.test_splitting_frontier_quick,
    "finite-width": _finite.test_finite_width_antipodal_cells_match_a_1d_brute_force,
    "stability": _finite.test_stability_experiment_against_closed_forms_and_the_wide_limit,
    "trained-predictions": _tp.test_trained_predictions_quick,
    "sup-ltilde": _supl.test_sup_ltilde_experiment_quick,
    # the five superposition experiments are checked together against closed forms
    **{n: _sup.test_experiments_quick for n in ("superposition-linear", "superposition-sparse-growth",
                                                "superposition-p-sweep", "superposition-gd", "superposition-frames")},
}


@pytest.mark.parametrize("name", sorted(names()))
def test_every_registered_experiment_runs_quick_and_is_checked(name, quick_experiment):
    res, out = quick_experiment(name)
    assert isinstance(res, dict) and res
    stems = {p.stem for p in out.glob("*.json")}
    assert stems, f"{name} wrote no JSON"
    for p in out.glob("*.json"):
        json.loads(p.read_text(), parse_constant=pytest.fail)        # strict JSON (no NaN/Infinity)
    assert any(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out.glob("*.png")), f"{name} drew no plot"
    assert name in CHECKS or name in DEDICATED, f"experiment {name!r} is registered without a check of its numbers"
    if name in CHECKS:
        CHECKS[name](res, out)
    else:
        DEDICATED[name](quick_experiment)


def check_spurious_width(res, out):
    from widelimit.lab.experiments.spurious_width import widths_for
    from widelimit.relax.families import make_bench_instance

    assert widths_for(3, 8, (0.5,)) == [3, 4] and widths_for(5, 8, (0.25, 1.0)) == [5, 8]
    for row in res["rows"]:
        inst = make_bench_instance(row["family"], row["N"], seed=0, dim=res["dim"])
        # the certified optimum, independently: the family's closed form where it has one, else >= min_b H(b)
        if "closed_form" in inst.truth:
            assert row["optimum"] == pytest.approx(inst.truth["closed_form"], rel=1e-9)
        assert row["optimum"] <= _huber_value(inst.X, inst.X.mean(axis=0), inst.lam) * (1 + 1e-12)
        assert row["optimum_width"] <= row["width"] <= row["N"]
        tol = 1e-6 * row["optimum"]
        assert row["n_spurious"] == sum(r["above_optimum"] > tol for r in row["runs"])
        for r in row["runs"]:
            assert r["above_optimum"] >= -1e-9 * row["optimum"]


CHECKS["spurious-width"] = check_spurious_width
