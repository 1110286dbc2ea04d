"""Shared helpers for the benchmark scripts: timing, results files, environment record."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(best wall time in s, result of the last call)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def environment() -> dict:
    import scipy

    env = {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
           "machine": platform.machine(), "cpus": os.cpu_count()}
    env["blas_threads_env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if os.environ.get(k)}
    env["load_average_1min"] = os.getloadavg()[0]
    try:
        import cvxpy

        env["cvxpy"] = cvxpy.__version__
    except ImportError:
        pass
    return env


def write(name: str, payload: dict, table_md: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = dict(payload, environment=environment(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=float))
    (RESULTS / f"{name}.md").write_text(table_md)
    print(table_md)
