"""``widelimit solve DATA --width K``: what only the finite width adds (widelimit.finite) -- its width and files.

The run itself and its table are ``solve``'s (:mod:`widelimit.cli.solve`, ``_common._solution_rows``):
``solve`` returns a solution with the same shared fields and ``.certificate`` at any width.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._json import write_json
from ..plot import plot_finite_solution


def parse_width(text: str) -> int:
    """``--width``: a positive integer."""
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"--width must be a positive integer, got {text!r}") from None
    if k <= 0:
        raise ValueError(f"--width must be a positive integer, got {text!r}")
    return k


def write_finite_solution(out: Path, X, sol, title: str) -> list[Path]:
    """``solution.npz`` (dictionary, codes, bias), ``solution.json`` and ``solution.png`` of a finite-width solution."""
    np.savez(out / "solution.npz", dictionary=sol.dictionary, codes=sol.codes, bias=sol.bias)
    write_json(out / "solution.json", sol.as_dict())
    plot_finite_solution(X, sol, out / "solution.png", title=title)
    return [out / "solution.npz", out / "solution.json", out / "solution.png"]
