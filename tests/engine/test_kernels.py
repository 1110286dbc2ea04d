"""The numba kernels of widelimit.engine.kernels against brute force and the same sums written in NumPy."""

import numpy as np
import pytest


def test_grid_pairs_matches_brute_force(rng):
    """The neighbour search of the ray grouping: every pair of touching grid cells whose
    projections all lie within tol, each once, against a brute-force enumeration."""
    from widelimit.engine.kernels import grid_pairs

    for _ in range(100):
        m, w1, tol = int(rng.integers(1, 60)), int(rng.integers(3, 8)), 0.5
        key = np.sort(rng.integers(0, 4, m) * w1 + rng.integers(0, w1 - 2, m) + 1)
        K = rng.random((m, 3))
        i, j = grid_pairs(key, K, w1, True, tol)
        row, col = np.divmod(key - 1, w1)
        want = {(a, b) for a in range(m) for b in range(a + 1, m)
                if abs(row[a] - row[b]) <= 1 and abs(col[a] - col[b]) <= 1 and np.all(np.abs(K[a] - K[b]) <= tol)}
        assert set(zip(i.tolist(), j.tolist())) == want


@pytest.mark.parametrize("geometric", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_median_kernel_matches_numpy(geometric, dtype, rng):
    """One fused sweep (widelimit.engine.kernels.median_rows) against the same sums written in NumPy."""
    from widelimit.engine.kernels import median_rows

    X = (rng.standard_normal((300, 7)) * 2).astype(dtype)
    X[5] = X[6] = 0.25  # rows coinciding with b (geometric: the zero-distance branch)
    b, w, lam, eps_r = np.full(7, 0.25), rng.random(300), 1.3, 1e-12
    VT = np.linalg.qr(rng.standard_normal((7, 3)))[0].T.copy()
    rows = np.empty((300, 4))
    value, g, a, A, B, rmin, imin, w0, c0, dsum, rmax, a_in = median_rows(X, b, lam, geometric, eps_r, w, True, VT, rows)
    D = X.astype(np.float64) - b
    r = np.linalg.norm(D, axis=1)
    if geometric:
        far = r > eps_r
        cw = np.where(far, w / np.where(far, r, 1), 0.0)
        assert value == pytest.approx(w @ r, rel=1e-13)
        assert A == pytest.approx(w[far] @ r[far], rel=1e-13) and B == pytest.approx(w[far].sum(), rel=1e-13)
        assert w0 == pytest.approx(w[~far].sum(), rel=1e-13)
        np.testing.assert_allclose(c0, w[~far] @ D[~far], atol=1e-13)
    else:
        cc = np.where(r > lam, lam / np.where(r > lam, r, 1.0), 1.0)
        cw = w * cc
        assert value == pytest.approx(w @ np.where(r <= lam, r * r, 2 * lam * r - lam * lam), rel=1e-13)
        assert A == pytest.approx(cw @ (r * r), rel=1e-13) and B == pytest.approx((cw * cc) @ (r * r), rel=1e-13)
    assert a == pytest.approx(cw.sum(), rel=1e-13)
    np.testing.assert_allclose(g, cw @ D, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dsum, w @ D, rtol=1e-12, atol=1e-12)
    assert rmin == r.min() and imin == int(np.argmin(r)) and rmax == pytest.approx(r.max(), rel=1e-15)
    np.testing.assert_allclose(rows[:, 0], r, rtol=1e-14)
    safe = np.where(r > 0, r, 1.0)
    np.testing.assert_allclose(rows[:, 1:], (D @ VT.T) / safe[:, None], rtol=1e-12, atol=1e-13)
