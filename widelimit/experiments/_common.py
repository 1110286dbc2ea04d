"""Shared output helpers for experiments: JSON of the numbers and PNG figures."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write_json", "save_figure", "pyplot"]


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(out_dir, stem: str, obj) -> Path | None:
    """Write ``obj`` (numpy values converted) to ``out_dir/stem.json``; no-op when ``out_dir`` is None."""
    if out_dir is None:
        return None
    from ..cli import _jsonable

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(_jsonable(obj), indent=1) + "\n")
    return path


def save_figure(fig, out_dir, stem: str, dpi: int = 90) -> Path | None:
    """Save ``fig`` as ``out_dir/stem.png`` and close it (always closed, even without ``out_dir``)."""
    plt = pyplot()
    path = None
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
