"""Relaxation benchmark: families with known optimum, SDPA / CBF export solved by outside solvers, CLI.

The exported files are read and solved by solvers that parse the file themselves:
SDPA (``sdpa-python``: ``sdpap.importsdpa`` + the SDPA C++ solver) for ``.dat-s``, and
PICOS's CBF reader (``picos.modeling.file_in.import_cbf``) solved by CVXOPT for ``.cbf``.
Their optimal values are compared with ``optimum`` (``widelimit.solve``), and for the
point-symmetric families ``optimum`` is compared with the closed form ``H(c)``.
"""

import json
import warnings

import numpy as np
import pytest

import widelimit as wl
from widelimit.relax.export import conic_data, cvxpy_problem, export_instances, write_cbf, write_sdpa
from widelimit.relax.families import FAMILIES, MIN_N, closed_form, make_bench_instance
from widelimit.cli import main

SYMMETRIC = [f for f in FAMILIES if f != "random"]


def _sdpa_value(path):
    """Optimal value of an SDPA sparse file, read and solved by SDPA (sdpa-python; skipped without it)."""
    sdpap = pytest.importorskip("sdpap")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        A, b, c, K, J = sdpap.importsdpa(str(path))
        x, y, info, _, _ = sdpap.solve(A, b, c, K, J, {"print": "no"})
    # pdOPT, or pdFEAS when double-precision SDPA stops just short of its gap tolerance (it does
    # on most of these instances, at a relative gap of about 1e-7): both are primal and dual feasible
    assert info["phasevalue"] in ("pdOPT", "pdFEAS"), info
    # sdpap solves SDPA's dual as its primal, sign-flipped: -primalObj is the SDPA primal optimum
    primal, dual = -float(info["primalObj"]), -float(info["dualObj"])
    assert abs(primal - dual) <= 1e-6 * abs(primal), info
    return primal, dual


def _cbf_value(path):
    """Optimal value of a CBF file, read by PICOS's CBF reader and solved by CVXOPT (skipped without them)."""
    picos = pytest.importorskip("picos")
    pytest.importorskip("cvxopt")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PICOS warns that the file's CBF version is not 1
        P = picos.modeling.file_in.import_cbf(str(path))[0]
        P.options.solver = "cvxopt"
        sol = P.solve()
    assert sol.claimedStatus == "optimal", sol.claimedStatus
    return float(P.value)


# --------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", SYMMETRIC)
@pytest.mark.parametrize("N", [7, 40])
def test_symmetric_families_optimum_is_the_closed_form(family, N):
    inst = make_bench_instance(family, N, seed=3)
    c = inst.truth["centre"]
    # the data are point-symmetric about c (x -> 2c - x maps X onto itself)
    A = np.round(inst.X - c, 9)
    B = np.round(c - inst.X, 9)
    assert sorted(map(tuple, A)) == sorted(map(tuple, B))
    # H(c) written out independently of widelimit's solver
    r = np.linalg.norm(inst.X - c, axis=1)
    H = np.mean(np.where(r <= inst.lam, r**2, 2 * inst.lam * r - inst.lam**2))
    assert inst.optimum == pytest.approx(H, rel=1e-12)
    assert closed_form(inst.X, c, lam=inst.lam) == pytest.approx(H, rel=1e-15)


def test_family_structure_and_parameters():
    # rays: the width of the narrowest optimum is the number of rays; fewer rays, fewer atoms
    assert make_bench_instance("rays", 20, seed=1).truth["width"] == 4
    assert make_bench_instance("rays", 20, seed=1, n_rays=2).truth["width"] == 2
    # inside: the requested fraction lies within lam of the centre, so Q*_ii = 0 for them
    inst = make_bench_instance("inside", 40, seed=2, frac_inside=0.75)
    r = np.linalg.norm(inst.X - inst.truth["centre"], axis=1)
    assert np.count_nonzero(r < inst.lam) == 30 == inst.truth["n_within_lam"]
    # ties: half the points at distance exactly lam (to rounding), the far ones duplicated
    inst = make_bench_instance("ties", 40, seed=2, copies=2)
    r = np.linalg.norm(inst.X - inst.truth["centre"], axis=1)
    assert np.count_nonzero(np.abs(r - inst.lam) <= 4e-16 * inst.lam) == 20
    far = inst.X[r > 1.4 * inst.lam]
    assert len(np.unique(far, axis=0)) == len(far) // 2
    # collinear: with gap > lam the optimal bias is a segment of half-length (gap - 1) lam
    inst = make_bench_instance("collinear", 20, seed=2, gap=3.0)
    sol = wl.solve(inst.X, lam=inst.lam)
    seg = np.linalg.norm(sol.bias_segment[1] - sol.bias_segment[0])
    assert seg == pytest.approx(2 * inst.truth["bias_segment_halflength"], rel=1e-9)
    assert inst.truth["bias_segment_halflength"] == pytest.approx(2.0)
    # scaled: the coordinate scales span `decades` orders of magnitude, and magnitude scales the optimum
    a = make_bench_instance("scaled", 20, seed=2, decades=6)
    s = a.truth["column_scales"]
    assert s.max() / s.min() == pytest.approx(1e6)
    b = make_bench_instance("scaled", 20, seed=2, decades=6, magnitude=3)
    assert b.optimum == pytest.approx(1e6 * a.optimum, rel=1e-9)


