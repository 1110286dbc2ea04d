r"""The second-order node bound of the finite-width branch and bound (docs/theory.md §7.6).

The cone relaxation of docs/theory.md §7.2 loses, in a cap of angle ``theta``, an amount of
order ``theta`` even at a stationary dictionary (each point tilts its own copy of the atom). The
bound here loses only ``O(theta * |grad| + theta^2)``: it takes the exact optimum ``(Z0, b0)``
of the problem at the caps' centres ``C`` (a convex lasso with a bias), its dual point
``u0_i = x_i - b0 - sum_j z0_ij c_j``, and for every dictionary ``W`` of the node a dual point
``u(W) = u0 + delta(W)`` that stays feasible for ``W`` (it keeps each tight constraint
``<w_j, u_i> = <c_j, u0_i>`` and ``sum_i u_i = 0``). ``delta(W)`` is never computed: only
bounds on its norms enter

.. math:: L \ge q(u_0) + \frac2N\Big[\sum_j m_j - \sum_{ij} z^0_{ij}\,t'_{ij}
          - \sum_i \|e_i\| D'_i - V_1\Big] - \frac1N \Big[\sum_i D_i'^2 + V_2\Big],

with ``chi_j = 2 sin(theta_j / 2)`` (the largest ``||w_j - c_j||``),
``m_j = min_{w in cap j} <c_j - w, G_j>``, ``G_j = sum_i z0_ij u0_i`` (zero first-order term at a
stationary ``C``), ``D'_i >= ||delta'_i(W)||`` (the part that keeps point ``i``'s tight constraints),
``t'_ij >= |<c_j - w_j, delta'_i>|``, ``V_1, V_2`` the linear and squared terms of the part ``v_i`` that
restores ``sum_i u_i = 0`` (orthogonal to ``delta'_i``; bounded per point or through
``sum_i ||v_i||^2 <= ||s||^2 / sigma_min(S(W))``, whichever is smaller) and ``e_i`` the defect of the identity
``x_i - u0_i = b0 + sum_j z0_ij c_j`` after rounding and scaling. The proof is in docs/theory.md §7.6.
float64 without fast-math; the bound is lowered by a rigorous bound on the rounding of ``q``.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..coding.fixed_dictionary import fixed_dictionary_optimum
from ._kernels import node_solve, recentre, residual

_JIT = dict(nogil=True, cache=True)
_U = 2.0 ** -53


@nb.njit(**_JIT)
def bound_node(X, lam, C, cth, sth, free, theta, Y, Z0, b0, lb, floor, target, tol_abs, taylor_max):  # pragma: no cover
    """One node's certified bound, all in compiled code (the branch and bound's threads run it without the GIL).

    Where every cap is narrower than ``taylor_max``: the exact optimum ``(Z0, b0)`` at the caps' centres
    (in place, warm-started; its value is a candidate upper bound) and the second-order bound
    (:func:`second_order_bound`); unless that reaches ``target``, the cone relaxation
    (``_kernels.node_solve``, in place on ``Y``). Returns ``(lb, candidate, mass)``: the node's bound
    (at least ``lb`` and ``floor``), the candidate's value (``inf`` when none) and each atom's code mass.
    """
    k = C.shape[0]
    cand = np.inf
    mass = np.zeros(k)
    tmax = 0.0
    for j in range(k):
        tmax = max(tmax, theta[j])
    lb = max(lb, floor)
    if tmax < taylor_max:
        cand = fixed_dictionary_optimum(X, lam, C, b0, Z0, 100000, 1e-13)
        for i in range(Z0.shape[0]):
            for j in range(k):
                mass[j] += Z0[i, j]
        lb = max(lb, second_order_bound(X, lam, C, theta, Z0, b0))
        if lb >= target:
            return lb, cand, mass
    dual, _primal, _sweeps = node_solve(X, lam, C, cth, sth, free, Y, target, tol_abs, 20000, 10)
    lb = max(lb, dual)
    mass[:] = 0.0
    for i in range(Y.shape[0]):
        for j in range(k):
            s = 0.0
            for d in range(Y.shape[2]):
                s += Y[i, j, d] * Y[i, j, d]
            mass[j] += math.sqrt(s)
    return lb, cand, mass


@nb.njit(**_JIT)
def second_order_bound(X, lam, C, theta, Z0, b0):  # pragma: no cover - compiled
    """Certified lower bound of the objective over every dictionary with ``w_j`` in the cap
    ``(C[j], theta[j])`` (``theta_j < pi/2``), from the reference ``(Z0, b0)`` at ``W = C``.

    Returns ``-inf`` when the construction does not apply (a point tight on more atoms than it
    can keep, or ill-conditioned corrections): the caller then relies on the cone bound.
    """
    U, lev, unorm, enorm, perp, chord, omc, sth = _prepare(X, lam, C, theta, Z0, b0)
    N, n = X.shape
    k = C.shape[0]
    best = -np.inf
    for carriers in range(3):  # who absorbs the change of sum_i u_i: free points / + single / all
        act = np.zeros((N, k), dtype=np.bool_)
        for i in range(N):
            for j in range(k):
                if Z0[i, j] > 0.0 or lam - lev[i, j] <= 1e-12 * lam:
                    act[i, j] = True
        r = _corrections(U, C, lam, lev, unorm, perp, chord, omc, sth, act, carriers)
        if r[0] < 0.0:
            continue
        zt = _tang_joint(U, C, Z0, act, lev, chord, omc, sth, r[1], r[3], r[5], r[6], r[7])
        val = _assemble(X, lam, C, theta, Z0, U, enorm, chord, act, r[1], r[2], zt, r[4])
        if val > best:
            best = val
    return best


@nb.njit(**_JIT)
def _prepare(X, lam, C, theta, Z0, b0):  # pragma: no cover - compiled
    """The reference dual point ``u0`` (recentred, scaled feasible at ``C``) and the sizes the bound uses.

    Returns ``(U, lev, unorm, enorm, perp, chord, omc, sth)``: ``u0``, ``<c_j, u0_i>``, ``||u0_i||``, a
    bound on the defect ``||e_i||``, ``||P_{c_j^perp} u0_i||``, ``2 sin(theta_j/2)``, ``1 - cos(theta_j)``
    and ``sin(theta_j)``.
    """
    N, n = X.shape
    k = C.shape[0]
    U = np.empty((N, n))
    residual(X, C, b0, Z0, U)
    recentre(U)
    lev = np.empty((N, k))
    hmax = 0.0
    for i in range(N):
        for j in range(k):
            s = 0.0
            for d in range(n):
                s += C[j, d] * U[i, d]
            lev[i, j] = s
            if s > hmax:
                hmax = s
    if hmax > lam:  # scale into the feasible set at W = C
        alpha = lam / hmax * (1.0 - 4.0 * _U)
        for i in range(N):
            for d in range(n):
                U[i, d] *= alpha
            for j in range(k):
                lev[i, j] *= alpha
    unorm = np.empty(N)
    enorm = np.empty(N)  # defect of x_i - u_i = b0 + sum_j z0_ij c_j
    for i in range(N):
        s = 0.0
        e2 = 0.0
        for d in range(n):
            s += U[i, d] * U[i, d]
            e = X[i, d] - U[i, d] - b0[d]
            for j in range(k):
                e -= Z0[i, j] * C[j, d]
            e2 += e * e
        unorm[i] = math.sqrt(s)
        mag = unorm[i] + math.sqrt(np.sum(X[i] * X[i])) + math.sqrt(np.sum(b0 * b0)) + np.sum(Z0[i])
        enorm[i] = math.sqrt(e2) + 4.0 * (k + 4) * n * _U * mag  # plus the rounding of the defect itself
    chord = np.empty(k)
    omc = np.empty(k)  # 1 - cos(theta_j): the largest <c_j - w_j, w_j>
    sth = np.empty(k)  # sin(theta_j): the largest ||P_{c_j^perp} w_j|| (theta_j <= pi/2)
    for j in range(k):
        chord[j] = 2.0 * math.sin(0.5 * theta[j])
        omc[j] = 2.0 * math.sin(0.5 * theta[j]) ** 2
        sth[j] = math.sin(min(theta[j], 0.5 * math.pi))
    perp = np.empty((N, k))  # ||P_{c_j^perp} u_i||
    for i in range(N):
        for j in range(k):
            p2 = 0.0
            for d in range(n):
                t = U[i, d] - lev[i, j] * C[j, d]
                p2 += t * t
            perp[i, j] = math.sqrt(p2) * (1.0 + 8.0 * n * _U) + 4.0 * n * _U * unorm[i]
    return U, lev, unorm, enorm, perp, chord, omc, sth


@nb.njit(**_JIT)
def _rbound(C, mask, g, chord, omc, sth):  # pragma: no cover - compiled
    """Bound on ``||(<c_j - w_j, g>)_{j in mask}||`` over the caps: each term is at most
    ``|<c_j, g>| (1 - cos theta_j) + sin theta_j ||P_{c_j^perp} g||``."""
    k, n = C.shape
    tot = 0.0
    for j in range(k):
        if (mask >> j) & 1:
            lv = 0.0
            for d in range(n):
                lv += C[j, d] * g[d]
            p2 = 0.0
            for d in range(n):
                t = g[d] - lv * C[j, d]
                p2 += t * t
            r = abs(lv) * omc[j] + sth[j] * math.sqrt(p2)
            tot += r * r
    return math.sqrt(tot) * (1.0 + 16.0 * n * _U)


_WEDIN = 0.5 * (1.0 + math.sqrt(5.0))  # ||B^+ - A^+|| <= this ||A^+|| ||B^+|| ||B - A|| for equal ranks (Wedin 1973)


@nb.njit(**_JIT)
def _sbound_linear(C, used, gsum, Mplus, sig, dpinv, chord, omc, sth):  # pragma: no cover - compiled
    """Bound on ``||s(W)|| = ||sum_g M_g(W)^+ rho_g(W)||`` over the caps, first-order part taken jointly.

    With ``w_j = cos(phi_j) c_j + t_j`` (``t_j`` tangent, ``||t_j|| <= sin theta_j``),
    ``rho_gj = (1 - cos phi_j) <c_j, g_g> - <t_j, P_{c_j^perp} g_g>`` exactly, so
    ``s = -sum_j A_j t_j + sum_g M_g(C)^+ rho2_g + sum_g (M_g(W)^+ - M_g(C)^+) rho_g`` with
    ``A_j = sum_{g containing j} M_g(C)^+ e_j (P_{c_j^perp} g_g)^T`` (docs/theory.md §7.6): the groups'
    first-order terms cancel inside ``A_j`` before any norm is taken.
    """
    nm, n, k = Mplus.shape
    A = np.zeros((k, n, n))
    rem = 0.0
    for m in range(1, nm):
        if not used[m]:
            continue
        r2 = 0.0
        for j in range(k):
            if (m >> j) & 1:
                cg = 0.0
                for d in range(n):
                    cg += C[j, d] * gsum[m, d]
                r2 += (omc[j] * abs(cg)) ** 2
                for d in range(n):
                    for e in range(n):
                        A[j, d, e] += Mplus[m, d, j] * (gsum[m, e] - cg * C[j, e])
        rem += math.sqrt(r2) / sig[m] + dpinv[m] * _rbound(C, m, gsum[m], chord, omc, sth)
    per_atom = 0.0
    B = np.zeros((n, k * n))  # [A_1 ... A_k]
    s2 = 0.0
    for j in range(k):
        per_atom += math.sqrt(max(np.linalg.eigvalsh(A[j].T @ A[j])[-1], 0.0)) * sth[j]
        for d in range(n):
            for e in range(n):
                B[d, j * n + e] = A[j, d, e]
        s2 += sth[j] * sth[j]
    joint = math.sqrt(max(np.linalg.eigvalsh(B @ B.T)[-1], 0.0)) * math.sqrt(s2)
    return (min(per_atom, joint) + rem) * (1.0 + 1e-10)


@nb.njit(**_JIT)
def _corrections(U, C, lam, lev, unorm, perp, chord, omc, sth, act, carriers):  # pragma: no cover - compiled
    """Bounds on the correction ``delta_i(W) = delta'_i + v_i`` over the caps (docs/theory.md §7.6).

    ``delta'_i`` keeps point ``i``'s tight constraints (``M_i(W) delta'_i = r_i``); the ``v_i`` (in the
    null space of ``M_i(W)``, on the carrier points only) cancel ``sum_i delta'_i``, which is bounded per
    group of points with the same tight atoms (``M(W)^+`` applied to the group's sum of ``r_i``). Adds
    to ``act`` every pair whose slack could be used up, and repeats. Returns
    ``(status, d1, vb, tang, v2, Mplus, sig, dpinv)``,
    status 0 or negative (-1: a point tight on more than n atoms, -2: ill-conditioned tight atoms, -3:
    the carriers' projectors do not span, -4: slack still used up after N k + 1 rounds), and bounds on
    ``||delta'_i||``, ``||v_i||`` and ``|<c_j - w_j, delta_i>| - chord_j ||v_i||`` (per point), and on
    ``sum_i ||v_i||^2 = s^T S(W)^{-1} s <= ||s||^2 / sigma_min(S(W))`` (``s = sum_i delta'_i``), and per
    group of tight atoms (bit mask ``g``) ``M_g(C)^+`` (column for atom ``j`` in ``Mplus[g, :, j]``),
    ``sigma_min(M_g(C))`` and a bound on ``||M_g(W)^+ - M_g(C)^+||`` over the caps.
    """
    N, n = U.shape
    k = C.shape[0]
    d1 = np.zeros(N)
    tang = np.zeros(N)
    vb = np.zeros(N)
    fail = (np.zeros((1, n, k)), np.ones(1), np.zeros(1))
    for _round in range(N * k + 1):  # each round adds a pair, or stops
        mask_of = np.zeros(N, dtype=np.int64)  # each point's tight atoms, as a bit mask
        for i in range(N):
            for j in range(k):
                if act[i, j]:
                    mask_of[i] |= 1 << j
        used = np.zeros(1 << k, dtype=np.bool_)
        for i in range(N):
            used[mask_of[i]] = True
        status, slo, pmove, Pnull, Mplus, sig, dpinv = _group_bounds(C, chord, used, n)
        if status < 0.0:
            return status, d1, vb, tang, 0.0, fail[0], fail[1], fail[2]
        d1, tang, gsum, S, ptot, carrier = _point_bounds(U, C, mask_of, chord, omc, sth, slo, pmove, Pnull, carriers)
        sbound = 0.0
        for m in range(1, 1 << k):
            if used[m]:
                sbound += _rbound(C, m, gsum[m], chord, omc, sth) / slo[m]
        sbound = min(sbound, _sbound_linear(C, used, gsum, Mplus, sig, dpinv, chord, omc, sth))
        mu = 0.0
        v2 = 0.0
        if sbound > 0.0:
            smin = np.linalg.eigvalsh(S)[0] - 1e-12 * N - ptot
            if smin <= 0.0:
                return -3.0, d1, vb, tang, 0.0, fail[0], fail[1], fail[2]
            mu = sbound / smin
            v2 = sbound * mu * (1.0 + 8.0 * _U)
        for i in range(N):
            vb[i] = mu if carrier[i] else 0.0
        if not _tighten(act, lam, lev, perp, omc, sth, d1, vb):
            return 0.0, d1, vb, tang, v2, Mplus, sig, dpinv
    return -4.0, d1, vb, tang, 0.0, Mplus, sig, dpinv


@nb.njit(**_JIT)
def _group_bounds(C, chord, used, n):  # pragma: no cover - compiled
    """Per group of tight atoms (bit mask ``m``, for the ``used`` ones): a lower bound ``slo`` on the smallest
    singular value of ``M_m(W)`` over the caps, the largest move ``pmove`` of its projector, the null-space
    projector ``Pnull`` at ``C``, ``M_m(C)^+`` (``Mplus``), ``sigma_min(M_m(C))`` (``sig``) and a bound
    ``dpinv`` on ``||M_m(W)^+ - M_m(C)^+||``. Status ``-1`` (more than ``n`` tight atoms) or ``-2``
    (ill-conditioned tight atoms) first when the construction does not apply, else 0."""
    k = C.shape[0]
    nm = 1 << k
    slo = np.ones(nm)
    pmove = np.zeros(nm)
    Pnull = np.zeros((nm, n, n))
    Mplus = np.zeros((nm, n, k))  # M_g(C)^+, its column for atom j in Mplus[g, :, j]
    sig = np.ones(nm)  # sigma_min(M_g(C))
    dpinv = np.zeros(nm)  # bound on ||M_g(W)^+ - M_g(C)^+|| over the caps
    for m in range(nm):
        if not used[m]:
            continue
        a = 0
        for j in range(k):
            a += (m >> j) & 1
        if a > n:
            return -1.0, slo, pmove, Pnull, Mplus, sig, dpinv
        for d in range(n):
            Pnull[m, d, d] = 1.0
        if a == 0:
            continue
        M = np.empty((a, n))
        q = 0
        E2 = 0.0
        for j in range(k):
            if (m >> j) & 1:
                for d in range(n):
                    M[q, d] = C[j, d]
                E2 += chord[j] * chord[j]
                q += 1
        G = M @ M.T
        if a > 1 and np.linalg.eigvalsh(G)[0] <= 1e-8:
            return -2.0, slo, pmove, Pnull, Mplus, sig, dpinv
        Mp = M.T @ np.linalg.inv(G)
        Pi = Mp @ M
        for d in range(n):
            for e in range(n):
                Pnull[m, d, e] -= Pi[d, e]
        q = 0
        for j in range(k):
            if (m >> j) & 1:
                for d in range(n):
                    Mplus[m, d, j] = Mp[d, q]
                q += 1
        if a == 1:  # exact: delta' = w_j r, the projector moves by sin(angle) <= min(1, chord)
            slo[m] = 1.0
            pmove[m] = min(1.0, math.sqrt(E2))
            dpinv[m] = math.sqrt(E2)  # M(W)^+ = w_j, M(C)^+ = c_j
        else:
            gmin = np.linalg.eigvalsh(G)[0]
            E = math.sqrt(E2)
            sig[m] = math.sqrt(max(gmin, 0.0)) * (1.0 - 1e-12)
            sl = sig[m] - E
            if sl <= 0.0:
                return -2.0, slo, pmove, Pnull, Mplus, sig, dpinv
            slo[m] = sl
            pmove[m] = E / sl
            dpinv[m] = _WEDIN * E / (sl * sig[m])
    return 0.0, slo, pmove, Pnull, Mplus, sig, dpinv


@nb.njit(**_JIT)
def _point_bounds(U, C, mask_of, chord, omc, sth, slo, pmove, Pnull, carriers):  # pragma: no cover - compiled
    """Per point: the bound ``d1`` on ``||delta'_i||``, its tangential part ``tang``, whether it carries the
    ``v_i`` (``carrier``); per group the sum ``gsum`` of its ``u_i``; and the carriers' projector sum ``S`` and
    total move ``ptot`` (for ``sigma_min(S(W))``)."""
    N, n = U.shape
    k = C.shape[0]
    d1 = np.zeros(N)
    tang = np.zeros(N)
    gsum = np.zeros((1 << k, n))
    S = np.zeros((n, n))
    ptot = 0.0
    carrier = np.zeros(N, dtype=np.bool_)
    for i in range(N):
        m = mask_of[i]
        a = 0
        cmax = 0.0
        for j in range(k):
            if (m >> j) & 1:
                a += 1
                cmax = max(cmax, chord[j])
        # a point tight on n atoms has the null space {0} at C and at every W of the caps (its
        # tight atoms stay independent, slo > 0): it can carry nothing, and its projector never moves
        carrier[i] = a < n and (a == 0 or (carriers >= 1 and a == 1) or carriers >= 2)
        d1[i] = _rbound(C, m, U[i], chord, omc, sth) / slo[m]
        if a == 1:
            jj = 0
            for j in range(k):
                if (m >> j) & 1:
                    jj = j
            tang[i] = omc[jj] * d1[i]  # <c_j - w_j, w_j> r_ij
        else:
            tang[i] = cmax * d1[i]
        for d in range(n):
            gsum[m, d] += U[i, d]
        if carrier[i]:
            ptot += pmove[m]
            for d in range(n):
                for e in range(n):
                    S[d, e] += Pnull[m, d, e]
    return d1, tang, gsum, S, ptot, carrier


@nb.njit(**_JIT)
def _tighten(act, lam, lev, perp, omc, sth, d1, vb):  # pragma: no cover - compiled
    """Mark tight (in ``act``) every pair whose slack the correction could use up; True when one was added."""
    N, k = act.shape
    added = False
    for i in range(N):
        for j in range(k):
            if act[i, j]:
                continue
            # <w_j, u_i + delta_i> <= lev + max(0, -lev)(1 - cos) + sin ||P_perp u_i|| + ||delta_i||,
            # ||delta_i||^2 = ||delta'_i||^2 + ||v_i||^2 (row space and null space of M_i(W))
            dn = math.sqrt(d1[i] * d1[i] + vb[i] * vb[i]) * (1.0 + 4.0 * _U)
            rise = max(0.0, -lev[i, j]) * omc[j] + sth[j] * perp[i, j] + dn
            if lam - lev[i, j] < rise * (1.0 + 16.0 * _U):
                act[i, j] = True
                added = True
    return added


@nb.njit(**_JIT)
def _tang_joint(U, C, Z0, act, lev, chord, omc, sth, d1, tang, Mplus, sig, dpinv):  # pragma: no cover - compiled
    """Bound on ``-sum_{z0_ij > 0} z0_ij <c_j - w_j, delta'_i>`` over the caps (docs/theory.md §7.6).

    Per point it is ``sum_j z0_ij tang_i``. For a point on ``a >= 2`` atoms the leading part is a
    quadratic form in the tangent tilts ``t_j`` (``w_j = cos(phi_j) c_j + t_j``):
    ``sum_j z0_ij <t_j, M_i(C)^+ (<t_l, P_{c_l^perp} u0_i>)_l>``, summed over the points into one form
    ``t^T Q t`` whose norm takes the points' signs into account; the rest is third order. ``Mplus``,
    ``sig``, ``dpinv``: the groups' data from :func:`_corrections`. Returns the smaller of the two totals.
    """
    N, n = U.shape
    k = C.shape[0]
    per_point = 0.0
    joint = 0.0
    Q = np.zeros((k * n, k * n))
    for i in range(N):
        zs = 0.0
        a = 0
        m = 0
        E2 = 0.0
        r2 = 0.0
        for j in range(k):
            if Z0[i, j] > 0.0:
                zs += Z0[i, j]
            if act[i, j]:
                a += 1
                m |= 1 << j
                E2 += chord[j] * chord[j]
                r2 += (omc[j] * abs(lev[i, j])) ** 2
        per_point += zs * tang[i]
        if zs == 0.0:
            continue
        if a < 2:
            joint += zs * tang[i]
            continue
        rb = d1[i] * (sig[m] - math.sqrt(E2))  # d1_i = (bound on ||r_i||) / (sigma - E)
        # third-order rest: (1 - cos phi_j) <c_j, delta'_i> and <t_j, M_C^+ rho2 + (M_W^+ - M_C^+) r_i>
        for j in range(k):
            if Z0[i, j] > 0.0:
                joint += Z0[i, j] * (omc[j] * d1[i] + sth[j] * (math.sqrt(r2) / sig[m] + dpinv[m] * rb))
        for j in range(k):
            if Z0[i, j] <= 0.0:
                continue
            for ll in range(k):
                if not act[i, ll]:
                    continue
                # block (j, ll): z0_ij (P_{c_j^perp} m_il) (P_{c_ll^perp} u0_i)^T
                mj = 0.0
                for d in range(n):
                    mj += C[j, d] * Mplus[m, d, ll]
                for d in range(n):
                    md = Z0[i, j] * (Mplus[m, d, ll] - mj * C[j, d])
                    for e in range(n):
                        Q[j * n + d, ll * n + e] += md * (U[i, e] - lev[i, ll] * C[ll, e])
    s2 = 0.0
    for j in range(k):
        s2 += sth[j] * sth[j]
    ev = np.linalg.eigvalsh(0.5 * (Q + Q.T))
    joint += max(abs(ev[0]), abs(ev[-1])) * s2
    return min(per_point, joint * (1.0 + 1e-10))


@nb.njit(**_JIT)
def _assemble(X, lam, C, theta, Z0, U, enorm, chord, act, d1, vb, ztang, v2):  # pragma: no cover - compiled
    """The bound of docs/theory.md §7.6 from the corrections' bounds (``ztang`` from :func:`_tang_joint`).

    ``||v_i||`` enters linearly with weight ``c_i = ||e_i|| + sum_j z0_ij chi_j`` and quadratically; the
    per-point bounds ``vb_i`` and the total ``sum_i ||v_i||^2 <= v2`` each bound both (Cauchy-Schwarz for
    the linear sum), and the smaller is used.
    """
    N, n = X.shape
    k = C.shape[0]
    # q(u0), with a bound on its rounding
    q = 0.0
    qabs = 0.0
    for i in range(N):
        for d in range(n):
            t = 2.0 * X[i, d] * U[i, d] - U[i, d] * U[i, d]
            q += t
            qabs += abs(2.0 * X[i, d] * U[i, d]) + U[i, d] * U[i, d]
    K = N * n + 8
    q = (q - (K * _U / (1.0 - K * _U)) * qabs) / N
    # first-order term: min over the cap of <c_j - w, G_j>
    lin = 0.0
    for j in range(k):
        g2 = 0.0
        cg = 0.0
        Gj = np.zeros(n)
        for i in range(N):
            z = Z0[i, j]
            if z > 0.0:
                for d in range(n):
                    Gj[d] += z * U[i, d]
        for d in range(n):
            g2 += Gj[d] * Gj[d]
            cg += C[j, d] * Gj[d]
        g = math.sqrt(g2)
        if g > 0.0:
            cb = cg / g
            if cb > 1.0:
                cb = 1.0
            if cb < -1.0:
                cb = -1.0
            beta = math.acos(cb)
            rest = beta - theta[j]
            best = g * (math.cos(rest) if rest > 0.0 else 1.0)
            lin += (cg - best) - 1e-12 * g
    corr = 0.0  # terms in delta'_i
    quad = 0.0  # sum_i ||delta'_i||^2 (orthogonal to v_i: row space and null space of M_i(W))
    vlin = 0.0  # sum_i c_i ||v_i|| by the per-point bounds
    c2 = 0.0  # sum_i c_i^2 over the points that carry
    vsq = 0.0  # sum_i ||v_i||^2 by the per-point bounds
    for i in range(N):
        ci = enorm[i]
        for j in range(k):
            if Z0[i, j] > 0.0:
                ci += Z0[i, j] * chord[j]
        corr += enorm[i] * d1[i]
        quad += d1[i] * d1[i]
        if vb[i] > 0.0:
            vlin += ci * vb[i]
            c2 += ci * ci
            vsq += vb[i] * vb[i]
    corr += ztang + min(vlin, math.sqrt(c2) * math.sqrt(v2) * (1.0 + 8.0 * _U))
    quad += min(vsq, v2)
    bound = q + (2.0 / N) * (lin - corr) - quad / N
    return bound - 1e-13 * (abs(bound) + 1.0)


def dual_point(U, C, W, act, carrier):
    """The proof's dual point at one dictionary ``W`` of the caps, written out in numpy (docs/theory.md §7.6).

    ``delta'_i = M_i(W)^+ r_i`` with ``r_ij = <c_j - w_j, u0_i>`` over point ``i``'s pairs in ``act``, and
    ``v_i = P_i(W) mu`` on the ``carrier`` points with ``(sum_carriers P_i(W)) mu = -sum_i delta'_i``. The
    bound never builds it (it bounds its norms over the whole node); the tests and
    ``benchmarks/finite_bound_loss.py`` do, at sampled dictionaries. Returns ``(delta', v)``, both ``(N, n)``.
    """
    N, n = U.shape
    dprime = np.zeros((N, n))
    P = []
    for i in range(N):
        M = W[act[i]]
        Pi = np.eye(n)
        if M.shape[0]:
            Mp = np.linalg.pinv(M)
            dprime[i] = Mp @ ((C[act[i]] - M) @ U[i])
            Pi = Pi - Mp @ M
        P.append(Pi)
    v = np.zeros((N, n))
    if carrier.any():
        mu = np.linalg.solve(sum(P[i] for i in range(N) if carrier[i]), -dprime.sum(axis=0))
        for i in np.flatnonzero(carrier):
            v[i] = P[i] @ mu
    return dprime, v
