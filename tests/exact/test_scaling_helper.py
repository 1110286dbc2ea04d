"""The one "scale by a power of two, one BLAS thread, unscale" helper (widelimit.exact.scaling.on_scaled_data)
and its four users (solve, solve at a width, the medians, verify): data read as f X are the same computation
in other units, so the results at 2^-300 X are exactly 2^-600 (values) or 2^-300 (points) times those at X."""

import numpy as np
import pytest

import widelimit as wl
from widelimit.exact.median import huber_median
from widelimit.exact.scaling import on_scaled_data

E = 300  # X * 2^-E is read back as X exactly (max |x| of X in [0.5, 1))


def _data(seed=0, N=30, n=3):
    X = np.random.default_rng(seed).standard_normal((N, n))
    return X / (1.0001 * np.abs(X).max())  # max |x| in [0.5, 1): normaliser(X) == 1


def test_the_helper_hands_the_exact_scaled_data_and_maps_back():
    X = _data()
    seen = {}

    def run(Xf, lam_f, f):
        seen.update(X=np.asarray(Xf[:]), lam=lam_f, f=f)
        return "result"

    out = on_scaled_data(X * 2.0 ** -E, 0.25 * 2.0 ** -E, run, lambda res, f: (res, f))
    assert seen["f"] == 2.0 ** E and out == ("result", 2.0 ** E)
    np.testing.assert_array_equal(seen["X"], X)  # exact: a power of two
    assert seen["lam"] == 0.25
    seen.clear()
    assert on_scaled_data(X, None, run, lambda res, f: pytest.fail("unscaled at f = 1")) == "result"
    assert seen["f"] == 1.0 and seen["X"] is not None and seen["lam"] is None


def test_the_helper_runs_blas_on_one_thread_when_the_passes_are_threaded(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from widelimit.engine import engine_for
    from widelimit.engine.local import TASK_CHUNKS, chunk_rows

    monkeypatch.setenv("WIDELIMIT_THREADS", "2")  # whatever the load: the engine made below runs two threads
    X = _data(N=2 * TASK_CHUNKS * chunk_rows(3))
    assert engine_for(X).threads == 2

    def run(Xf, lam_f, f):
        return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]

    assert set(on_scaled_data(X, 1.0, run, None)) <= {1}
    assert on_scaled_data(X, 1.0, run, None, one_blas=False) == [p["num_threads"] for p in
                                                                   threadpoolctl.threadpool_info()
                                                                   if p["user_api"] == "blas"]


def test_every_user_is_exactly_scale_equivariant():
    X = _data()
    lam, s = 0.2, 2.0 ** -E
    sol, sol_s = wl.solve(X, lam=lam), wl.solve(X * s, lam=lam * s)
    assert sol_s.value == sol.value * s * s
    np.testing.assert_array_equal(sol_s.bias, sol.bias * s)
    med, med_s = huber_median(X, lam=lam), huber_median(X * s, lam=lam * s)
    assert med_s.lower_bound == med.lower_bound * s * s
    np.testing.assert_array_equal(med_s.point, med.point * s)
    W, Z, b = sol.dictionary, sol.codes, sol.bias
    cert, cert_s = wl.verify(X, W, Z, b, lam=lam), wl.verify(X * s, W, Z * s, b * s, lam=lam * s)
    assert cert_s.value == cert.value * s * s and cert_s.lower_bound == cert.lower_bound * s * s
    fin, fin_s = wl.solve(X[:8], lam=lam, width=1), wl.solve(X[:8] * s, lam=lam * s, width=1)
    assert fin_s.value == fin.value * s * s and fin_s.certified == fin.certified
