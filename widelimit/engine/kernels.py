r"""Fused per-block kernels of the passes (compiled with numba).

A pass over the data reads each block of rows once. Written with NumPy, every step (widen
float32 to float64, subtract the bias, square, sum, scale, accumulate) is a separate sweep
over the block, and on a memory-bound machine each sweep costs about as much as reading the
block: a pass cost 7-8 float32 matrix-vector products. These kernels do all of it row by row
in one sweep, in float64 arithmetic (each float32 entry is widened exactly), so a pass costs
about as much as reading the data.

They release the GIL, so the threads of :class:`widelimit.engine.local.LocalEngine` run them in
parallel. The NumPy chunk functions that call them (``median_pass._pass_chunk``,
``exact._solution_chunk``) keep the engine's interface; the tests check the kernels against
independent NumPy computations (``objective``, ``certificate._cert_chunk``) and cvxpy.
"""

from __future__ import annotations

import numba as nb
import numpy as np

# reassociation lets LLVM vectorise the row sums (a different summation order, as NumPy's SIMD sums);
# no "nnan"/"ninf": NaN and Inf must propagate so that bad rows are found
_JIT = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"})


@nb.njit(**_JIT)
def _centre_row(c, i, b, d):  # pragma: no cover - compiled
    """``d = x_i - b`` in float64 (each entry widened exactly); returns ``||d||^2``."""
    r2 = 0.0
    for j in range(c.shape[1]):
        dj = np.float64(c[i, j]) - b[j]
        d[j] = dj
        r2 += dj * dj
    return r2


@nb.njit(**_JIT)
def median_rows(c, b, lam, geometric, eps_r, w, stats, VT, rows_out):  # pragma: no cover - compiled
    """Sums of one median iteration over the rows of ``c`` at ``b`` (see ``median_pass._Pass``).

    ``lam`` is unused for the geometric median; ``w`` is empty for unit weights; with
    ``stats`` the weighted sums of ``x - b`` are returned as well; if ``VT`` (``(p, n)``) has
    rows, ``rows_out[i] = [r_i, VT (x_i - b) / r_i]``.
    Returns ``(value, g, a, A, B, rmin, imin, w0, c0, dsum, rmax, a_in)`` (``a_in``: the weight of the
    points within ``lam``, whose curvature does not cancel).
    """
    m, n = c.shape
    p = VT.shape[0]
    g = np.zeros(n)
    c0 = np.zeros(n)
    dsum = np.zeros(n)
    d = np.empty(n)
    value = 0.0
    a = 0.0
    a_in = 0.0
    A = 0.0
    B = 0.0
    w0 = 0.0
    rmin = np.inf
    imin = 0
    rmax = 0.0
    unit = w.shape[0] == 0
    for i in range(m):
        wi = 1.0 if unit else w[i]
        r2 = _centre_row(c, i, b, d)
        r = np.sqrt(r2)
        if r < rmin:
            rmin = r
            imin = i
        if r > rmax:
            rmax = r
        if geometric:
            value += wi * r
            if r > eps_r:
                cw = wi / r
                A += wi * r
                B += wi
            else:
                cw = 0.0
                w0 += wi
                for j in range(n):
                    c0[j] += wi * d[j]
            a += cw
        else:
            if r > lam:
                cc = lam / r
                value += wi * (2.0 * lam * r - lam * lam)
            else:
                cc = 1.0
                value += wi * r2
                a_in += wi
            cw = wi * cc
            a += cw
            A += cw * r2
            B += cw * cc * r2
        if cw != 0.0:
            for j in range(n):
                g[j] += cw * d[j]
        if stats:
            for j in range(n):
                dsum[j] += wi * d[j]
        if p > 0:
            inv = 1.0 / r if r > 0 else 1.0
            rows_out[i, 0] = r
            for k in range(p):
                s = 0.0
                for j in range(n):
                    s += d[j] * VT[k, j]
                rows_out[i, k + 1] = s * inv
    return value, g, a, A, B, rmin, imin, w0, c0, dsum, rmax, a_in


