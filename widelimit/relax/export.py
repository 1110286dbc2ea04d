r"""Relaxation-benchmark instances as standard conic problems: SDPA sparse (``.dat-s``) and CBF files.

The Q-problem (docs/theory.md §2) over a cone ``K`` (``dnn`` or ``nonneg``) is
written as a linear semidefinite program in free variables ``x`` by the Schur
complement of its matrix-fractional term:

.. math::

    \min_{Q,\ b,\ T}\ \frac{\lambda}{N}\big(\operatorname{tr} T + \mathbf 1^\top Q \mathbf 1\big)
    \quad\text{s.t.}\quad
    \begin{pmatrix} Q + \lambda I & X - \mathbf 1 b^\top \\ (X - \mathbf 1 b^\top)^\top & T \end{pmatrix} \succeq 0,
    \qquad Q \in K,

with ``T`` a symmetric ``n x n`` matrix (``T >= Xt^T (Q + lam I)^{-1} Xt`` at the
optimum, with equality on the trace). ``K = dnn`` adds the block ``Q >= 0``
(PSD) and ``Q_ij >= 0`` for ``i < j`` (the diagonal is nonnegative through the
PSD block); ``K = nonneg`` has no PSD block on ``Q`` and ``Q_ij >= 0`` for all
``i <= j``. Both have the optimal value ``widelimit.solve(X, lam=lam).value``
(docs/theory.md §4). The objective has no constant term, so the optimal value
of the file's problem **is** that optimum, with nothing to add.

Variables, in this order (``m`` in all):

1. ``Q_ij`` for ``i < j`` (row-major), ``N(N-1)/2`` of them;
2. ``Q_ii``, ``N``;
3. ``b_k``, ``n``;
4. ``T_kl`` for ``k <= l`` (row-major), ``n(n+1)/2``.

Constraints ``sum_v x_v F_v + D ⪰ 0``, block by block:

* block 1 (``N + n``): the Schur-complement matrix above; ``D = [[lam I, X], [X^T, 0]]``;
* block 2 (``N``, ``dnn`` only): ``Q``;
* nonnegativity of ``Q_ij`` (``i < j``; and ``Q_ii`` for ``nonneg``): an LP block in
  SDPA, the cone ``L+`` of the first variables in CBF.

SDPA's primal is ``min c^T x`` s.t. ``sum_v F_v x_v - F_0 ⪰ 0``, so ``F_0 = -D``.
CBF (version 3) uses ``VAR`` (``L+`` then ``F``), ``PSDCON``, ``OBJACOORD``,
``HCOORD`` (lower triangle) and ``DCOORD``. Numbers are written as Python's ``repr``
(the shortest decimal that reads back as the same float64), so the file holds the
float64 instance exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["FORMATS", "EXPORT_CONES", "ConicData", "conic_data", "write_sdpa", "write_cbf",
           "export_instances", "cvxpy_problem", "file_name"]

#: File formats and their extensions.
FORMATS = {"sdpa": ".dat-s", "cbf": ".cbf"}
#: Cones the export writes (both have the CP optimum, docs/theory.md §4).
EXPORT_CONES = ("dnn", "nonneg")


@dataclass(frozen=True)
class ConicData:
    r"""``min c^T x`` s.t. ``sum_v x_v F_{k,v} + D_k ⪰ 0`` (blocks ``k``), ``x_v >= 0`` for ``v < n_nonneg``.

    Attributes
    ----------
    c : ndarray (m,)
    block_sizes : list of int
        Sizes of the PSD blocks.
    entries : list of (var, row, col, val) arrays
        One tuple of equal-length arrays per block, upper triangle (``row <= col``),
        0-based; ``var = -1`` marks an entry of ``D``.
    n_nonneg : int
        The first ``n_nonneg`` variables are nonnegative, the rest free.
    """

    c: np.ndarray
    block_sizes: list
    entries: list
    n_nonneg: int

    @property
    def m(self) -> int:
        return int(self.c.size)


def _check_cone(cone: str) -> str:
    cone = str(cone).lower()
    if cone not in EXPORT_CONES:
        raise ValueError(f"unknown cone {cone!r} for export; choose from {', '.join(EXPORT_CONES)}")
    return cone


def conic_data(X, *, lam, cone: str = "dnn") -> ConicData:
    """The SDP of the module docstring, in coordinates."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1 or not np.isfinite(X).all():
        raise ValueError("X must be a finite 2-D array with at least two rows and one column")
    lam = float(lam)
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a positive number, got {lam!r}")
    cone = _check_cone(cone)
    N, n = X.shape
    iu, ju = np.triu_indices(N, 1)
    P = iu.size
    ku, lu = np.triu_indices(n)
    oQd, ob, oT = P, P + N, P + N + n
    m = oT + ku.size
    c = np.zeros(m)
    c[:P] = 2.0 * lam / N
    c[oQd:ob] = lam / N
    c[oT + np.flatnonzero(ku == lu)] = lam / N

    ar = np.arange
    # block 1: [[Q + lam I, X - 1 b^T], [., T]]
    rows_i, cols_j = np.repeat(ar(N), n), N + np.tile(ar(n), N)
    b1 = (
        np.concatenate([ar(P), oQd + ar(N), ob + np.tile(ar(n), N), oT + ar(ku.size), -np.ones(N + N * n, int)]),
        np.concatenate([iu, ar(N), rows_i, N + ku, ar(N), rows_i]),
        np.concatenate([ju, ar(N), cols_j, N + lu, ar(N), cols_j]),
        np.concatenate([np.ones(P + N), -np.ones(N * n), np.ones(ku.size), np.full(N, lam), X.ravel()]),
    )
    blocks, sizes = [b1], [N + n]
    if cone == "dnn":
        blocks.append((np.concatenate([ar(P), oQd + ar(N)]), np.concatenate([iu, ar(N)]),
                       np.concatenate([ju, ar(N)]), np.ones(P + N)))
        sizes.append(N)
        n_nonneg = P
    else:
        n_nonneg = P + N
    return ConicData(c=c, block_sizes=sizes, entries=blocks, n_nonneg=n_nonneg)


