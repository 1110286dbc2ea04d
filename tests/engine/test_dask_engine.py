"""The Dask backend on a real LocalCluster of worker processes: same numbers, faults, persistence."""

import os
import signal
import threading

import numpy as np
import pytest

import widelimit as wl
from widelimit.data.source import ActivationSource

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from widelimit.engine.dask_engine import DaskEngine, from_source  # noqa: E402


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    N, n = 6_000, 10
    U = rng.standard_normal((6, n))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    X = U[rng.integers(0, 6, N)] * rng.uniform(0, 5, N)[:, None]  # six rays (and points near the centre)
    X = np.vstack([X[: N // 2], X[N // 2 :] + 0.01 * rng.standard_normal((N - N // 2, n))]).astype(np.float32)
    d = tmp_path_factory.mktemp("dask") / "shards"
    d.mkdir()
    for i, (a, b) in enumerate([(0, 2500), (2500, 2501), (2501, N)]):
        np.save(d / f"s{i}.npy", X[a:b])
    return X, ActivationSource.open(d)


def test_medians_on_cluster_equal_in_memory(client, data):
    X, S = data
    D = from_source(S, rows=1500)
    assert DaskEngine(D).persisted  # fits easily: kept on the workers across passes
    for f in (lambda A: wl.huber_median(A, lam=1.2), lambda A: wl.geometric_median(A)):
        a, b = f(X), f(D)
        assert _rel(b.point, a.point) <= 1e-10 and _rel(b.value, a.value) <= 1e-10
        assert _rel(b.lower_bound, a.lower_bound) <= 1e-10 and b.certified


def test_verify_on_cluster_with_dask_codes(client, tmp_path):
    rng = np.random.default_rng(3)
    V = rng.standard_normal((3, 8))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    half = V[rng.integers(0, 3, 2500)] * rng.uniform(0, 4, 2500)[:, None]
    X = np.vstack([half, -half]).astype(np.float32)  # point symmetric: b* = 0, six rays
    np.save(tmp_path / "x.npy", X)
    lam = 1.2
    sol = wl.solve(X, lam=lam)
    assert sol.width == 6
    D = from_source(ActivationSource.open(tmp_path / "x.npy"), rows=2000)
    sd = wl.solve(D, lam=lam)  # the per-point output is gathered on the client
    assert sd.width == 6 and abs(sd.value - sol.value) <= 1e-10 * sol.value and sd.certified
    ref = wl.verify(X, sol.dictionary, sol.codes, sol.bias, lam=lam, median=sol.median)
    Zd = da.from_array(sol.codes, chunks=(3000, -1))  # different row chunks: aligned by the engine
    for Z in (Zd, sol.sparse_codes):
        c = wl.verify(D, sol.dictionary, Z, sol.bias, lam=lam, median=sol.median)
        for k in ("value", "lower_bound_at_bias", "gap", "bias_stationarity", "complementarity", "max_residual_norm"):
            assert abs(getattr(c, k) - getattr(ref, k)) <= 1e-10 * max(1.0, abs(ref.value)), k
        assert c.certified
    bad = sol.codes.copy()
    bad[4321, 0] = -1.0
    with pytest.raises(ValueError, match=r"Z must be finite and >= 0 \(nonnegative codes\); Z\[4321, 0\] = -1"):
        wl.verify(D, sol.dictionary, da.from_array(bad, chunks=(3000, -1)), sol.bias, lam=lam, median=sol.median)


def test_worker_killed_mid_run_does_not_change_the_result(client, data):
    X, S = data
    ref = wl.huber_median(X, lam=1.2)
    pids = list(client.run(os.getpid).values())
    killed = []

    def kill_during_next_pass(ev):
        if ev.pass_index == 3 and not killed:  # the data are persisted by now: blocks are lost
            killed.append(pids[0])
            threading.Timer(0.02, os.kill, (pids[0], signal.SIGKILL)).start()

    res = wl.huber_median(from_source(S, rows=1000), lam=1.2, progress=kill_during_next_pass)
    assert killed
    assert _rel(res.point, ref.point) <= 1e-10 and _rel(res.value, ref.value) <= 1e-10 and res.certified
    assert res.n_passes == ref.n_passes  # no pass was repeated or lost
    client.wait_for_workers(3, timeout=60)  # the nanny replaced the killed worker
    assert killed[0] not in client.run(os.getpid).values()


def test_nonfinite_row_on_a_worker_names_the_row(client, data):
    X, _ = data
    Y = X.copy()
    Y[777, 3] = np.inf
    with pytest.raises(ValueError, match=r"\(Inf\) in row 777"):
        wl.huber_median(da.from_array(Y, chunks=(2500, 5)), lam=1.0)


def test_certify_sae_on_cluster(client):
    from fixtures.saes import orthogonal_rays_sae

    X, sae = orthogonal_rays_sae(0.5, n_pairs=3, dim=8, points_per_ray=60, n_core=20, seed=2)
    a = wl.certify_sae(X, sae, lam=0.5, batch_size=128)
    b = wl.certify_sae(da.from_array(X, chunks=(100, -1)), sae, lam=0.5, batch_size=128)
    for k in ("sae_objective", "lower_bound", "lower_bound_at_bias", "global_gap", "bias_stationarity"):
        assert abs(getattr(b, k) - getattr(a, k)) <= 1e-10 * max(1.0, abs(a.sae_objective)), k
    assert b.certified == a.certified
