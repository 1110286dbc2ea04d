"""Matplotlib figures (PNG) for solutions and experiments.

Every figure here is a :class:`matplotlib.figure.Figure` built directly, not
through :mod:`matplotlib.pyplot`: the library never selects or switches a
backend (a notebook keeps its own), never registers figures with pyplot's
global state, and writes PNGs with ``Figure.savefig`` (which renders with Agg
whatever the interactive backend is).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # matplotlib is imported when a figure is made, not with widelimit
    from matplotlib.figure import Figure

__all__ = ["colormap", "figure", "plot_finite_solution", "plot_solution", "save_figure", "subplots"]


def figure(**fig_kw) -> Figure:
    """A new :class:`~matplotlib.figure.Figure` (``figsize=``, ``dpi=`` ...), unknown to pyplot."""
    from matplotlib.figure import Figure

    return Figure(**fig_kw)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, dpi=None, **subplot_kw):
    """``(fig, axes)`` like ``pyplot.subplots`` but on a new pyplot-free :class:`Figure`.

    ``subplot_kw`` goes to :meth:`Figure.subplots` (``sharey=``, ``gridspec_kw=`` ...).
    """
    fig = figure(figsize=figsize, dpi=dpi)
    return fig, fig.subplots(nrows, ncols, **subplot_kw)


def colormap(name: str):
    """The registered colormap ``name`` (``matplotlib.colormaps[name]``)."""
    import matplotlib

    return matplotlib.colormaps[name]


def _plane(D, origin: str):
    """The two directions the data ``D = X - origin`` are drawn in, ``(P (n, 2), axis labels)``: the plane
    itself for 2-D data, the line (and a zero second axis) for 1-D, else the top two principal directions."""
    n = D.shape[1]
    if n == 2:
        return np.eye(2), ("x1", "x2")
    _, _, Vt = np.linalg.svd(D[: min(len(D), 20000)], full_matrices=False)
    P = Vt[:2].T if Vt.shape[0] >= 2 else np.c_[Vt[0], np.zeros(n)]
    return P, (f"PC1 of X - {origin}", f"PC2 of X - {origin}")


def plot_solution(X, solution, path, *, geometric_median=None, title: str | None = None) -> Path:
    """Draw a wide-limit solution and save it as a PNG.

    Left: the data around the optimal bias ``b*`` (the plane itself for 2-D
    data, else the top two principal directions of ``X - b*``), points
    coloured by ray, the atoms as arrows from ``b*``, the ``lam`` circle (exact
    in 2-D) and, if given, the geometric median. Right: the sorted distances
    ``||x_i - b*||`` against ``lam``: points beyond it get a nonzero code.

    Returns
    -------
    Path
        The written file.
    """
    X = np.asarray(X, dtype=np.float64)
    b = solution.bias
    lam = solution.lam
    D = X - b
    P, axes_label = _plane(D, "b*")
    Y = D @ P
    fig, (ax, ax2) = subplots(1, 2, figsize=(11, 5))
    rays = solution.rays
    cmap = colormap("tab10" if solution.width <= 10 else "viridis")
    within = rays < 0
    ax.scatter(Y[within, 0], Y[within, 1], s=12, c="0.6", label=f"within lam ({int(within.sum())})")
    if solution.width:
        colors = cmap((rays[~within] % 10) / 9 if solution.width <= 10 else rays[~within] / max(1, solution.width - 1))
        ax.scatter(Y[~within, 0], Y[~within, 1], s=14, c=colors, label=f"on {solution.width} rays")
        A = solution.dictionary @ P
        reach = np.zeros(solution.width)  # each atom drawn as long as its farthest point
        np.maximum.at(reach, rays[~within], solution.code_values[~within] + lam)
        for j, a in enumerate(A[:50]):
            ax.annotate("", xy=a * reach[j], xytext=(0, 0), annotation_clip=False,
                        arrowprops=dict(arrowstyle="->", color="k", lw=1.0, alpha=0.7))
    th = np.linspace(0, 2 * np.pi, 200)
    ax.plot(lam * np.cos(th), lam * np.sin(th), "k--", lw=1, label="lam ball" + ("" if X.shape[1] == 2 else " (projected)"))
    ax.plot([0], [0], "r*", ms=14, label="b* (Huber median)")
    if geometric_median is not None:
        g = (np.asarray(geometric_median) - b) @ P
        ax.plot([g[0]], [g[1]], "bP", ms=10, label="geometric median")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(axes_label[0])
    ax.set_ylabel(axes_label[1])
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or f"wide-limit optimum: width {solution.width}, lam = {lam:g}")
    r = np.sort(np.linalg.norm(D, axis=1))
    ax2.plot(np.arange(r.size), r, ".", ms=3)
    ax2.axhline(lam, color="k", ls="--", lw=1, label="lam")
    ax2.set_xlabel("points, sorted")
    ax2.set_ylabel("||x_i - b*||")
    c = solution.certificate
    ax2.set_title(f"value {c.value:.6g}, certified gap {c.gap:.1e}")
    ax2.legend(fontsize=8)
    return save_figure(fig, path)


def plot_finite_solution(X, solution, path, *, title: str | None = None) -> Path:
    """Draw a finite-width solution (:class:`widelimit.FiniteSolution`) and save it as a PNG.

    Left: the data around the bias ``b`` (the plane itself for 2-D data, else the top two principal
    directions of ``X - b``), each point coloured by the atom that carries most of its code (grey: no
    code), each atom an arrow from ``b`` as long as its largest code. Right: the search's value and
    certified lower bound against time (``solution.history``), with the wide-limit bound that holds at
    every width (docs/theory.md §7.5).

    Returns
    -------
    Path
        The written file.
    """
    X = np.asarray(X, dtype=np.float64)
    b = np.asarray(solution.bias, dtype=np.float64)
    W = np.asarray(solution.dictionary, dtype=np.float64)
    Z = np.asarray(solution.codes, dtype=np.float64)
    D = X - b
    P, axes_label = _plane(D, "b")
    Y = D @ P
    fig, (ax, ax2) = subplots(1, 2, figsize=(11, 5))
    k = W.shape[0]
    cmap = colormap("tab10")
    used = Z.max(axis=1) > 0
    owner = Z.argmax(axis=1)
    ax.scatter(Y[~used, 0], Y[~used, 1], s=12, c="0.6", label=f"no code ({int((~used).sum())})")
    for j in range(k):
        on = used & (owner == j)
        ax.scatter(Y[on, 0], Y[on, 1], s=14, color=cmap(j % 10), label=f"mostly atom {j + 1} ({int(on.sum())})")
        a = (W[j] @ P) * max(float(Z[:, j].max()), 0.0)
        if np.any(a):
            ax.annotate("", xy=a, xytext=(0, 0), annotation_clip=False,
                        arrowprops=dict(arrowstyle="->", color=cmap(j % 10), lw=1.5))
    ax.plot([0], [0], "r*", ms=14, label="bias b")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(axes_label[0])
    ax.set_ylabel(axes_label[1])
    ax.legend(fontsize=8, loc="best")
    state = "certified" if solution.certified else f"not certified ({solution.status})"
    ax.set_title(f"{title or f'width {k}, lam = {solution.lam:g}'}: {state}")
    hist = np.asarray(solution.history, dtype=np.float64).reshape(-1, 3)
    if hist.size:
        ax2.step(hist[:, 0], hist[:, 2], where="post", label="value (best triple)")
        ax2.step(hist[:, 0], hist[:, 1], where="post", label="certified lower bound")
    ax2.axhline(solution.wide_lower_bound, color="k", ls="--", lw=1, label="wide-limit bound (every width)")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("objective")
    ax2.set_title(f"value {solution.value:.6g}, relative gap {solution.rel_gap:.1e}, {solution.n_iter} nodes")
    ax2.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Figure, path, dpi: int = 120) -> Path:
    """Lay out ``fig`` and write it as a PNG at ``path`` (folders created); return the path.

    ``fig`` is a pyplot-free :class:`Figure` (from :func:`figure` / :func:`subplots`): nothing
    to close, it is freed with its last reference.
    """
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