def _write_rows(fh, cols) -> None:
    """One line per row of the columns, space separated.

    Integers as they are, floats as Python's ``repr`` (the shortest decimal that reads back as the same
    float64), so the file holds the instance exactly.
    """
    lists = [np.asarray(col).tolist() for col in cols]
    if lists and len(lists[0]):
        fh.write("\n".join(" ".join(map(repr, row)) for row in zip(*lists)) + "\n")


def write_sdpa(X, path, *, lam, cone: str = "dnn", comment: str = "") -> Path:
    """Write the instance as an SDPA sparse file (``.dat-s``); returns the path.

    Block structure: the PSD blocks of :func:`conic_data`, then an LP block
    (negative size) for ``Q_ij >= 0``. Matrix 0 is ``F_0 = -D``.
    """
    d = conic_data(X, lam=lam, cone=cone)
    path = Path(path)
    struct = [str(s) for s in d.block_sizes] + [f"-{d.n_nonneg}"]
    with open(path, "w") as fh:
        for line in (comment or "widelimit relaxation benchmark").splitlines():
            fh.write(f'"{line}\n')
        fh.write(f"{d.m}\n{len(struct)}\n{' '.join(struct)}\n")
        fh.write(" ".join(map(repr, d.c.tolist())) + "\n")
        for k, (var, r, col, val) in enumerate(d.entries):
            val = np.where(var < 0, -val, val)  # F_0 = -D
            order = np.argsort(var, kind="stable")
            _write_rows(fh, [var[order] + 1, np.full(var.size, k + 1), r[order] + 1, col[order] + 1,
                             val[order]])
        v = np.arange(d.n_nonneg)
        _write_rows(fh, [v + 1, np.full(v.size, len(struct)), v + 1, v + 1, np.ones(v.size, dtype=int)])
    return path


def write_cbf(X, path, *, lam, cone: str = "dnn", comment: str = "") -> Path:
    """Write the instance as a CBF (version 3) file; returns the path.

    ``VAR``: ``L+`` for the nonnegative ``Q`` entries, ``F`` for the rest;
    ``PSDCON``: the PSD blocks, ``HCOORD`` / ``DCOORD`` in the lower triangle.
    """
    d = conic_data(X, lam=lam, cone=cone)
    path = Path(path)
    with open(path, "w") as fh:
        for line in (comment or "widelimit relaxation benchmark").splitlines():
            fh.write(f"# {line}\n")
        fh.write("VER\n3\n\nOBJSENSE\nMIN\n\n")
        free = d.m - d.n_nonneg
        cones = [f"L+ {d.n_nonneg}"] * (d.n_nonneg > 0) + [f"F {free}"] * (free > 0)
        fh.write(f"VAR\n{d.m} {len(cones)}\n" + "\n".join(cones) + "\n\n")
        fh.write(f"PSDCON\n{len(d.block_sizes)}\n" + "\n".join(map(str, d.block_sizes)) + "\n\n")
        nz = np.flatnonzero(d.c)
        fh.write(f"OBJACOORD\n{nz.size}\n")
        _write_rows(fh, [nz, d.c[nz]])
        H, D = [], []
        for k, (var, r, col, val) in enumerate(d.entries):
            # upper (r <= col) -> lower triangle (row >= col)
            h, dd = var >= 0, var < 0
            H.append([np.full(h.sum(), k), var[h], col[h], r[h], val[h]])
            D.append([np.full(dd.sum(), k), col[dd], r[dd], val[dd]])
        fh.write(f"\nHCOORD\n{sum(h[0].size for h in H)}\n")
        for h in H:
            _write_rows(fh, h)
        fh.write(f"\nDCOORD\n{sum(x[0].size for x in D)}\n")
        for x in D:
            _write_rows(fh, x)
    return path


