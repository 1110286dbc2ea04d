"""Helpers shared by the subcommands: data loading, JSON output, tables, progress."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .._json import dumps as _dumps



# --------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------


def load_data(spec: str, key: str | None = None, seed: int = 0):
    """``(X, default_lam, label)`` from a file path or a built-in dataset name."""
    from ..data import datasets
    from ..data.source import load_array

    if spec in datasets.BUILTIN and not Path(spec).exists():
        X, _ = datasets.load_builtin(spec, seed=seed)
        return X, datasets.BUILTIN[spec][1], f"built-in dataset {spec!r}"
    return load_array(spec, key=key), None, spec


def _console():
    from rich.console import Console

    return Console()


def print_json(obj) -> None:
    """Print exactly one JSON object on stdout."""
    sys.stdout.write(_dumps(obj) + "\n")


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "NO"
    if isinstance(v, (float, np.floating)):
        return f"{v:.10g}"
    return str(v)


def certificate_table(title: str, rows: list[tuple[str, object, str]]):
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("meaning", style="dim")
    for name, val, meaning in rows:
        t.add_row(name, _fmt(val), meaning)
    return t


def _dual_round(c) -> float:
    """Rounding level of ``min G = (lam/N)(1 - max ||e||^2 / lam^2)``: residuals of length lam give +-this."""
    return 8 * np.finfo(np.float64).eps * c.lam / c.n_points


def _solution_rows(sol, geo=None):
    c = sol.certificate
    rows = [
        ("points N x dims n", f"{c.n_points} x {c.dim}", "data size"),
        ("lam", sol.lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("value", c.value, "objective of the returned (W, Z, b)"),
        ("lower bound", c.lower_bound, "certified: no width, dictionary or code does better"),
        ("gap", c.gap, "value - lower bound"),
        ("relative gap", c.rel_gap, f"certified if <= {c.tol:g}"),
        ("width", sol.width, "atoms = rays beyond lam (narrowest optimum)"),
        ("points within lam", int(np.count_nonzero(sol.rays < 0)), "code 0"),
        ("bias stationarity", c.bias_stationarity, "||mean residual||, 0 at the optimal bias"),
        ("min dual entry", c.dual_min, f"min_ij G_ij, >= 0 at an optimum (rounding level {_dual_round(c):.0e})"),
        ("complementarity", c.complementarity, "<G, Q>, 0 at an optimum"),
        ("median passes", sol.median.n_passes, f"passes over X ({sol.median.method})"),
        ("solve passes", sol.n_passes, "passes over X in all (median, rays, dictionary + certificate)"),
    ]
    if not np.array_equal(sol.bias_segment[0], sol.bias_segment[1]):
        rows.append(("optimal bias set", "segment", "collinear data: every b on the segment is optimal"))
    if sol.excess > 1e-12 * max(1.0, abs(sol.value)):
        rows.append(("excess from merging", sol.excess, "ray_tol merged non-identical directions"))
    if geo is not None:
        rows.append(("||b* - geometric median||", float(np.linalg.norm(sol.bias - geo.point)),
                     "0 when no point is within lam of the geometric median"))
    rows.append(("certified", c.certified, "gap within tolerance"))
    return rows


def _write_solution(out: Path, X, sol, geo=None, stem="solution") -> list[Path]:
    from ..plot import plot_solution

    out.mkdir(parents=True, exist_ok=True)
    npz = out / f"{stem}.npz"
    np.savez(npz, bias=sol.bias, bias_segment=sol.bias_segment, dictionary=sol.dictionary,
             rays=sol.rays, code_values=sol.code_values, lam=sol.lam)
    js = out / f"{stem}.json"
    js.write_text(_dumps(sol.as_dict(), indent=2))
    png = plot_solution(X, sol, out / f"{stem}.png", geometric_median=None if geo is None else geo.point)
    return [npz, js, png]


def progress_display(console=None, enabled: bool = True):
    """A context manager yielding ``(callback, None)``: a rich progress bar driven by solver events.

    The callback accepts :class:`widelimit.engine.local.Progress` events (rows of
    the current pass; value and certified bound after each iteration).
    """
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def ctx():
        if not enabled:
            yield None
            return
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[status]}"), console=console, transient=True)
        with bar:
            task = bar.add_task("pass 0", total=None, status="")
            state = {"status": ""}

            def cb(ev):
                if ev.value is not None:
                    gap = ev.value - (ev.lower_bound if ev.lower_bound is not None else ev.value)
                    state["status"] = f"value {ev.value:.10g}  bound {ev.lower_bound:.10g}  gap {gap:.2e}"
                bar.update(task, description=f"pass {ev.pass_index} ({ev.stage})", completed=ev.rows_done,
                           total=ev.rows_total, status=state["status"])

            yield cb

    return ctx()



def open_source(spec: str, key: str | None = None, column: str | None = None):
    """An :class:`~widelimit.data.source.ActivationSource` for a path (file, folder of shards, datasets cache),
    or ``None`` for a built-in dataset name / in-memory formats (.npz .csv .pt)."""
    from ..data.source import ActivationSource

    p = Path(spec)
    if p.is_dir() or p.suffix.lower() in (".npy", ".safetensors", ".arrow"):
        return ActivationSource.open(p, key=key, column=column)
    return None
