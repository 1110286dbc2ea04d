"""Streaming passes over out-of-core sources: same numbers as in memory, bounded memory, progress, resume, threads."""

import json
import tracemalloc

import numpy as np
import pytest

import widelimit as wl
import widelimit.engine.local as wl_local
from widelimit.data.source import ActivationSource
from widelimit.engine.local import Progress

from fixtures.sources import clustered as _clustered
from fixtures.sources import write_npy_shards as _write_npy_shards


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 64 KiB, so the test data span many chunks and several shards per chunk."""
    monkeypatch.setattr(wl_local, "CHUNK_BYTES", 1 << 16)


# --------------------------------------------------------------------------------------
# streaming == in memory
# --------------------------------------------------------------------------------------


def test_streaming_equals_in_memory(tmp_path, rng):
    X = _clustered(rng)
    lam = 1.5
    S = ActivationSource.open(_write_npy_shards(tmp_path, X, [1234, 1235, 4000]))
    for f in (lambda A: wl.huber_median(A, lam=lam), lambda A: wl.geometric_median(A)):
        a, b = f(X), f(S)
        assert _rel(b.point, a.point) <= 1e-10 and _rel(b.value, a.value) <= 1e-10
        assert _rel(b.lower_bound, a.lower_bound) <= 1e-10 and b.n_passes == a.n_passes
    w = np.random.default_rng(5).uniform(0.0, 2.0, X.shape[0])
    a, b = wl.huber_median(X, lam=lam, weights=w), wl.huber_median(S, lam=lam, weights=w)
    assert _rel(b.point, a.point) <= 1e-10 and _rel(b.lower_bound, a.lower_bound) <= 1e-10
    sa, sb = wl.solve(X, lam=lam), wl.solve(S, lam=lam)
    assert sb.width == sa.width and np.array_equal(sb.rays, sa.rays)
    assert _rel(sb.value, sa.value) <= 1e-10 and _rel(sb.dictionary, sa.dictionary) <= 1e-10
    ca, cb = wl.verify(X, sa.dictionary, sa.sparse_codes, sa.bias, lam=lam), wl.verify(S, sa.dictionary, sa.sparse_codes, sa.bias, lam=lam)
    for k in ("value", "lower_bound", "lower_bound_at_bias", "gap", "bias_stationarity", "dual_min", "max_residual_norm"):
        assert abs(getattr(cb, k) - getattr(ca, k)) <= 1e-10 * max(abs(getattr(ca, k)), abs(ca.value)), k
    assert cb.certified == ca.certified
    # an independent check of the streamed Huber value: closed form on the whole array
    r = np.linalg.norm(X.astype(np.float64) - sb.bias, axis=1)
    assert _rel(sb.median.value, np.mean(wl.exact.objective.huber_h(r, lam=lam))) <= 1e-12


def test_bf16_source_equals_in_memory_rounded(tmp_path, rng):
    import torch
    from safetensors.torch import save_file

    X = _clustered(rng, N=2000, n=8)
    t = torch.tensor(X).to(torch.bfloat16)
    save_file({"acts": t}, tmp_path / "a.safetensors")
    S = ActivationSource.open(tmp_path / "a.safetensors")
    a, b = wl.huber_median(t.float().numpy(), lam=1.0), wl.huber_median(S, lam=1.0)
    assert _rel(b.point, a.point) <= 1e-10 and _rel(b.value, a.value) <= 1e-10


def test_memory_is_bounded_independently_of_N(tmp_path, rng):
    """Peak allocation of a streamed median does not grow with N (a chunk budget, not O(N n))."""
    n = 16
    peaks = {}
    for N in (20_000, 80_000):
        X = _clustered(rng, N=N, n=n)
        S = ActivationSource.open(_write_npy_shards(tmp_path, X, [N // 3], name=f"m{N}"))
        del X
        tracemalloc.start()
        res = wl.huber_median(S, lam=1.5, hess_rows=512)
        peaks[N] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert res.certified
    full = 80_000 * n * 8
    assert peaks[80_000] < full / 6, peaks  # far below one float64 copy of X
    assert peaks[80_000] < 1.5 * peaks[20_000] + (1 << 18), peaks  # flat in N


# --------------------------------------------------------------------------------------
# progress and checkpoint / resume
# --------------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def test_progress_events_and_resume_after_interruption(tmp_path, rng):
    X = _clustered(rng, N=8000, n=10)
    S = ActivationSource.open(_write_npy_shards(tmp_path, X, [3000]))
    lam = 1.0
    events = []
    ref = wl.huber_median(S, lam=lam, progress=events.append)
    assert all(isinstance(e, Progress) for e in events)
    ends = [e for e in events if e.done and e.value is not None]
    assert ends and all(e.lower_bound <= e.value for e in ends)
    assert max(e.pass_index for e in events) == ref.n_passes
    assert any(not e.done and 0 < e.rows_done < e.rows_total for e in events)  # chunk-level events

    ck = tmp_path / "median.ckpt.npz"

    def interrupt_at(k):
        def cb(ev):
            if ev.pass_index >= k and ev.rows_done > ev.rows_total // 2:
                raise _Stop
        return cb

    with pytest.raises(_Stop):
        wl.huber_median(S, lam=lam, checkpoint=ck, progress=interrupt_at(ref.n_passes - 1))
    assert ck.exists()
    seen = []
    res = wl.huber_median(S, lam=lam, checkpoint=ck, progress=seen.append)
    assert np.array_equal(res.point, ref.point) and res.value == ref.value and res.lower_bound == ref.lower_bound
    # total, counting the passes made before the interruption and the certifying pass of the resume
    assert res.n_passes == ref.n_passes + 1
    assert max(e.pass_index for e in seen) <= ref.n_passes  # only the lost pass(es) were redone
    assert [e.stage for e in seen if e.done][0] == "resume" and res.fingerprint == ref.fingerprint
    again = wl.huber_median(S, lam=lam, checkpoint=ck)  # a finished run resumes to its result after one pass
    assert np.array_equal(again.point, ref.point) and again.n_passes == ref.n_passes + 2
    with pytest.raises(ValueError, match="different problem"):
        wl.huber_median(S, lam=2 * lam, checkpoint=ck)
    meta = json.loads(bytes(np.load(ck)["__meta__"]).decode())
    assert meta["problem"]["kind"] == "huber" and len(np.load(ck)["b"]) == 10  # O(n) state


def test_solve_and_verify_forward_checkpoint_and_progress(tmp_path, rng):
    X = _clustered(rng, N=3000, n=5)
    S = ActivationSource.from_array(X)
    ev = []
    sol = wl.solve(S, lam=1.0, checkpoint=tmp_path / "c.npz", progress=ev.append)
    assert (tmp_path / "c.npz").exists() and {e.stage for e in ev} >= {"mean", "newton", "certificate"}
    cert = wl.verify(S, sol.dictionary, sol.sparse_codes, sol.bias, lam=1.0, median=sol.median)
    assert cert.certified and _rel(cert.value, sol.value) <= 1e-12


def test_cli_bound_streams_a_folder_and_resumes(tmp_path, rng, capsys):
    from widelimit.cli import main

    X = _clustered(rng, N=4000, n=6)
    d = _write_npy_shards(tmp_path, X, [1500])
    ck = tmp_path / "ck.npz"
    assert main(["bound", str(d), "--lam", "1.5", "--json", "--no-progress", "--checkpoint", str(ck)]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = wl.huber_median(X, lam=1.5)
    assert _rel(out["lower_bound"], ref.lower_bound) <= 1e-10 and _rel(out["bias"], ref.point) <= 1e-10
    assert out["n_passes"] == ref.n_passes and out["certified"] and ck.exists()
    assert main(["bound", str(d), "--lam", "1.5"]) == 0  # table with a progress bar on stderr
    assert "certified" in capsys.readouterr().out
    assert main(["bound", str(tmp_path / "missing"), "--lam", "1"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_certify_sae_streams_a_source(tmp_path):
    from fixtures.saes import orthogonal_rays_sae

    X, sae = orthogonal_rays_sae(0.5, n_pairs=3, dim=8, points_per_ray=60, n_core=20, seed=2)
    X = X.astype(np.float32)
    S = ActivationSource.open(_write_npy_shards(tmp_path, X, [150, 151]))
    a = wl.certify_sae(X, sae, lam=0.5, batch_size=128)
    b = wl.certify_sae(S, sae, lam=0.5, batch_size=128)
    for k in ("sae_objective", "lower_bound", "lower_bound_at_bias", "global_gap", "bias_stationarity",
              "max_residual_norm"):
        assert abs(getattr(b, k) - getattr(a, k)) <= 1e-10 * max(1.0, abs(a.sae_objective)), k
    assert b.certified == a.certified
    assert _rel(b.optimal_bias, a.optimal_bias) <= 1e-10


# --------------------------------------------------------------------------------------
# multi-threaded passes over in-memory arrays
# --------------------------------------------------------------------------------------


def test_threaded_passes_do_not_depend_on_the_thread_count(rng, tmp_path):
    """Passes over arrays run in fixed row ranges merged in row order: 1, 2 or 3 threads give
    bit-identical sums, per-row maps and a first non-finite row that is the first one."""
    from widelimit.exact.median_pass import _merge_pass, _pass_chunk
    from widelimit.exact.rays import _keys_chunk
    from widelimit.engine.local import LocalEngine

    X = rng.standard_normal((5000, 7)).astype(np.float32)
    b = rng.standard_normal(7)
    V = np.linalg.qr(rng.standard_normal((7, 3)))[0]
    res, maps = [], []
    for t in (1, 2, 3):
        eng = LocalEngine(X, rows=97, threads=t)
        assert eng.parallel and eng.threads == t
        p = eng.reduce(_pass_chunk, _merge_pass, b, 1.5, "huber", 0.0, True, None, extras=(None,))
        res.append((p.value, p.g.copy(), p.A, p.dsum.copy(), p.imin))
        maps.append(eng.map_rows(_keys_chunk, b, V, False, cols=4))
    for r, m in zip(res[1:], maps[1:]):
        assert r[0] == res[0][0] and r[2] == res[0][2] and r[4] == res[0][4]
        assert np.array_equal(r[1], res[0][1]) and np.array_equal(r[3], res[0][3])
        assert np.array_equal(m, maps[0])
    D = X.astype(np.float64) - b
    assert res[0][0] == pytest.approx(wl.huber_value(X, b, lam=1.5) * 5000, rel=1e-12)
    np.testing.assert_allclose(maps[0][:, 0], np.linalg.norm(D, axis=1), rtol=1e-13)
    np.testing.assert_allclose(maps[0][:, 1:], (D @ V) / np.linalg.norm(D, axis=1)[:, None], rtol=1e-10, atol=1e-13)
    # shards read by several threads at once give the very same sums as the array
    S = ActivationSource.open(_write_npy_shards(tmp_path, X, [1234, 3000]))
    eng = LocalEngine(S, rows=97, threads=2)
    assert S.concurrent_reads and eng.parallel
    p = eng.reduce(_pass_chunk, _merge_pass, b, 1.5, "huber", 0.0, True, None, extras=(None,))
    assert p.value == res[0][0] and np.array_equal(p.g, res[0][1])
    Y = X.copy()
    Y[4321, 2] = np.inf
    Y[4500, 0] = np.nan
    with pytest.raises(ValueError, match=r"non-finite value \(Inf\) in row 4321"):
        LocalEngine(Y, rows=97, threads=2).reduce(_pass_chunk, _merge_pass, b, 1.5, "huber", 0.0, False, None,
                                                  extras=(None,))
    with pytest.raises(ValueError, match=r"row 4321"):
        wl.solve(Y, lam=1.5)
