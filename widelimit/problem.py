r"""The front door: one dictionary-learning problem, its data and everything solved on it.

A :class:`Problem` is the data ``X`` (an array, a memory map, a folder of shards or a
Dask array, opened once) and the sparsity ``lam`` of

.. math:: \min_{W, Z \ge 0, b}\ \frac1N \sum_i \|z_i W + b - x_i\|^2 + 2\lambda\|z_i\|_1
          \qquad (\|W_j\| = 1),

(docs/theory.md §1). Everything asked of the problem -- the exact wide-limit optimum,
the certified bound, the certificate of a candidate ``(W, Z, b)``, a convex
relaxation, the gradient solver at a finite width, the width frontier, an SAE's
certificate -- is computed on that one data object with one engine (made when the
problem is made, see :mod:`widelimit.engine`) and shares the problem's cached Huber
median, so the median's passes are made once. Results are separate objects
(:class:`~widelimit.exact.solve.WideLimitSolution`, :class:`~widelimit.exact.certificate.Certificate`,
...), as a cvxpy ``Problem`` is separate from its solution.

The module-level functions (:func:`widelimit.solve`, :func:`widelimit.verify`, ...) are the
same computations without the cache.

Examples
--------
>>> import numpy as np, widelimit as wl
>>> X = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [10.0, 0.0]])
>>> prob = wl.Problem(X, lam=1.0)
>>> sol = prob.solve()
>>> round(sol.value, 9), sol.width
(4.666666667, 1)
>>> prob.verify(sol.dictionary, sol.sparse_codes, sol.bias).certified
True
"""

from __future__ import annotations

import os
from pathlib import Path

from ._params import LAM, PROGRESS, Boolean, Data, Passed, PathLike, String, check_value, validate_params
from .coding import optimal_codes
from .data import open_activations
from .engine import engine_for
from .exact.certificate import Certificate, verify
from .exact.median import MedianResult, huber_median
from .exact.solve import WideLimitSolution, solve
from .finite import FiniteSolution
from .exact.stationarity import first_order_conditions
from .learn.frontier import frontier
from .learn.gradient import fit_dictionary
from .relax.cones import relax
from .sae.certify import certify_sae

__all__ = ["Problem"]


