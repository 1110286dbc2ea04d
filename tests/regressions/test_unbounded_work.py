"""Issue 29, "Unbounded work and memory": every allocation that grows with a parameter is estimated before
it is made and refused above one memory budget; nothing blocks forever; long loops have a budget or show
progress. Each test fails without its fix; none allocates more than a few MB (the budgets are small).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import widelimit as wl
from widelimit._memory import ENV, MemoryBudgetError, check_memory, memory_budget, parse_bytes

from fixtures.cli import cli, one_line_error


# ---- the one budget ----------------------------------------------------------------------------


def test_budget_sources_in_order(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < memory_budget() <= phys // 2  # half the machine (or less under a cgroup limit)
    monkeypatch.setenv(ENV, "3M")
    assert memory_budget() == 3 * 2**20
    assert memory_budget(1000) == 1000 and memory_budget("2K") == 2048
    with pytest.raises(MemoryBudgetError, match=r"needs about 4 MiB of memory, above the memory budget of 3 MiB"):
        check_memory(4 * 2**20, "a thing")
    check_memory(3 * 2**20, "a thing")  # at the budget: accepted
    assert parse_bytes("1.5G") == 3 * 2**29 and parse_bytes("10 MiB") == 10 * 2**20
    for bad in ("", "-1", "4X", "G", "0"):
        with pytest.raises(ValueError, match=ENV):
            parse_bytes(bad)


def test_memory_budget_flag_reaches_the_library_and_is_restored(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((60, 4)))
    err = one_line_error(capsys, ["relax", tmp_path / "x.npy", "--lam", "1", "--memory-budget", "1M", "--json"])
    assert "SCS on cone 'dnn' with N = 60, n = 4 needs about" in err and "set to 1M by --memory-budget" in err
    assert ENV not in os.environ
    err = one_line_error(capsys, ["relax", tmp_path / "x.npy", "--lam", "1", "--memory-budget", "lots"])
    assert "--memory-budget" in err and "'lots'" in err


# ---- relax: the estimate from measurements, refused before the model is built --------------------


_PEAK = r"""
import json, sys
def peak():  # VmHWM: this process's own high-water mark (ru_maxrss keeps a forking parent's across exec)
    return next(int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM"))
import numpy as np
import cvxpy, scs  # noqa: F401
from widelimit.relax.cones import relax
X = np.random.default_rng(0).standard_normal((int(sys.argv[1]), 8))
base = int(open("/proc/self/statm").read().split()[1]) * 4096
relax(X, lam=1.0, cone="dnn", solver="SCS", max_iter=20)
print(json.dumps({"growth": peak() - base}))
"""


def test_relax_estimate_covers_the_measured_peak_and_the_issues_numbers():
    from widelimit.relax.cones import estimate_memory

    # the issue's measurements: SCS peaked at 2.4 GB at N = 1,000 (estimated 0.19 GiB then) and passed 7.2 GB at 2,000
    assert estimate_memory(1000, 8, "dnn", "SCS") >= 2.4e9
    assert estimate_memory(2000, 8, "dnn", "SCS") >= 7.2e9
    # and a measurement here, in a fresh process: the estimate covers the peak, within a factor 2.5
    out = subprocess.run([sys.executable, "-c", _PEAK, "150"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    growth = json.loads(out.stdout.splitlines()[-1])["growth"]
    est = estimate_memory(150, 8, "dnn", "SCS")
    assert growth <= est <= 2.5 * growth, (growth, est)


def test_relax_refused_before_any_model_is_built(monkeypatch):
    import cvxpy

    def never(*a, **k):
        raise AssertionError("a cvxpy model was built")

    monkeypatch.setattr(cvxpy, "Variable", never)
    X = np.random.default_rng(1).standard_normal((40, 3))
    for solver in ("SCS", "CLARABEL"):
        with pytest.raises(MemoryBudgetError, match=f"{solver} on cone 'dnn' with N = 40"):
            wl.relax(X, lam=1.0, solver=solver, max_memory=2**20)
    with pytest.raises(MemoryBudgetError, match=r"use solver='SCS' \(about \d+ MiB\)"):  # Clarabel's names SCS's need
        wl.relax(X, lam=1.0, solver="CLARABEL", max_memory="100M")


def test_cli_relax_refuses_before_the_exact_solve(tmp_path, capsys, monkeypatch):
    import widelimit.cli.relax as cr

    monkeypatch.setattr(cr, "solve", lambda *a, **k: pytest.fail("solved before the memory check"))
    np.save(tmp_path / "x.npy", np.random.default_rng(2).standard_normal((50, 3)))
    for solver in ("SCS", "TORCH"):
        err = one_line_error(capsys, ["relax", tmp_path / "x.npy", "--lam", "1", "--solver", solver, "--json",
                                      "--memory-budget", "1M"])
        assert "above the memory budget of 1 MiB" in err


def test_c_solver_output_never_reaches_stdout():
    """SCS prints from C (its banner with verbose, 'ERROR: work memory allocation failure' when it cannot
    allocate) straight to file descriptor 1; a --json stdout must hold nothing else."""
    code = ("import numpy as np; from widelimit.relax.cones import relax; "
            "relax(np.random.default_rng(0).standard_normal((6, 2)), lam=1.0, verbose=True, max_iter=50); "
            "print('JSON')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "JSON\n", out.stdout[:300]
    assert "SCS" in out.stderr  # the solver's own lines went to stderr


def test_own_dnn_solver_refused_before_its_matrices(monkeypatch):
    import widelimit.relax.dnn as dnn

    monkeypatch.setattr(dnn, "_Problem", lambda *a, **k: pytest.fail("N x N matrices allocated"))
    with pytest.raises(MemoryBudgetError, match="solve_dnn on N = 300 points"):  # under the 4 MiB budget below
        dnn.solve_dnn(np.ones((300, 2)) + np.arange(300)[:, None], lam=1.0, device="cpu")


@pytest.fixture(autouse=True)
def _small_default_budget(request, monkeypatch):
    """Tests of refusals run under a 4 MiB budget unless they set their own."""
    if request.node.name.startswith(("test_own_dnn", "test_fit_refused", "test_bound_subsample")):
        monkeypatch.setenv(ENV, "4M")


# ---- bound: no n x n Newton matrix when the rows are few -------------------------------------------


def test_median_newton_step_is_low_rank_when_rows_are_few(monkeypatch, one_torch_thread):
    """3 points in 600 dimensions: the Newton matrix has rank <= 3 + 4, and is never formed (the old code
    built 600 x 600; the issue's 2 x 100,000 CSV asked for 40 GB). The direction is the dense one's."""
    import widelimit.exact.newton as nw

    rng = np.random.default_rng(3)
    X = rng.standard_normal((3, 600))
    monkeypatch.setattr(nw, "_newton_step", lambda *a: pytest.fail("a dense n x n Newton matrix was formed"))
    low = wl.huber_median(X, lam=0.5)
    monkeypatch.undo()
    monkeypatch.setattr(nw, "dense_newton", lambda *a: True)
    dense = wl.huber_median(X, lam=0.5)
    assert low.certified and dense.certified
    np.testing.assert_allclose(low.point, dense.point, rtol=0, atol=1e-9 * np.abs(X).max())
    assert low.lower_bound <= dense.value and dense.lower_bound <= low.value


def test_low_rank_direction_equals_the_dense_one():
    import widelimit.exact.newton as nw

    rng = np.random.default_rng(4)
    for m, n, P in [(4, 60, 0), (6, 90, 2), (10, 200, 1)]:
        Xs, b, g = rng.standard_normal((m, n)), 0.1 * rng.standard_normal(n), rng.standard_normal(n)
        pairs = [(s, s + 0.1 * rng.standard_normal(n)) for s in rng.standard_normal((P, n))]
        for precise in (False, True):
            args = (Xs, np.ones(m), b, 0.5, "huber", 0.0, float(m), 0.0, pairs, g, precise)
            assert not nw.dense_newton(m, n, P)
            low = nw.newton_direction(*args)
            D = Xs - b
            r = np.linalg.norm(D, axis=1)
            cw = np.where(r > 0.5, 0.5 / r**3, 0.0)
            a = float(m) if not precise else float(cw @ (r * r))
            B = a * np.eye(n) - D.T @ (cw[:, None] * D)  # independent: the matrix written out
            for s_, y_ in pairs:
                sy, Bs = float(s_ @ y_), B @ s_
                B = B + np.outer(y_, y_) / sy - np.outer(Bs, Bs) / float(s_ @ Bs)
            want = np.linalg.solve(B, g)
            np.testing.assert_allclose(low, want, rtol=1e-6 if not precise else 1e-9, atol=0)


def test_bound_subsample_fits_the_budget_and_refuses_when_one_row_does_not(tmp_path, capsys, monkeypatch):
    from widelimit.exact.newton import median_bytes, subsample_rows

    assert subsample_rows(10_000, 64, 4096, budget=2**40) == 4096
    m = subsample_rows(10_000, 64, 4096, budget=2**21)
    assert 1 <= m < 4096 and median_bytes(m, 64) <= 2**21 < median_bytes(m + 1, 64)
    X = np.random.default_rng(5).standard_normal((400, 64))
    res = wl.huber_median(X, lam=2.0)  # under the 4 MiB budget: a smaller subsample, still certified
    assert res.certified and res.lower_bound <= res.value
    # one row of 20,000 columns does not fit 1 MiB: one line, before any pass over the data
    import widelimit.engine.local as local

    monkeypatch.setattr(local.LocalEngine, "reduce", lambda *a, **k: pytest.fail("a pass was made"))
    np.save(tmp_path / "wide.npy", np.ones((3, 20_000)) * np.arange(3)[:, None] + np.eye(3, 20_000))
    err = one_line_error(capsys, ["bound", tmp_path / "wide.npy", "--lam", "1", "--memory-budget", "1M"])
    assert "the median's Newton step in dimension n = 20000 needs about" in err


# ---- fit ---------------------------------------------------------------------------------------


def test_fit_refused_before_it_starts(tmp_path, capsys, monkeypatch):
    import widelimit.learn.gradient as g
    from widelimit.learn.gradient import fit_bytes

    monkeypatch.setattr(g, "huber_median", lambda *a, **k: pytest.fail("the fit started"))
    X = np.random.default_rng(6).standard_normal((200, 4)).astype(np.float32)
    with pytest.raises(MemoryBudgetError, match=r"fit_dictionary at width 150 on N = 200 points in n = 4 dimensions "
                                                r"\(full batch\)"):
        wl.fit_dictionary(X, lam=0.5, width=150)
    # the issue's case: width 50,000 on N = 50,000 is about 60 GB by the measured model (it died at 10 GB)
    assert fit_bytes(50_000, 16, 50_000) > 5e10
    np.save(tmp_path / "x.npy", X)
    err = one_line_error(capsys, ["fit", tmp_path / "x.npy", "--lam", "0.5", "--width", "150", "--json"])
    assert "use a smaller width, or minibatches (--batch-size)" in err
    err = one_line_error(capsys, ["frontier", tmp_path / "x.npy", "--lam", "0.5", "--widths", "1,150", "--json",
                                  "--out", tmp_path / "fr"])
    assert "at width 150" in err  # the largest width is refused before the smaller ones run


# ---- nothing blocks: named pipes, devices and sockets are refused by every reader ---------------------


def _returns(fn, timeout=30.0):
    """``fn()``'s exception (or None), run on a daemon thread: a hang fails the test instead of the suite."""
    box = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked"
    return box.get("e")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
def test_named_pipes_and_devices_are_refused_naming_the_file(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    np.save(d / "a.npy", np.ones((4, 3)))
    os.mkfifo(d / "b.npy")
    e = _returns(lambda: wl.open_activations(d))
    assert isinstance(e, wl.DataError) and str(e).startswith(f"{d / 'b.npy'}: is a named pipe (FIFO)"), e
    os.symlink("/dev/zero", tmp_path / "zero.npy")  # a character device never ends
    e = _returns(lambda: wl.open_activations(tmp_path / "zero.npy"))
    assert isinstance(e, wl.DataError) and "is a character device" in str(e)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "s.npy"))
    e = _returns(lambda: wl.open_activations(tmp_path / "s.npy"))
    s.close()
    assert isinstance(e, wl.DataError) and "is a socket" in str(e)
    # an Arrow cache and the SAE files too
    c = tmp_path / "cache"
    c.mkdir()
    os.mkfifo(c / "data-00000-of-00001.arrow")
    e = _returns(lambda: wl.open_activations(c))
    assert isinstance(e, wl.DataError) and "data-00000-of-00001.arrow: is a named pipe" in str(e)
    sae = tmp_path / "sae"
    sae.mkdir()
    os.mkfifo(sae / "cfg.json")
    (sae / "sae_weights.safetensors").write_bytes(b"")
    e = _returns(lambda: wl.load_sae(sae))
    assert isinstance(e, ValueError) and "cfg.json: is a named pipe" in str(e)
    # and a checkpoint
    os.mkfifo(tmp_path / "ck.npz")
    from widelimit.engine.checkpoint import load_checkpoint

    e = _returns(lambda: load_checkpoint(tmp_path / "ck.npz"))
    assert isinstance(e, ValueError) and "ck.npz: is a named pipe" in str(e)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
def test_cli_refuses_a_named_pipe_checkpoint(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(7).standard_normal((20, 3)))
    os.mkfifo(tmp_path / "ck.npz")
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("err", one_line_error(
        capsys, ["bound", tmp_path / "x.npy", "--lam", "1", "--checkpoint", tmp_path / "ck.npz"])), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "blocked on the named pipe"
    assert "--checkpoint" in box["err"] and "is a named pipe (FIFO)" in box["err"]


# ---- Dask: workers bounded by the cores; --dask-timeout covers the cluster's start-up ---------------


def test_dask_local_workers_bounded_by_the_cores(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from widelimit._runtime import usable_cores

    monkeypatch.setattr(distributed, "LocalCluster", lambda *a, **k: pytest.fail("a cluster was started"))
    np.save(tmp_path / "x.npy", np.ones((5, 2)))
    n = usable_cores() + 1
    err = one_line_error(capsys, ["bound", tmp_path / "x.npy", "--lam", "1", "--dask", f"local:{n}"])
    assert f"at most {n - 1} local worker processes" in err
    err = one_line_error(capsys, ["bound", tmp_path / "x.npy", "--lam", "1", "--dask", "local:100000"])
    assert "local:100000" in err


def test_dask_timeout_covers_a_cluster_that_never_starts(monkeypatch):
    distributed = pytest.importorskip("distributed")
    from widelimit.cli.bound import _dask_client

    started, release = threading.Event(), threading.Event()

    class Hangs:
        def __init__(self, *a, **k):
            started.set()
            release.wait()  # a start-up that never finishes (until the test lets it go)

        def close(self):
            pass

    monkeypatch.setattr(distributed, "LocalCluster", Hangs)
    try:
        with pytest.raises(ValueError, match=r"--dask local:1: the local cluster did not start within 0.5 s"):
            _dask_client("local:1", 0.5)
        assert started.is_set()
    finally:
        release.set()


# ---- frontier: a budget, and progress on stderr even under --json ------------------------------------


def test_frontier_time_limit_and_progress_lines(tmp_path, capsys, one_torch_thread):
    X = np.random.default_rng(8).standard_normal((30, 3))
    fr = wl.frontier(X, lam=0.5, widths=[3, 1, 2], n_restarts=1, max_iter=10, time_limit=1e-9, inits=("data",))
    assert (fr.widths, fr.skipped_widths, fr.status) == ([1], [2, 3], "time_limit")  # the first width always runs
    assert fr.as_dict()["skipped_widths"] == [2, 3] and len(fr.values) == 1
    np.save(tmp_path / "x.npy", X)
    rc, out, err = cli(capsys, "frontier", tmp_path / "x.npy", "--lam", "0.5", "--widths", "1,2", "--max-iter", "10",
                       "--init", "data", "--json", "--out", tmp_path / "fr")
    d = json.loads(out)
    assert rc == 0 and (d["status"], d["widths"], d["skipped_widths"]) == ("done", [1, 2], [])
    lines = err.splitlines()  # a line per width on stderr although stdout is JSON and stderr no terminal
    assert [ln.split(" done")[0] for ln in lines] == ["widelimit frontier: width 1", "widelimit frontier: width 2"], err
    rc, out, err = cli(capsys, "frontier", tmp_path / "x.npy", "--lam", "0.5", "--widths", "1,2", "--max-iter",
                       "10", "--init", "data", "--json", "--out", tmp_path / "fr2", "--time-limit", "1e-9")
    d = json.loads(out)
    assert rc == 0 and d["skipped_widths"] == [2] and d["widths"] == [1] and d["status"] == "time_limit"
    assert "--time-limit 1e-09 s ran out: widths 2 were not fitted" in err