def file_name(inst, fmt: str, cone: str) -> str:
    """``<instance name>-<cone><ext>`` (see :attr:`BenchInstance.name`)."""
    return f"{inst.name}-{cone}{FORMATS[fmt]}"


def export_instances(instances, out_dir, *, fmt: str = "sdpa", cone: str = "dnn") -> list[dict]:
    """Write every instance (problem file and ``.npy`` of ``X``) and ``out_dir/instances.json``.

    Parameters
    ----------
    instances : iterable of :class:`widelimit.relax.families.BenchInstance`
    out_dir : path
        Created if missing; must not exist as a non-empty folder (nothing is overwritten).
    fmt : {"sdpa", "cbf"}
    cone : {"dnn", "nonneg"}

    Returns
    -------
    list of dict
        The records of ``instances.json``: ``file``, ``data``, ``lam``, ``optimum``,
        ``N``, ``n``, ``family``, ``cone`` (paths relative to ``out_dir``), and
        ``format``, ``seed``, ``certified_gap`` (of ``optimum``), ``params``, ``n_vars``, ``bytes``.
    """
    fmt = str(fmt).lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    cone = _check_cone(cone)
    instances = list(instances)
    names = [inst.name for inst in instances]
    dup = next((nm for i, nm in enumerate(names) if nm in names[:i]), None)
    if dup is not None:
        raise ValueError(f"two instances have the same name {dup!r} (same family, N, n, seed and parameters)")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"export folder {str(out)!r} exists and is not empty; choose a new folder")
    out.mkdir(parents=True, exist_ok=True)
    writer = write_sdpa if fmt == "sdpa" else write_cbf
    records = []
    for inst in instances:
        fname = file_name(inst, fmt, cone)
        comment = (f"widelimit relaxation benchmark: family {inst.family}, N = {inst.N}, n = {inst.n}, "
                   f"seed {inst.seed}, lam = {inst.lam!r}, cone {cone}\n"
                   f"optimal value (widelimit.solve) = {inst.optimum!r}")
        writer(inst.X, out / fname, lam=inst.lam, cone=cone, comment=comment)
        data = f"{inst.name}.npy"
        if not (out / data).exists():
            np.save(out / data, inst.X)
        N, n = inst.N, inst.n
        records.append({
            "file": fname, "data": data, "lam": inst.lam, "optimum": inst.optimum, "N": N, "n": n,
            "family": inst.family, "cone": cone, "format": fmt, "seed": inst.seed,
            "certified_gap": inst.certified_gap,
            "params": {k: (float(v) if isinstance(v, float) else v) for k, v in inst.params.items()},
            "n_vars": N * (N + 1) // 2 + n + n * (n + 1) // 2, "bytes": (out / fname).stat().st_size,
        })
    (out / "instances.json").write_text(json.dumps(records, indent=1) + "\n")
    return records


def cvxpy_problem(data: ConicData):
    """The same problem as a cvxpy ``Problem`` in the variable vector ``x`` (for any cvxpy conic solver).

    Returns ``(problem, x)``. Each block ``sum_v x_v F_v + D`` is one sparse
    matrix-vector product, filled on both triangles.
    """
    import cvxpy as cp
    import scipy.sparse as sp

    x = cp.Variable(data.m)
    cons = [x[: data.n_nonneg] >= 0] if data.n_nonneg else []
    for s, (var, r, col, val) in zip(data.block_sizes, data.entries):
        h = var >= 0
        off = h & (r != col)
        rr = np.concatenate([r[h], col[off]])
        cc = np.concatenate([col[h], r[off]])
        A = sp.csr_matrix((np.concatenate([val[h], val[off]]), (rr + cc * s, np.concatenate([var[h], var[off]]))),
                          shape=(s * s, data.m))
        Dm = np.zeros((s, s))
        Dm[r[~h], col[~h]] = val[~h]
        Dm[col[~h], r[~h]] = val[~h]
        cons.append(cp.reshape(A @ x + Dm.ravel(order="F"), (s, s), order="F") >> 0)
    return cp.Problem(cp.Minimize(data.c @ x), cons), x