@nb.njit(**_JIT)
def solution_rows(c, b, lam, W, z_out, start, ray, lead, single):  # pragma: no cover - compiled
    """One block of the pass that builds and certifies the narrowest solution (``exact._solution_chunk``).

    Writes the atom ``(x - b) / ||x - b||`` of each leader row into ``W[ray]`` (in ``W``'s
    dtype) and, for points alone on their ray, the code ``(<w, x - b> - lam)_+`` on the stored
    atom into ``z_out[start + i]``. Returns ``(sum ||e||^2, sum e, max ||e||^2, sum h(r), <G, Q>
    part, sum z ||w||, atoms used)`` over the points within ``lam`` and the points alone on
    their ray; rows on shared rays only contribute ``h(r)``.
    """
    m, n = c.shape
    d = np.empty(n)
    u = np.empty(n)
    esum = np.zeros(n)
    rec = 0.0
    emax = 0.0
    hub = 0.0
    comp = 0.0
    pen = 0.0
    width = 0
    lam2 = lam * lam
    for i in range(m):
        r2 = _centre_row(c, i, b, d)
        r = np.sqrt(r2)
        hub += r2 if r <= lam else 2.0 * lam * r - lam2
        k = ray[i]
        if lead[i]:
            inv = 1.0 / r if r > 0 else 1.0
            for j in range(n):
                W[k, j] = d[j] * inv
        if k < 0:
            rec += r2
            if r2 > emax:
                emax = r2
            for j in range(n):
                esum[j] += d[j]
        elif single[i]:
            t = 0.0
            nrm2 = 0.0
            for j in range(n):
                uj = np.float64(W[k, j])  # the stored atom, rounding included
                u[j] = uj
                t += d[j] * uj
                nrm2 += uj * uj
            z = t - lam
            if z < 0.0:
                z = 0.0
            z_out[start + i] = z
            ee = 0.0
            for j in range(n):
                e = d[j] - z * u[j]
                esum[j] += e
                ee += e * e
            rec += ee
            if ee > emax:
                emax = ee
            zn = z * np.sqrt(nrm2)
            pen += zn
            q = np.sqrt(ee) / lam  # not ee / lam^2: lam^2 under/overflows for extreme lam
            comp += zn * (1.0 - q * q)
            if zn > 0:
                width += 1
    return rec, esum, emax, hub, comp, pen, width


@nb.njit(**_JIT)
def _scan_range(rk, KR, i, j, hi_key, tol, out_i, out_j, count):  # pragma: no cover - compiled
    """Pairs ``(i, j'')`` for ``j'' = j, j + 1, ...`` while ``rk[j''] <= hi_key`` and every projection is within ``tol``
    (stored while ``out_i`` has room; counted in any case)."""
    m, p = KR.shape
    while j < m and rk[j] <= hi_key:
        close = True
        for k in range(p):
            if abs(KR[i, k] - KR[j, k]) > tol:
                close = False
                break
        if close:
            if count < out_i.shape[0]:
                out_i[count] = i
                out_j[count] = j
            count += 1
        j += 1
    return count


@nb.njit(**_JIT)
def _grid_scan(rk, KR, w1, two_d, tol, out_i, out_j):  # pragma: no cover - compiled
    m = rk.shape[0]
    count = 0
    nxt = 0  # first position whose key may lie in the next row's range (moves forward only)
    for i in range(m):
        ki = rk[i]
        # same cell and the next cell of the same row: consecutive in the sorted order
        count = _scan_range(rk, KR, i, i + 1, ki + 1, tol, out_i, out_j, count)
        if two_d:  # the three neighbouring cells of the next row: keys ki + w1 - 1 .. ki + w1 + 1
            while nxt < m and rk[nxt] < ki + w1 - 1:
                nxt += 1
            count = _scan_range(rk, KR, i, max(nxt, i + 1), ki + w1 + 1, tol, out_i, out_j, count)
    return count


def grid_pairs(rk, KR, w1, two_d, tol):
    """Pairs ``(i, j)``, ``i < j``, of grid cells that touch and all projections within ``tol``.

    ``rk``: sorted cell keys (``row * w1 + column``; ``two_d=False`` for a single row);
    ``KR``: the projections in the same order. One linear sweep (two pointers).
    """
    rk = np.ascontiguousarray(rk, dtype=np.int64)
    KR = np.ascontiguousarray(KR, dtype=np.float64)
    cap = rk.shape[0]  # one sweep when there are at most as many pairs as points, two otherwise
    while True:
        out_i = np.empty(cap, dtype=np.int64)
        out_j = np.empty(cap, dtype=np.int64)
        count = _grid_scan(rk, KR, int(w1), bool(two_d), float(tol), out_i, out_j)
        if count <= cap:
            return out_i[:count], out_j[:count]
        cap = count