def test_family_errors():
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        make_bench_instance("nope", 10)
    with pytest.raises(ValueError, match="too small for family 'rays'"):
        make_bench_instance("rays", MIN_N["rays"] - 1)
    with pytest.raises(ValueError, match="has no parameter 'n_rays'"):
        make_bench_instance("random", 10, n_rays=2)
    with pytest.raises(ValueError, match="frac_inside"):
        make_bench_instance("inside", 10, frac_inside=1.5)


# --------------------------------------------------------------------------------------
# export, solved by outside solvers reading the files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_file_solved_by_sdpa_has_the_optimum(tmp_path, family):
    inst = make_bench_instance(family, 7, seed=4)
    path = write_sdpa(inst.X, tmp_path / "p.dat-s", lam=inst.lam, cone="dnn")
    primal, dual = _sdpa_value(path)
    assert primal == pytest.approx(inst.optimum, rel=1e-6)
    assert dual == pytest.approx(inst.optimum, rel=1e-6)


def test_sdpa_nonneg_cone_has_the_optimum(tmp_path):
    inst = make_bench_instance("inside", 8, seed=5)
    primal, _ = _sdpa_value(write_sdpa(inst.X, tmp_path / "p.dat-s", lam=inst.lam, cone="nonneg"))
    assert primal == pytest.approx(inst.optimum, rel=1e-6)


def test_sdpa_detects_a_wrong_instance(tmp_path):
    # the comparison can fail: the file of a perturbed lam has a different optimum
    inst = make_bench_instance("random", 7, seed=4)
    primal, _ = _sdpa_value(write_sdpa(inst.X, tmp_path / "p.dat-s", lam=inst.lam * 1.01))
    assert abs(primal - inst.optimum) > 1e-4 * inst.optimum


@pytest.mark.parametrize("family,cone", [("random", "dnn"), ("ties", "dnn"), ("collinear", "nonneg"),
                                         ("scaled", "dnn")])
def test_cbf_file_solved_by_picos_cvxopt_has_the_optimum(tmp_path, family, cone):
    inst = make_bench_instance(family, 6, seed=6, dim=3)
    val = _cbf_value(write_cbf(inst.X, tmp_path / "p.cbf", lam=inst.lam, cone=cone))
    assert val == pytest.approx(inst.optimum, rel=1e-6)


