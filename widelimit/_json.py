"""Plain-Python (JSON-serialisable) copies of results: one converter for the CLI, reports and experiments.

Non-finite floats (``nan``, ``inf``, ``-inf``) are written as JSON ``null``: strict JSON has no
infinities, and ``json.dumps`` would otherwise write the non-standard tokens ``Infinity`` / ``NaN``
that many readers reject. A reader that needs to tell ``inf`` from ``nan`` gets that from the field's
documentation (e.g. a gap is ``null`` when no certificate was computed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["dumps", "to_jsonable", "write_json"]


def to_jsonable(obj):
    """Recursively convert NumPy arrays/scalars and tuples to JSON-safe Python values, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.floating):
        obj = float(obj)
    elif isinstance(obj, np.integer):
        return int(obj)
    elif isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj, indent: int | None = None) -> str:
    """Strict JSON text of ``obj`` (via :func:`to_jsonable`; ``allow_nan=False``, so never ``Infinity``/``NaN``)."""
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False)


def write_json(path, obj, indent: int = 2) -> Path:
    """Write ``obj`` as strict JSON (non-finite numbers as ``null``) to ``path`` (folders created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(obj, indent=indent) + "\n")
    return path
