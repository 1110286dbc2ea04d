"""One line, and the right one (issue 29): what was wrong or internal before each fix is in its docstring."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import widelimit as wl
from widelimit.cli import flagify, main

from fixtures.servers import banner_server

REPO = Path(__file__).resolve().parents[2]


def _err(capsys, argv) -> str:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, (rc, err)
    return err.strip()


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.random.default_rng(0).standard_normal((60, 3)))
    return p


# --------------------------------------------------------------------------------------
# Dask
# --------------------------------------------------------------------------------------


@pytest.fixture
def not_dask():
    """A server that answers like an SSH server: Dask read its banner as a frame length of exabytes."""
    with banner_server(b"SSH-2.0-OpenSSH_8.9p1 Ubuntu-3ubuntu0.1\r\n" + b"\xff" * 64) as addr:
        yield addr


def test_a_server_that_is_not_dask(data, not_dask, capsys):
    """Was: "Unable to allocate 3.01 EiB for an array ..." (or another internal error)."""
    pytest.importorskip("distributed")
    err = _err(capsys, ["bound", data, "--lam", "1", "--dask", not_dask, "--dask-timeout", "20", "--no-progress"])
    assert err.startswith(f"widelimit bound: error: --dask {not_dask}: the server at this address is not a Dask "
                          "scheduler (its reply could not be read as a Dask message: "), err
    assert "EiB" not in err and "allocate" not in err
    import dask

    assert dask.config.get("scheduler", None) is None  # the failed client left the process's scheduler alone


def test_nan_codes_in_a_dask_verify_name_z():
    """Was: "X: float64 overflow in rows ..." for a NaN in the Dask codes."""
    da = pytest.importorskip("dask.array")
    import dask

    X = np.random.default_rng(1).standard_normal((120, 3))
    sol = wl.solve(X, lam=0.5)
    Z = np.asarray(sol.codes.todense() if hasattr(sol.codes, "todense") else sol.codes, dtype=np.float64)
    Z[77, 0] = np.nan
    with dask.config.set(scheduler="synchronous"):
        Xd, Zd = da.from_array(X, chunks=(40, 3)), da.from_array(Z, chunks=(40, Z.shape[1]))
        with pytest.raises(ValueError) as e:
            wl.verify(Xd, sol.dictionary, Zd, sol.bias, lam=0.5, median=sol.median)
        assert str(e.value) == "Z must be finite and >= 0 (nonnegative codes); Z[77, 0] = nan"
        with pytest.raises(ValueError, match=r"^Z must be finite and >= 0 \(nonnegative codes\); Z\[77, 0\] = nan$"):
            wl.sae_objective(Xd, sol.dictionary, Zd, sol.bias, lam=0.5)


def test_a_dask_array_with_unknown_chunk_sizes():
    """Was: "cannot convert float NaN to integer"."""
    da = pytest.importorskip("dask.array")
    X = da.from_array(np.random.default_rng(2).standard_normal((80, 3)), chunks=(20, 3))
    Xu = X[X[:, 0] > -100]  # boolean indexing: chunk sizes unknown
    msg = ("X is a dask array with unknown chunk sizes (shape (nan, 3), e.g. after boolean indexing); compute them "
           "first: X = X.compute_chunk_sizes()")
    for call in (lambda: wl.huber_median(Xu, lam=0.5), lambda: wl.solve(Xu, lam=0.5)):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == msg
    known = Xu.compute_chunk_sizes()
    assert wl.huber_median(known, lam=0.5).lower_bound == wl.huber_median(X, lam=0.5).lower_bound
    keep = np.ones(80, dtype=bool)
    keep[20:40] = False  # a whole block selected away: a block of 0 rows broke the passes' merge (TypeError)
    gap = X[da.from_array(keep, chunks=20)].compute_chunk_sizes()
    assert 0 in gap.chunks[0]
    rows = np.asarray(X)[keep]
    assert wl.huber_median(gap, lam=0.5).value == pytest.approx(wl.huber_median(rows, lam=0.5).value, rel=1e-12)


# --------------------------------------------------------------------------------------
# threads, flags in messages
# --------------------------------------------------------------------------------------


def test_threads_are_bounded(capsys, data, monkeypatch):
    """Was: MemoryError (1000 BLAS threads, each with its buffers)."""
    from widelimit._runtime import limit_threads, max_threads, usable_cores

    top = max_threads()
    assert top == 4 * usable_cores()
    err = _err(capsys, ["certify", data, data, "--threads", str(top + 1)])
    assert err == (f"widelimit certify: error: argument --threads: must be at most {top} (4 per usable core; this "
                   f"machine lets the process use {usable_cores()}), got {top + 1}")
    with pytest.raises(ValueError, match=rf"^threads must be at most {top} "):
        limit_threads(1000)
    with pytest.raises(ValueError, match=r"^threads must be an integer >= 1 and at most 4 per usable core or None, "
                                         r"got 1000$"):
        wl.certify_sae(np.zeros((4, 3)), None, lam=1.0, threads=1000)
    monkeypatch.setenv("WIDELIMIT_THREADS", "100000")
    with pytest.raises(ValueError, match=rf"^WIDELIMIT_THREADS must be at most {top} "):
        limit_threads()
    with limit_threads(top):  # the bound itself is accepted
        pass


@pytest.mark.parametrize("msg,flags,want", [
    ("use solver='SCS', widelimit.relax.dnn, or a smaller N", {"solver": "--solver"},
     "use --solver SCS, widelimit.relax.dnn, or a smaller N"),
    ("choose one with key=\"acts x\"", {"key": "--key"}, "choose one with --key 'acts x'"),
    ("key=... 'a' given", {"key": "--key"}, "--key 'a' given"),
    ("max_iter must be >= 0", {"max_iter": "--max-iter"}, "--max-iter must be >= 0"),
])
def test_flag_values_read_as_the_shell_takes_them(msg, flags, want):
    """Was: ``--solver 'SCS'`` (a Python literal behind a flag)."""
    assert flagify(msg, flags) == want


# --------------------------------------------------------------------------------------
# Ctrl-C after the answer
# --------------------------------------------------------------------------------------

_CHILD = """
import sys, time