def test_cbf_and_sdpa_hold_the_same_problem(tmp_path):
    """Both files, parsed back by their outside readers, give the same objective and blocks.

    The SDPA file's c and the CBF's OBJACOORD must be the same vector (variables are in the
    same order); checked by the readers' own matrices, not by widelimit's writer.
    """
    sdpap = pytest.importorskip("sdpap")

    inst = make_bench_instance("rays", 6, seed=1, dim=2)
    write_cbf(inst.X, tmp_path / "p.cbf", lam=inst.lam)
    write_sdpa(inst.X, tmp_path / "p.dat-s", lam=inst.lam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        A, b, c, K, J = sdpap.importsdpa(str(tmp_path / "p.dat-s"))
    c_sdpa = -np.asarray(b.todense()).ravel()  # sdpap: SDPA's c becomes the (sign-flipped) b of its dual
    m = c_sdpa.size
    c_cbf = np.zeros(m)
    lines = (tmp_path / "p.cbf").read_text().split("\n")
    k = lines.index("OBJACOORD")
    for ln in lines[k + 2: k + 2 + int(lines[k + 1])]:
        j, v = ln.split()
        c_cbf[int(j)] = float(v)
    assert np.array_equal(np.abs(c_sdpa), c_cbf)
    N = inst.N
    assert c_cbf[: N * (N - 1) // 2] == pytest.approx(2 * inst.lam / N, rel=0, abs=0)


def test_files_hold_the_float64_data_exactly(tmp_path):
    """The constant block holds lam and X bit for bit (parsed from the text, not by widelimit)."""
    inst = make_bench_instance("scaled", 6, seed=3, decades=8, magnitude=-3)
    N, n = inst.X.shape
    write_cbf(inst.X, tmp_path / "p.cbf", lam=inst.lam)
    lines = (tmp_path / "p.cbf").read_text().split("\n")
    k = lines.index("DCOORD")
    D = np.zeros((N + n, N + n))
    for ln in lines[k + 2: k + 2 + int(lines[k + 1])]:
        blk, r, c, v = ln.split()
        assert blk == "0"
        D[int(r), int(c)] = float(v)
    assert np.array_equal(D[N:, :N].T, inst.X)
    assert np.array_equal(np.diag(D)[:N], np.full(N, inst.lam))
    write_sdpa(inst.X, tmp_path / "p.dat-s", lam=inst.lam)
    F0 = np.zeros((N + n, N + n))
    for ln in (tmp_path / "p.dat-s").read_text().split("\n"):
        f = ln.split()
        if len(f) == 5 and f[0] == "0" and f[1] == "1":
            F0[int(f[2]) - 1, int(f[3]) - 1] = float(f[4])
    assert np.array_equal(-F0[:N, N:], inst.X)  # F_0 = -D, upper triangle


def test_cvxpy_model_of_the_file_data_has_the_optimum():
    inst = make_bench_instance("inside", 9, seed=7)
    prob, x = cvxpy_problem(conic_data(inst.X, lam=inst.lam))
    prob.solve(solver="CLARABEL")
    assert prob.value == pytest.approx(inst.optimum, rel=1e-6)


def test_export_instances_json(tmp_path):
    insts = [make_bench_instance(f, N, seed=2) for f in ("random", "ties") for N in (5, 8)]
    out = tmp_path / "bench"
    export_instances(insts, out, fmt="sdpa", cone="dnn")
    recs = json.loads((out / "instances.json").read_text())
    assert [(r["family"], r["N"]) for r in recs] == [("random", 5), ("random", 8), ("ties", 5), ("ties", 8)]
    for r in recs:
        X = np.load(out / r["data"])
        assert X.shape == (r["N"], r["n"]) and X.dtype == np.float64
        # the recorded optimum is the one of the saved data, recomputed from the file alone
        assert wl.solve(X, lam=r["lam"]).value == pytest.approx(r["optimum"], rel=1e-12)
        assert r["cone"] == "dnn" and (out / r["file"]).stat().st_size == r["bytes"]
        header = [ln for ln in (out / r["file"]).read_text().split("\n") if not ln.startswith('"')]
        assert r["n_vars"] == int(header[0])  # SDPA's m, as the file states it
    # the first SDPA file, solved by SDPA, has the recorded optimum
    assert _sdpa_value(out / recs[0]["file"])[0] == pytest.approx(recs[0]["optimum"], rel=1e-6)
    # an existing non-empty folder is refused, nothing overwritten
    before = (out / "instances.json").read_text()
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_instances(insts[:1], out, fmt="cbf")
    assert (out / "instances.json").read_text() == before
    with pytest.raises(ValueError, match="unknown format 'mps'"):
        export_instances(insts[:1], tmp_path / "x", fmt="mps")
    # the same family, N and seed with other parameters get another name; the same instance twice is refused
    other = make_bench_instance("ties", 5, seed=2, copies=3)
    assert other.name.startswith("ties-N5-n5-s2-p") and other.name != insts[2].name
    assert make_bench_instance("ties", 5, seed=2, copies=2).name == insts[2].name == "ties-N5-n5-s2"
    with pytest.raises(ValueError, match="same name 'ties-N5-n5-s2'"):
        export_instances([insts[2], insts[2]], tmp_path / "y")
    assert not (tmp_path / "y").exists()


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def test_cli_export_cbf(tmp_path, capsys):
    out = tmp_path / "cbf"
    rc = main(["relax-bench", "--family", "rays,inside", "--N", "6,7", "--export", str(out), "--format", "cbf",
               "--param", "dim=3", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    recs = json.loads((out / "instances.json").read_text())
    assert [r["file"] for r in recs] == [r["file"] for r in d["instances"]]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["instances.json"] + [r["file"] for r in recs] + [r["data"] for r in recs])
    r = recs[1]
    assert r["file"].endswith(".cbf") and r["n"] == 3
    assert _cbf_value(out / r["file"]) == pytest.approx(r["optimum"], rel=1e-6)


@pytest.mark.parametrize("argv,msg", [
    (["--family", "foo"], "unknown family 'foo'"),
    (["--format", "mps", "--export", "{tmp}/new"], "unknown format 'mps'"),
    (["--family", "rays", "--N", "3"], "N = 3 is too small for family 'rays'"),
    (["--N", "ten"], "--N must be comma-separated integers"),
    (["--export", "{tmp}/full"], "exists and is not empty"),
    (["--param", "n_rays"], "--param must be KEY=VALUE"),
    (["--family", "random", "--param", "n_rays=2"], "no selected family has the parameter 'n_rays'"),
    (["--cone", "cp"], "unknown cone 'cp'"),
])
def test_cli_bad_input_one_line(tmp_path, capsys, argv, msg):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    rc = main(["relax-bench", *[a.replace("{tmp}", str(tmp_path)) for a in argv]])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and msg in err and "Traceback" not in err
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep.txt"]
