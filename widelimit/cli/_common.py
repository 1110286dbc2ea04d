"""Helpers shared by the subcommands: data loading, JSON output, tables, progress."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

from .._json import dumps as _dumps
from .._runtime import resolve_device
from .._params import LAM, NONNEG, NONNEG_INT, POSITIVE, POSITIVE_INT, THREADS, UNIT_OPEN, cli_type
from ..data import datasets
from ..data.shards import show
from ..data.source import check_values, open_activations
from ..exact.gap import allowed_gap
from ..finite import FiniteSolution
from ..plot import plot_solution
from ._guard import rate_text
from ._output import atomic_outputs, check_out_dir, check_out_file, moved  # noqa: F401 (the subcommands' imports)



# --------------------------------------------------------------------------------------
# argument types: bad values are refused by argparse, naming the flag
# --------------------------------------------------------------------------------------


# built from the constraints of the Python parameters (widelimit/_params.py), so that a flag and its
# parameter are refused with the same words: ``argument --tol: must be a finite number >= 0, got -1.0``
positive_float = cli_type(POSITIVE)  #: a finite number > 0
nonneg_float = cli_type(NONNEG)  #: a finite number >= 0 (``nan``, ``inf`` and negatives refused)
lam_float = cli_type(LAM)  #: ``--lam``: a finite number >= the smallest normal float64
unit_interval_float = cli_type(UNIT_OPEN)  #: a number strictly between 0 and 1
positive_int = cli_type(POSITIVE_INT)  #: an integer >= 1
nonneg_int = cli_type(NONNEG_INT)  #: an integer >= 0
threads_int = cli_type(THREADS[0])  #: ``--threads``: an integer from 1 to 4 per usable core


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (``widelimit fit: error: ...``) and exit 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {' '.join(str(message).split())}\n")
        raise SystemExit(2)


# --------------------------------------------------------------------------------------
# data and output folders
# --------------------------------------------------------------------------------------


def load_data(spec: str, key: str | None = None, seed: int = 0, *, column: str | None = None,
              header: bool | None = None, scan: bool = True):
    """``(X, default_lam, label)`` from a path or a built-in dataset name.

    Every path goes through :func:`widelimit.open_activations` (``X`` is then an
    :class:`~widelimit.data.source.ActivationSource`); a built-in name gives an array. An option
    that does not apply (``--key`` on a .npy file, ``--header`` on a built-in dataset, ...) is refused.
    With ``scan`` (the default) every row is read once here and NaN / Inf or rows too large to square
    are refused before any computation, naming the file and the line (text tables) or the row (0-based).
    """
    if spec in datasets.BUILTIN and not Path(spec).exists():
        for flag, v in (("--key", key), ("--column", column), ("--header", header)):
            if v is not None:
                raise ValueError(f"{flag} applies only to data files, not to the built-in dataset {spec!r}")
        X, _ = datasets.load_builtin(spec, seed=seed)
        return X, datasets.BUILTIN[spec][1], f"built-in dataset {spec!r}"
    src = open_activations(spec, key=key, column=column, header=header)
    if scan:
        check_values(src, show(spec))
    return src, None, show(spec)


def in_memory(X) -> np.ndarray:
    """The rows of ``X`` as one writable NumPy array (for the in-memory solvers: torch, cvxpy)."""
    a = np.asarray(X)
    return a if a.flags.writeable else a.copy()


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


def _why_not(c) -> str:
    """Why a certificate of theory.md §8 does not certify: the gap, or the rounding error beside a gap that would."""
    allowed = allowed_gap(c.value, tol=c.tol, atol=c.atol)
    if c.gap <= allowed:
        return (f"its rounding error {c.rounding_error:.1e} is above the {allowed:.1e} the tolerance allows "
                "(float64 cannot resolve the gap; typical of a lam tiny next to the data)")
    return f"gap {c.gap:.1e} is above the {allowed:.1e} the tolerance allows"


def _solution_rows(sol, geo=None):
    """The one table of a solution of ``solve`` at any width (a ``WideLimitSolution`` or a ``FiniteSolution``):
    the shared fields of a certified result, the certificate's dual quantities, then what only one kind has."""
    c = sol.certificate
    finite = isinstance(sol, FiniteSolution)
    rows = [
        ("points N x dims n", f"{c.n_points} x {c.dim}", "data size"),
        ("lam", sol.lam, "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("width", sol.width, f"unit atoms (the optimum at width >= {sol.n_rays}, the number of rays)" if finite
         else "atoms = rays beyond lam (narrowest optimum)"),
        ("value", sol.value, "objective of the returned (W, Z, b)"),
        ("lower bound", sol.lower_bound, f"certified: no width-{sol.width} dictionary does better" if finite
         else "certified: no width, dictionary or code does better"),
        ("gap", sol.gap, "value - lower bound"),
        ("relative gap", sol.rel_gap, f"certified if gap / value <= {sol.tol:g}" if finite
         else f"certified if (gap + rounding error) / value <= {sol.tol:g}"),
        ("status", sol.status, "why the computation stopped"),
        ("iterations", sol.n_iter, "branch-and-bound nodes" if finite else "Newton iterations of the median"),
        ("seconds", sol.time_s, "wall clock"),
    ]
    if finite:
        rows.append(("wide-limit bound", c.lower_bound, "valid at every width; certified at this width: "
                     + ("yes" if c.certified else "no")))
    rows += [
        ("rounding error", c.rounding_error, "bound on the float64 rounding of value and wide-limit bound"),
        ("bias stationarity", c.bias_stationarity, "||mean residual||, 0 at the optimal bias"),
        ("min dual entry", c.dual_min, f"min_ij G_ij, >= 0 at a wide-limit optimum (rounding level {_dual_round(c):.0e})"),
        ("complementarity", c.complementarity, "<G, Q>, 0 at a wide-limit optimum"),
    ]
    if not finite:
        rows += [
            ("points within lam", int(np.count_nonzero(sol.rays < 0)), "code 0"),
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
    why = sol.status if finite else ("gap within tolerance" if c.certified else _why_not(c))
    rows.append(("certified", sol.certified, why))
    return rows


def _write_solution(out: Path, X, sol, geo=None, stem="solution") -> list[Path]:

    out.mkdir(parents=True, exist_ok=True)
    npz = out / f"{stem}.npz"
    np.savez(npz, bias=sol.bias, bias_segment=sol.bias_segment, dictionary=sol.dictionary,
             rays=sol.rays, code_values=sol.code_values, lam=sol.lam)
    js = out / f"{stem}.json"
    js.write_text(_dumps(sol.as_dict(), indent=2))
    png = plot_solution(X, sol, out / f"{stem}.png", geometric_median=None if geo is None else geo.point)
    return [npz, js, png]


def progress_display(console=None, enabled: bool = True, unit: str = "rows"):
    """A context manager yielding ``(callback, None)``: a rich progress bar driven by solver events.

    The callback accepts :class:`widelimit.engine.local.Progress` events (rows of
    the current pass; value and certified bound after each iteration; ``rows_total = 0``: a count).
    Events of a pass over rows show its rate in ``unit`` per second and the time left
    (:func:`widelimit.cli._guard.rate_text`).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def ctx():
        if not enabled or (console is not None and not console.is_terminal):  # no bar in logs / pipes
            yield None
            return
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[status]}"), console=console,
                       transient=True)
        with bar:
            task = bar.add_task("pass 0", total=None, status="", rate="")
            state = {"status": ""}

            def cb(ev):
                if ev.value is not None and ev.lower_bound is None:
                    state["status"] = f"value {ev.value:.10g}"
                elif ev.value is not None:  # the solvers certify a relative gap: show it next to the absolute one
                    gap = ev.value - ev.lower_bound
                    rel = f"{gap / abs(ev.value):.1e}" if ev.value else "-"
                    state["status"] = f"value {ev.value:.10g}  bound {ev.lower_bound:.10g}  gap {gap:.2e} (relative {rel})"
                if ev.rows_total > 0:  # a pass over rows, or an iteration budget
                    bar.update(task, description=f"pass {ev.pass_index} ({ev.stage})", completed=ev.rows_done,
                               total=ev.rows_total, status=state["status"], rate=rate_text(ev, unit))
                else:  # open-ended work (the branch and bound's nodes): a count, no bar
                    bar.update(task, description=f"{ev.stage}: {ev.rows_done}", total=None, status=state["status"],
                               rate="")

            yield cb

    return ctx()


def only_with(given: dict, ok: bool, what: str, *, why: str = "", context: str = "") -> None:
    """Refuse a flag given where it does nothing: each ``flag: value`` of ``given`` that is not ``None`` is one
    ``ValueError`` "FLAG applies only with WHAT[WHY], got FLAG VALUE[CONTEXT]" unless ``ok``."""
    if ok:
        return
    for flag, v in given.items():
        if v is not None:
            shown = f"{v:g}" if isinstance(v, float) else v
            raise ValueError(f"{flag} applies only with {what}{why}, got {flag} {shown}{context}")


def split_list(spec: str, flag: str) -> list[str]:
    """The comma-separated items of ``spec``, stripped; an empty item is a one-line ``ValueError`` naming ``flag``."""
    toks = [t.strip() for t in str(spec).split(",")]
    if any(not t for t in toks):
        raise ValueError(f"{flag} has an empty item in {str(spec)!r}: give comma-separated values without "
                         "empty ones")
    return toks


def no_duplicates(values, spec: str, flag: str) -> None:
    """A value listed twice in ``spec`` is a one-line ``ValueError`` naming ``flag``."""
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{flag} lists {v} twice in {str(spec)!r}: give each value once")
        seen.add(v)


def check_device(device, flag: str = "--device"):
    """Refuse a device torch cannot use (unknown name, CUDA absent), naming ``flag``; ``None`` passes."""
    if device is None:
        return None
    try:
        resolve_device(device)
    except ValueError as e:
        msg = str(e)
        raise ValueError(f"{flag} {msg[len('device '):]}" if msg.startswith("device ") else f"{flag}: {msg}") from None
    return device
