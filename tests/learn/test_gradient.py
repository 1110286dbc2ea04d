"""The torch gradient solver: gradients vs autograd, the exact optimum, invariants, the frontier, bad input."""

import json

import numpy as np
import pytest
import torch

import widelimit as wl
from widelimit.cli import main
from widelimit.coding.fista import code_steps
from widelimit.data.datasets import symmetric_rays
from widelimit.learn._steps import _cd_codes, _dict_steps, _working_sets
from widelimit.learn.amortised import encoder_codes
from widelimit.sae.model import jumprelu_ste


@pytest.fixture(scope="module")
def rays():
    X, truth = symmetric_rays(n_rays=4, dim=5, points_per_ray=8, seed=3)
    return X, truth, 0.5


def _torch_objective(X, W, Z, b, lam):
    """theory.md §1 with atom norms folded in, in torch (autograd reference)."""
    R = Z @ W + b - X
    return ((R * R).sum() + 2 * lam * (Z * W.norm(dim=1)).sum()) / X.shape[0]


def test_solver_gradients_match_autograd(rng):
    N, k, n, lam = 7, 4, 3, 0.6
    X = torch.tensor(rng.standard_normal((N, n)), dtype=torch.float64)
    W = torch.tensor(rng.standard_normal((k, n)), dtype=torch.float64)
    W = (W / W.norm(dim=1, keepdim=True)).requires_grad_(True)
    Z = torch.tensor(rng.uniform(0.1, 1.0, (N, k)), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(rng.standard_normal(n), dtype=torch.float64, requires_grad=True)
    L = _torch_objective(X, W, Z, b, lam)
    # the value agrees with the numpy objective
    assert float(L.detach()) == pytest.approx(wl.sae_objective(X.numpy(), W.detach().numpy(), Z.detach().numpy(), b.detach().numpy(), lam=lam).value, rel=1e-13)
    L.backward()
    with torch.no_grad():
        Xt = X - b
        # codes: the solver's step uses g = (x - b - zW) W^T; dL/dZ = (2/N)(lam - g) for unit atoms
        g = (Xt - Z @ W) @ W.T
        torch.testing.assert_close(Z.grad, 2.0 / N * (lam - g))
        # atoms: on the sphere the penalty's gradient is radial, so the tangent gradient is (2/N)(A W - B)
        A, B = Z.T @ Z, Z.T @ Xt
        G = 2.0 / N * (A @ W - B)
        tang = lambda M: M - (M * W).sum(1, keepdim=True) * W  # noqa: E731
        torch.testing.assert_close(tang(W.grad), tang(G))
        # bias: dL/db = (2/N) sum_i (z_i W + b - x_i), zero at the solver's update b = mean(X - Z W)
        torch.testing.assert_close(b.grad, 2.0 / N * (Z @ W + b - X).sum(0))
        b_new = (X - Z @ W).mean(0)
    b2 = b_new.clone().requires_grad_(True)
    _torch_objective(X, W.detach(), Z.detach(), b2, lam).backward()
    assert float(b2.grad.abs().max()) < 1e-12


def test_code_step_fixed_point_is_the_lasso_optimum(rng):
    X = rng.standard_normal((6, 4))
    W = rng.standard_normal((5, 4))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    lam = 0.3
    opt = wl.optimal_codes(X, W, np.zeros(4), lam=lam, tol=1e-13, dtype="float64", device="cpu")
    Zs = torch.tensor(opt.codes.toarray())
    invL = 1.0 / np.linalg.eigvalsh(W @ W.T)[-1]
    Z1 = code_steps(torch.tensor(X), torch.tensor(W), lam, invL, Zs, 5)
    torch.testing.assert_close(Z1, Zs, atol=1e-6, rtol=0)


def _sparse_problem(rng, N=60, k=16, n=6, active=2):
    W = rng.standard_normal((k, n))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    Zt = np.zeros((N, k))
    for i in range(N):
        Zt[i, rng.choice(k, active, replace=False)] = rng.uniform(0.5, 2.0, active)
    return Zt @ W + 0.05 * rng.standard_normal((N, n)), W


def test_working_sets_hold_support_and_violations(rng):
    lam = 0.3
    S = torch.tensor([[0.5, 0.1, 0.4, 0.0, 0.2],     # violations at 0 and 2; support at 3
                      [0.0, 0.0, 0.0, 0.0, 0.0],     # nothing: empty working set
                      [0.9, 0.8, 0.7, 0.6, 0.35]],   # 5 violations, cap 2, support at 4
                     dtype=torch.float64)
    Z = torch.zeros((3, 5), dtype=torch.float64)
    Z[0, 3] = 1.0
    Z[2, 4] = 0.5
    rows, ws, cnt = _working_sets(S, Z, lam, cap=3, sup_max=1)
    # points sorted by working-set size; point 2 (5 candidates, cap 3) keeps its support (atom 4)
    # and its two largest violations
    assert rows.tolist() == [0, 2, 1] and cnt.tolist() == [3, 3, 0]
    assert sorted(ws[0, :3].tolist()) == [0, 2, 3]
    assert sorted(ws[1, :3].tolist()) == [0, 1, 4]
    # the cap grows to twice the largest support, so a full support always leaves room
    rows, ws, cnt = _working_sets(S, Z, lam, cap=1, sup_max=1)
    assert cnt.tolist() == [2, 2, 0] and 4 in ws[1].tolist() and 3 in ws[0].tolist()


@pytest.mark.parametrize("cap, budget", [(1, 1 << 24), (3, 1 << 24), (16, 1 << 24), (3, 40)])
def test_working_set_coordinate_descent_reaches_the_lasso_optimum(rng, cap, budget):
    """Alternating working-set selection and restricted coordinate descent (the solver's code step) is
    monotone per point and its fixed point is the exact nonnegative lasso solution (vs optimal_codes)."""
    X, W = _sparse_problem(rng)
    lam = 0.3
    ref = wl.optimal_codes(X, W, np.zeros(X.shape[1]), lam=lam, tol=1e-13, dtype="float64", device="cpu")
    Xt, Wt = torch.tensor(X), torch.tensor(W)
    Z = torch.zeros((X.shape[0], W.shape[0]), dtype=torch.float64)
    G = Wt @ Wt.T
    sup_max = 0
    P_old = (Xt * Xt).sum(1)
    for _ in range(60):
        R = Xt - Z @ Wt
        Z, sup_max = _cd_codes(R @ Wt.T, Z, G, *_working_sets(R @ Wt.T, Z, lam, cap, sup_max), lam, 30, 0.0,
                                budget=budget)  # budget 40: blocks of 1-4 points
        assert (Z >= 0).all()
        R = Xt - Z @ Wt
        P = (R * R).sum(1) + 2 * lam * Z.sum(1)
        assert (P <= P_old + 1e-12).all()  # exact coordinate steps never increase any point's objective
        P_old = P
    np.testing.assert_allclose(Z.numpy(), ref.codes.toarray(), atol=1e-6)
    assert float(P.mean()) == pytest.approx(ref.value, rel=1e-10)


def test_dict_sweeps_are_monotone_block_minimisers(rng):
    X, W0 = _sparse_problem(rng)
    Z = torch.tensor(rng.uniform(0, 1, (X.shape[0], W0.shape[0])) * (rng.uniform(size=(X.shape[0], W0.shape[0])) < 0.3))
    Z[:, 0] = 0.0  # an unused atom is left where it is
    A, B = Z.T @ Z, Z.T @ torch.tensor(X)
    W = torch.tensor(rng.standard_normal(W0.shape))
    W = W / W.norm(dim=1, keepdim=True)
    f = lambda M: float((A * (M @ M.T)).sum() - 2 * (B * M).sum())  # noqa: E731
    vals = [f(W)]
    for _ in range(30):
        W1 = _dict_steps(W, A, B, 1)
        vals.append(f(W1))
        assert vals[-1] <= vals[-2] + 1e-12
        W = W1
    torch.testing.assert_close(W.norm(dim=1), torch.ones(W.shape[0], dtype=W.dtype))
    # at a fixed point each live atom is the block minimiser c_d / ||c_d||, c_d = B_d - sum_{j != d} A_dj w_j
    C = B - A @ W + torch.diagonal(A)[:, None] * W
    live = torch.diagonal(A) > 0
    torch.testing.assert_close(W[live], C[live] / C[live].norm(dim=1, keepdim=True), atol=1e-5, rtol=0)


def test_full_batch_small_working_sets(rng):
    """Tiny working sets (many truncated per step) still give monotone steps and near-optimal running codes."""
    X, _ = _sparse_problem(rng, N=80, k=16, n=8)
    fit = wl.fit_dictionary(X, lam=0.3, width=12, device="cpu", seed=0, ws_size=1, max_iter=80)
    vals = [h["value"] for h in fit.history]
    assert all(v1 <= v0 * (1 + 1e-6) for v0, v1 in zip(vals, vals[1:]))
    # the running objective uses the solver's own codes: close to the certified optimal re-coding
    assert fit.value <= vals[-1] * (1 + 1e-6) and vals[-1] <= fit.value * (1 + 1e-3)


def test_extrapolation_speeds_up_convergence_and_keeps_the_history_monotone(rng, monkeypatch, one_torch_thread):
    """Extrapolation exists to cut the slow tail of alternating minimisation: after 20 steps the excess over
    the converged value is at least 10 times smaller with it than without (measured: about 50 times)."""
    import widelimit.learn._steps as steps

    X, _ = _sparse_problem(rng, N=200, k=16, n=8)
    kw = dict(device="cpu", seed=0, rtol=0.0)
    on = wl.fit_dictionary(X, lam=0.3, width=12, max_iter=60, **kw)
    monkeypatch.setattr(steps, "EXTRAPOLATE", (0.0,) + steps.EXTRAPOLATE[1:])
    off = wl.fit_dictionary(X, lam=0.3, width=12, max_iter=20, **kw)
    v_on, v_off = [h["value"] for h in on.history], [h["value"] for h in off.history]
    assert v_on[:2] == v_off[:2]  # the first extrapolation needs a previous step
    converged = v_on[-1]
    assert v_on[-1] == pytest.approx(v_on[-10], rel=1e-7)  # the reference has converged
    assert 0 <= v_on[20] - converged <= 0.1 * (v_off[20] - converged)
    assert all(v1 <= v0 * (1 + 1e-6) for v0, v1 in zip(v_on, v_on[1:]))
    assert all(v1 <= v0 * (1 + 1e-6) for v0, v1 in zip(v_off, v_off[1:]))


def test_jumprelu_straight_through(rng):
    jump = jumprelu_ste
    pre = torch.tensor(rng.standard_normal((50, 3)), requires_grad=True)
    theta = torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    out = jump(pre, theta, 0.2)
    torch.testing.assert_close(out, pre * (pre > theta))
    out.sum().backward()
    torch.testing.assert_close(pre.grad, (pre > theta).double())
    near = ((pre - theta).abs() < 0.1).double()
    torch.testing.assert_close(theta.grad, -(theta * near / 0.2).sum(0))


def test_crossvalidate_reaches_exact_optimum_on_rays(rays):
    X, truth, lam = rays
    cv = wl.crossvalidate(X, lam=lam, n_restarts=2, device="cpu")
    assert cv.width == cv.n_rays == 4
    assert cv.rel_gap <= 1e-4 and cv.certified and cv.respects_bound
    assert cv.match["min_ray_cosine"] > 1 - 1e-6
    np.testing.assert_allclose(cv.fit.bias, truth["centre"], atol=1e-3)
    assert len(cv.restart_values) == 2
    d = cv.as_dict()
    json.dumps(d)
    assert d["certificate"]["certified"]


def test_below_the_number_of_rays_stays_above_the_bound(rays):
    X, _, lam = rays
    lb = wl.solve(X, lam=lam).lower_bound
    cv = wl.crossvalidate(X, lam=lam, width=2, n_restarts=3, device="cpu", inits=("rays", "data", "random"))
    assert cv.respects_bound
    assert min(cv.restart_values) >= lb
    assert cv.rel_gap > 0.05  # two atoms cannot serve four rays
    assert not cv.certified


@pytest.mark.parametrize("kw", [
    {"init": "rays"}, {"init": "data"}, {"init": "random", "max_iter": 40}, {"batch_size": 8, "max_iter": 60},
    {"encoder": "standard", "max_iter": 150, "lr": 3e-3}, {"encoder": "jumprelu", "max_iter": 150},
    {"encoder": "topk", "topk": 2, "max_iter": 150},
])
def test_invariants_at_every_returned_solution(rays, kw, one_torch_thread):
    X, _, lam = rays
    X = X.astype(np.float32)  # float32 input is accepted; every evaluation is float64
    fit = wl.fit_dictionary(X, lam=lam, width=5, device="cpu", seed=1, **kw)
    np.testing.assert_allclose(np.linalg.norm(fit.dictionary, axis=1), 1.0, atol=1e-12)
    assert fit.codes.shape == (X.shape[0], 5) and (fit.codes.data >= 0).all()
    assert fit.value == pytest.approx(wl.sae_objective(X, fit.dictionary, fit.codes, fit.bias, lam=lam).value, rel=1e-9)
    assert fit.coding_gap <= 1e-6 * fit.value
    assert all(np.isfinite(h["value"]) for h in fit.history) and fit.n_iter == fit.history[-1]["step"]
    assert fit.value >= wl.solve(X, lam=lam).lower_bound - 1e-12
    if fit.encoder != "none":
        # optimal re-coding of the decoder can only improve on the encoder's own codes
        assert fit.value <= fit.encoder_value + fit.coding_gap + 1e-12
        P = fit.encoder_params
        assert P["W_enc"].shape == (X.shape[1], 5)
        # the encoder's codes recomputed here from its parameters (SAELens layout), and their objective
        pre = (X.astype(np.float64) - fit.bias) @ P["W_enc"] + P["b_enc"]
        if fit.encoder == "standard":
            F = np.maximum(pre, 0.0)
        elif fit.encoder == "jumprelu":
            assert (P["threshold"] > 0).all()
            F = np.where(pre > P["threshold"], pre, 0.0)
        else:
            assert P["k"] == 2
            F = np.maximum(pre, 0.0)
            F[pre < np.sort(pre, axis=1)[:, [-2]]] = 0.0  # all but the two largest
        np.testing.assert_allclose(encoder_codes(X, fit.encoder, P, fit.bias).toarray(), F, rtol=1e-12, atol=1e-12)
        R = X.astype(np.float64) - F @ fit.dictionary - fit.bias
        own = np.mean(np.sum(R * R, axis=1)) + 2 * lam * F.sum() / len(X)
        assert fit.encoder_value == pytest.approx(own, rel=1e-9)


@pytest.mark.parametrize("encoder, kw, factor", [
    ("standard", {"lr": 3e-3}, 20.0),  # measured 90x
    ("jumprelu", {}, 4.0),  # measured 6.5x
    ("topk", {"topk": 2}, 4.0),  # measured 7.1x
])
def test_encoder_training_lowers_the_objective(rays, encoder, kw, factor, one_torch_thread):
    """150 Adam steps cut the encoder's excess over the wide-limit bound, L(encoder codes) - L*, by a stated factor.

    The run with max_iter=0 is the same encoder at its initialisation (W_enc = W^T, b_enc = -lam).
    """
    X, _, lam = rays
    best = wl.solve(X, lam=lam).value
    start = wl.fit_dictionary(X, lam=lam, width=5, encoder=encoder, device="cpu", seed=1, max_iter=0, **kw)
    fit = wl.fit_dictionary(X, lam=lam, width=5, encoder=encoder, device="cpu", seed=1, max_iter=150, **kw)
    assert start.n_iter == 0 and fit.n_iter == 150
    assert start.encoder_value - best > 2.0  # far from the optimum at the start (measured 2.9; topk 2.4)
    assert fit.encoder_value - best <= (start.encoder_value - best) / factor
    json.dumps(fit.as_dict())


def test_amortised_relu_reaches_the_bound_on_rays(rays, one_torch_thread):
    X, _, lam = rays
    lb = wl.solve(X, lam=lam).lower_bound
    fit = wl.fit_dictionary(X, lam=lam, width=4, encoder="standard", device="cpu", max_iter=1500, lr=3e-3)
    # 1-sparse optimal codes (<w, x - b> - lam)_+ are exactly a ReLU encoder: both objectives near the bound
    assert (fit.value - lb) / fit.value < 1e-4
    assert (fit.encoder_value - lb) / fit.encoder_value < 1e-3


def test_deterministic_on_cpu(rays):
    X, _, lam = rays
    a = wl.fit_dictionary(X, lam=lam, width=3, init="data", device="cpu", seed=7, max_iter=30)
    b = wl.fit_dictionary(X, lam=lam, width=3, init="data", device="cpu", seed=7, max_iter=30)
    np.testing.assert_array_equal(a.dictionary, b.dictionary)
    assert [h["value"] for h in a.history] == [h["value"] for h in b.history]
    init = wl.fit_dictionary(X, lam=lam, width=3, init=a.dictionary, bias=a.bias, device="cpu", max_iter=5)
    assert init.init == "array" and init.value <= a.value * (1 + 1e-6)


@pytest.mark.parametrize("encoder", ["none", "standard", "jumprelu"])
@pytest.mark.parametrize("e", [100, -100])
def test_data_far_from_unit_magnitude_fit_as_their_exact_rescaling(encoder, e, one_torch_thread):
    """float32 squares of data at 2^100 overflow and at 2^-100 underflow: the fit runs on 2^-e X (exact) and maps back.

    The data X0 have their largest |x - b| in [0.5, 1), so they are fitted as they are, and 2^e X0 is
    fitted as X0 itself: every number of the result must be that of X0 times the right power of 2^e.
    Before the rescaling, 2^100 X0 stopped with "the objective became inf" and 2^-100 X0 lost its squares.
    """
    X0 = np.random.default_rng(3).standard_normal((40, 3))
    lam = 0.1
    X0 = X0 / (np.abs(X0 - wl.huber_median(X0, lam=lam).point).max() * 1.01)
    assert 0.5 <= np.abs(X0 - wl.huber_median(X0, lam=lam).point).max() < 1.0
    s = 2.0 ** e
    kw = dict(width=3, max_iter=100, encoder=encoder, seed=1, device="cpu")
    ref = wl.fit_dictionary(X0, lam=lam, **kw)
    seen = []
    fit = wl.fit_dictionary(X0 * s, lam=lam * s, progress=seen.append, **kw)
    np.testing.assert_array_equal(fit.dictionary, ref.dictionary)
    np.testing.assert_array_equal(fit.bias, ref.bias * s)
    assert fit.value == ref.value * s * s
    assert (fit.codes != ref.codes * s).nnz == 0
    assert [h["value"] for h in fit.history] == [h["value"] * s * s for h in ref.history]
    assert [ev.value for ev in seen] == [h["value"] for h in fit.history]
    assert set(fit.encoder_params) == set(ref.encoder_params)
    for name, v in fit.encoder_params.items():  # codes scale with the data, W_enc and k do not
        np.testing.assert_array_equal(v, ref.encoder_params[name] * (1 if name in ("W_enc", "k") else s))
    if encoder != "none":
        assert fit.encoder_value == ref.encoder_value * s * s


def test_history_is_monotone_full_batch(rays):
    X, _, lam = rays
    seen = []
    fit = wl.fit_dictionary(X, lam=lam, width=3, init="random", device="cpu", seed=2, max_iter=50, progress=seen.append)
    vals = [h["value"] for h in fit.history]
    assert all(v1 <= v0 * (1 + 1e-6) for v0, v1 in zip(vals, vals[1:]))
    # one Progress event per recorded step, carrying the step and the value of the history
    assert [(e.stage, e.rows_done, e.rows_total, e.value) for e in seen] == \
        [("fit", h["step"], 50, h["value"]) for h in fit.history]


def test_frontier_saturates_at_the_number_of_rays(rays, tmp_path):
    X, _, lam = rays
    fr = wl.frontier(X, lam=lam, widths=[1, 2, 3, 4, 5], n_restarts=2, device="cpu", out=tmp_path / "f.png")
    assert fr.n_rays == 4 and fr.saturation_width == 4
    assert fr.respects_bound and fr.monotone
    assert all(v >= fr.lower_bound for v in fr.values)
    assert (tmp_path / "f.png").stat().st_size > 1000
    assert json.loads(json.dumps(fr.as_dict()))["saturation_width"] == 4


def test_bad_input(rays):
    X, _, lam = rays
    with pytest.raises(ValueError, match="width"):
        wl.fit_dictionary(X, lam=lam, width=0)
    with pytest.raises(ValueError, match="width"):
        wl.fit_dictionary(X, lam=lam, width=2.5)
    with pytest.raises(ValueError, match="lam"):
        wl.fit_dictionary(X, lam=-1.0, width=3)
    Xn = X.copy()
    Xn[3, 0] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        wl.fit_dictionary(Xn, lam=lam, width=3)
    with pytest.raises(ValueError, match="encoder"):
        wl.fit_dictionary(X, lam=lam, width=3, encoder="sigmoid")
    with pytest.raises(ValueError, match="init"):
        wl.fit_dictionary(X, lam=lam, width=3, init="kmeans")
    with pytest.raises(ValueError, match="init has"):
        wl.fit_dictionary(X, lam=lam, width=3, init=np.ones((2, X.shape[1])))
    with pytest.raises(ValueError, match="topk"):
        wl.fit_dictionary(X, lam=lam, width=3, encoder="topk", topk=4)
    with pytest.raises(ValueError, match="width"):
        wl.frontier(X, lam=lam, widths=[0, 2])
    with pytest.raises(ValueError, match="n_restarts"):
        wl.crossvalidate(X, lam=lam, n_restarts=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            wl.fit_dictionary(X, lam=lam, width=3, device="cuda")


def test_cli_fit(capsys, tmp_path):
    assert main(["fit", "rays", "--width", "6", "--json", "--device", "cpu", "--out", str(tmp_path)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"value", "lower_bound", "gap", "width"} <= set(d)
    assert d["width"] == 6 and d["rel_gap"] <= 1e-4 and d["certified"]
    assert (tmp_path / "cfg.json").exists() and (tmp_path / "sae_weights.safetensors").exists()
    assert (tmp_path / "fit.json").exists()
    assert main(["fit", "rays", "--width", "0"]) == 2
    assert "argument --width: must be an integer >= 1" in capsys.readouterr().err
    assert main(["frontier", "rays", "--widths", "2,x"]) == 2
    capsys.readouterr()
    out = tmp_path / "fr"
    assert main(["frontier", "rays", "--widths", "5,6", "--restarts", "1", "--json", "--out", str(out)]) == 0
    fr = json.loads(capsys.readouterr().out)
    assert fr["saturation_width"] == 6 == fr["n_rays"] and fr["respects_bound"]
    assert (out / "frontier.png").exists() and (out / "frontier.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_same_answer(rays):
    X, _, lam = rays
    cpu = wl.fit_dictionary(X, lam=lam, width=4, device="cpu")
    gpu = wl.fit_dictionary(X, lam=lam, width=4, device="cuda")
    assert gpu.device.startswith("cuda")
    assert gpu.value == pytest.approx(cpu.value, rel=1e-6)
    cv = wl.crossvalidate(X, lam=lam, device="cuda", n_restarts=1)
    assert cv.certified