class Problem:
    """A wide-limit dictionary-learning problem: data ``X`` and sparsity ``lam``.

    Parameters
    ----------
    X : array (N, n), torch tensor, ``np.memmap``, :class:`~widelimit.data.source.ActivationSource`, ``dask.array``, str or Path
        The data, one point per row (float32 is read as it is stored and widened
        entry by entry). A path is opened with :func:`widelimit.open_activations`
        (``.npy`` memory-mapped, ``.npz``, ``.safetensors``, ``.csv``, ``.pt``, a folder
        of shards, a ``datasets`` Arrow cache); nothing is read into memory here.
    lam : float
        Sparsity, ``> 0`` (SAELens ``l1_coefficient = 2 lam``).
    signed : bool
        Signed codes (``z`` in R with penalty ``|z|``): atoms are lines.
    key : str, optional
        With a path: the array inside an ``.npz`` / ``.safetensors`` file.

    Attributes
    ----------
    data : array-like (N, n)
        The validated data object every computation of this problem reads.
    engine : LocalEngine or DaskEngine
        The engine that runs the passes over ``data``, made once here.
    lam, signed, n_points, dim
    """

    @validate_params({"X": Data(finite=False, paths=True), "lam": LAM, "signed": Boolean(), "key": [String(), None]})
    def __init__(self, X, *, lam, signed: bool = False, key: str | None = None):
        if isinstance(X, (str, os.PathLike)):
            X = check_value(open_activations(Path(X), key=key), Data(finite=False), "X")
        elif key is not None:
            raise ValueError("key: only meaningful when X is a path")
        self.data = X  # checked (the first pass checks every row)
        self.lam = lam
        self.signed = signed
        self.engine = engine_for(self.data)
        self._median: MedianResult | None = None
        self._solution: WideLimitSolution | None = None

    # ---- description ----------------------------------------------------------------
    @property
    def n_points(self) -> int:
        """Number of points ``N``."""
        return int(self.data.shape[0])

    @property
    def dim(self) -> int:
        """Dimension ``n`` of the points."""
        return int(self.data.shape[1])

    @property
    def fingerprint(self) -> str:
        """The XXH64 content fingerprint of ``data`` (every byte of every row), taken in the median's first pass.

        Every certificate made by this problem is checked against it: a median, a checkpoint
        or a solution of other data is refused (docs/theory.md §8.5).
        """
        return self.bound().fingerprint

    def __repr__(self) -> str:
        return f"Problem(N={self.n_points}, n={self.dim}, lam={self.lam:g}, signed={self.signed})"

    # ---- the wide limit -------------------------------------------------------------
    @validate_params({"progress": PROGRESS, "checkpoint": [PathLike(), None]})
    def bound(self, *, progress=None, checkpoint=None) -> MedianResult:
        """The certified wide-limit optimum ``min_b H(b)`` (docs/theory.md §3), cached.

        Returns the Huber median: ``.value`` is the optimum of the wide-limit problem
        at the returned bias, ``.lower_bound`` a certified lower bound on the loss of
        *every* dictionary of any width with any codes and bias.
        """
        if self._median is None:
            self._median = huber_median(self.data, lam=self.lam, progress=progress, checkpoint=checkpoint)
        return self._median

    @validate_params({"width": Passed("widelimit.solve"), "progress": Passed("widelimit.solve"),
                      "options": Passed("widelimit.solve")})
    def solve(self, *, width: int | None = None, progress=None, **options) -> WideLimitSolution | FiniteSolution:
        """The narrowest global optimum (``width=None``) with its certificate; see :func:`widelimit.solve`.

        With ``width=k`` the certified global optimum among dictionaries of ``k`` atoms. Both carry
        ``.certificate`` and the shared fields of a certified result; :meth:`verify` certifies them
        (signed codes too, for a signed problem).
        """
        if width is not None:
            return solve(self.data, lam=self.lam, width=width, signed=self.signed, progress=progress,
                         median=self._median, **options)
        if self._solution is None or options:
            # the first solve computes the median itself (its last pass also takes the rays' keys)
            sol = solve(self.data, lam=self.lam, signed=self.signed, progress=progress, median=self._median, **options)
            if self._median is None:
                self._median = sol.median
            if options:
                return sol
            self._solution = sol
        return self._solution

    @validate_params({"W": Passed("widelimit.verify"), "Z": Passed("widelimit.verify"),
                      "b": Passed("widelimit.verify"), "options": Passed("widelimit.verify")})
    def verify(self, W, Z, b, **options) -> Certificate:
        """Certificate of a candidate ``(W, Z, b)`` against this problem's optimum; see :func:`widelimit.verify`.

        A signed problem certifies signed codes (``signed=True`` is passed on unless given)."""
        options.setdefault("signed", self.signed)
        return verify(self.data, W, Z, b, lam=self.lam, median=self.bound(), **options)

    @validate_params({"W": Passed("widelimit.optimal_codes"), "b": Passed("widelimit.optimal_codes"),
                      "options": Passed("widelimit.optimal_codes")})
    def optimal_codes(self, W, b, **options):
        """Certified optimal codes for the dictionary ``W`` and bias ``b``; see :func:`widelimit.optimal_codes`."""
        return optimal_codes(self.data, W, b, lam=self.lam, **options)

    @validate_params({"W": Passed("widelimit.first_order_conditions"), "Z": Passed("widelimit.first_order_conditions"),
                      "b": Passed("widelimit.first_order_conditions")})
    def first_order_conditions(self, W, Z, b):
        """Finite-width stationarity margins of ``(W, Z, b)``; see :func:`widelimit.first_order_conditions`."""
        return first_order_conditions(self.data, W, Z, b, lam=self.lam)

    # ---- other solvers on the same data ---------------------------------------------
    @validate_params({"cone": Passed("widelimit.relax.cones.relax"), "solver": Passed("widelimit.relax.cones.relax"),
                      "options": Passed("widelimit.relax.cones.relax")})
    def relax(self, *, cone: str = "dnn", solver: str = "SCS", **options):
        """The convex Q-problem over a CP-cone approximation; see :func:`widelimit.relax.cones.relax`."""
        return relax(self.data, lam=self.lam, cone=cone, solver=solver, **options)

    @validate_params({"width": Passed("widelimit.fit_dictionary"), "options": Passed("widelimit.fit_dictionary")})
    def fit(self, width: int, **options):
        """The gradient solver of the nonconvex objective at ``width`` atoms; see :func:`widelimit.fit_dictionary`."""
        return fit_dictionary(self.data, lam=self.lam, width=width, **options)

    @validate_params({"widths": Passed("widelimit.frontier"), "options": Passed("widelimit.frontier")})
    def frontier(self, widths, **options):
        """Best gradient objective per width against the certified optimum; see :func:`widelimit.frontier`."""
        return frontier(self.data, lam=self.lam, widths=widths, exact=self.solve(), **options)

    @validate_params({"sae": Passed("widelimit.certify_sae"), "options": Passed("widelimit.certify_sae")})
    def certify_sae(self, sae, **options):
        """Certify a trained SAE on this data at this ``lam``; see :func:`widelimit.certify_sae`."""
        return certify_sae(self.data, sae, lam=self.lam, **options)