class Teardown:  # what a slow interpreter shutdown looks like (torch's and numba's teardown take about a second)
    def __del__(self, err=sys.stderr, sleep=time.sleep):  # module globals are gone by then
        err.write("teardown\\n")
        err.flush()
        sleep(60)


keep = Teardown()  # freed when the modules are finalised: after Python gave SIGINT back to its default action
sys.argv = ["widelimit"] + sys.argv[1:]
from widelimit.__main__ import entry
entry()
"""


def test_ctrl_c_right_after_the_json(data):
    """Was: the process died by SIGINT without a line (the signal landed in the interpreter's shutdown, after
    Python had reset SIGINT to its default action)."""
    p = subprocess.Popen([sys.executable, "-c", _CHILD, "bound", str(data), "--lam", "1", "--json", "--no-progress"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # the answer is out: the command has finished
    assert json.loads(line)["n_points"] == 60
    late = p.stderr.readline()  # "teardown" when the process shuts the interpreter down, "" when it just ends
    if late == "teardown\n":
        p.send_signal(signal.SIGINT)  # the second after the answer
    out, err = p.communicate(timeout=120)
    assert late == "" and p.returncode == 0 and out == "" and err == "", (late, p.returncode, err)


# --------------------------------------------------------------------------------------
# relax: the refusal's advice, and the table
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("solver, cone, budget, fit", [
    ("CLARABEL", "dnn", "20M", ["SCS"]),             # TORCH (about 34 MiB) does not fit: not named
    ("CLARABEL", "dnn", "40M", ["SCS", "TORCH"]),
    ("TORCH", "dnn", "20M", ["SCS"]),
    ("SCS", "dnn", "5M", []),
    ("CLARABEL", "nonneg", "100M", ["SCS"]),          # TORCH solves the dnn cone only
])
def test_relax_refusal_names_only_the_solvers_that_fit(capsys, data, solver, cone, budget, fit):
    """Was: ``--solver 'SCS'`` (a Python literal), advised whatever its own memory, and ``--solver TORCH`` advised
    even where it did not fit or could not solve the cone. Now: every solver that fits the budget, with its estimate
    (the measured models of :func:`estimate_memory` and :func:`dnn_bytes`), and none that does not."""
    from widelimit._memory import gib, parse_bytes
    from widelimit.relax.cones import estimate_memory
    from widelimit.relax.dnn import dnn_bytes

    est = {"SCS": estimate_memory(60, 3, cone, "SCS"), "CLARABEL": estimate_memory(60, 3, cone, "CLARABEL")}
    if cone == "dnn":
        est["TORCH"] = dnn_bytes(60)
    assert est[solver] > parse_bytes(budget) and [s for s in sorted(est, key=est.get) if s != solver
                                                  and est[s] <= parse_bytes(budget)] == fit
    err = _err(capsys, ["relax", data, "--lam", "1", "--cone", cone, "--solver", solver, "--memory-budget", budget])
    named = " or ".join(f"--solver {s} (about {gib(est[s])})" for s in fit)
    tail = f"use {named}, which fit{'s' if len(fit) == 1 else ''} within it, or a smaller N" if fit else \
        "no solver fits within it: use a smaller N"
    assert err.endswith(tail) and "'" not in err.split("(set to")[1], err
    assert err.startswith(f"widelimit relax: error: {'the TORCH solver on N = 60' if solver == 'TORCH' else solver}")


def test_relax_library_refusal_names_the_parameter():
    X = np.random.default_rng(0).standard_normal((60, 3))
    from widelimit._memory import MemoryBudgetError

    with pytest.raises(MemoryBudgetError, match=r"; use solver='SCS' \(about 11 MiB\), which fits within it, or a "
                                                r"smaller N$"):
        wl.relax(X, lam=1.0, solver="CLARABEL", max_memory="20M")


def test_relax_table(capsys, tmp_path):
    """Was: ``widelimit relax`` without ``--json`` failed with ``KeyError: 'N'`` (the result's fields are
    ``n_points`` and ``dim``) after the whole solve."""
    p = tmp_path / "x.npy"
    np.save(p, np.random.default_rng(0).standard_normal((12, 2)))
    rc = main(["relax", str(p), "--lam", "1", "--cone", "nonneg"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    row = next(ln for ln in out.splitlines() if "points N x dims n" in ln)
    assert "12 x 2" in row, out
    exact = wl.solve(np.load(p), lam=1.0).value
    assert f"{exact:.6g}"[:6] in out  # the exact value's row
