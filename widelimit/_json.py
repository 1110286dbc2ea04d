"""Plain-Python (JSON-serialisable) copies of results: one converter for the CLI, reports and experiments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["to_jsonable", "write_json"]


def to_jsonable(obj):
    """Recursively convert NumPy arrays/scalars, tuples and non-finite floats to JSON-safe Python values."""
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
    if isinstance(obj, float) and not np.isfinite(obj):
        return None if np.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def write_json(path, obj, indent: int = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` (folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(obj), indent=indent) + "\n")
    return path
