"""Shared output helpers for experiments: JSON of the numbers and PNG figures (no-ops without ``out_dir``)."""

from __future__ import annotations

from pathlib import Path

from ..._json import write_json as _write_json
from ...plot import colormap, figure, subplots
from ...plot import save_figure as _save_figure

__all__ = ["write_json", "save_figure", "subplots", "figure", "colormap"]


def write_json(out_dir, stem: str, obj) -> Path | None:
    """Write ``obj`` (numpy values converted) to ``out_dir/stem.json``; no-op when ``out_dir`` is None."""
    if out_dir is None:
        return None
    return _write_json(Path(out_dir) / f"{stem}.json", obj, indent=1)


def save_figure(fig, out_dir, stem: str, dpi: int = 90) -> Path | None:
    """Save ``fig`` (a pyplot-free Figure) as ``out_dir/stem.png``; no-op without ``out_dir``."""
    if out_dir is None:
        return None
    return _save_figure(fig, Path(out_dir) / f"{stem}.png", dpi=dpi)
