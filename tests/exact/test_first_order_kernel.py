"""The one first-order-conditions kernel (widelimit.exact.stationarity: code_conditions, first_order_chunk,
tangent_norms) against the gradient of the objective taken by torch's autograd, on both back-ends, and its
three users (first_order_conditions, feature_stability, certify_sae's per-feature columns) reading it alike."""

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")

from widelimit.exact.stability import feature_stability  # noqa: E402
from widelimit.exact.stationarity import code_conditions, first_order_chunk, first_order_conditions, tangent_norms  # noqa: E402


def _triple(seed=0, N=40, n=6, k=9):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n))
    W = rng.standard_normal((k, n)) * rng.uniform(0.5, 2.0, (k, 1))  # norms folded into the codes
    Z = np.maximum(rng.standard_normal((N, k)) - 0.8, 0.0)
    Z[:, 3] = 0.0  # a dead feature
    b = 0.1 * rng.standard_normal(n)
    return X, W, Z, b


def _autograd(X, W, Z, b, lam):
    """Gradients of L = (1/N) sum ||x - b - z W||^2 + (2 lam / N) sum z_d ||w_d|| in the unit-atom parametrisation."""
    N = X.shape[0]
    norms = np.linalg.norm(W, axis=1)
    U = torch.tensor(W / norms[:, None], requires_grad=True)
    Y = torch.tensor(Z * norms, requires_grad=True)  # codes of the unit atoms
    R = torch.tensor(X - b) - Y @ U
    L = (R * R).sum() / N + 2 * lam * Y.sum() / N
    gU, gY = torch.autograd.grad(L, (U, Y))
    U0 = U.detach().numpy()
    tang = gU.numpy() - (gU.numpy() * U0).sum(1)[:, None] * U0  # the gradient on the sphere's tangent space
    corr = lam - 0.5 * N * gY.numpy()  # dL/dy_id = (2/N)(lam - <u_d, r_i>)
    return U0, Z * norms, corr, np.linalg.norm(tang, axis=1), R.detach().numpy()


def test_kernel_matches_autograd_on_numpy_and_torch():
    X, W, Z, b = _triple()
    lam = 0.4
    U, Y, corr, tang_ref, R = _autograd(X, W, Z, b, lam)
    on = Y > 0
    act_ref = np.where(on, np.abs(corr - lam), 0.0).max(0)
    inact_ref = np.where(on, -np.inf, corr).max(0)
    q = first_order_chunk(R, sp.csr_array(Y), U, lam)
    np.testing.assert_allclose(q["C"], corr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(q["active_error"], act_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(q["inactive_max"], inact_ref, rtol=1e-12, atol=1e-12)
    N = X.shape[0]
    np.testing.assert_allclose(2.0 / N * tangent_norms(q["EtZ"], U), tang_ref, rtol=1e-10, atol=1e-14)
    # the torch back-end: same numbers, and C comes back unchanged
    Ct = torch.as_tensor(q["C"].copy())
    rows, cols = (torch.as_tensor(a) for a in np.nonzero(on))
    act_t, inact_t = code_conditions(Ct, rows, cols, lam)
    np.testing.assert_array_equal(Ct.numpy(), q["C"])
    np.testing.assert_allclose(act_t.numpy(), q["active_error"], rtol=1e-15)
    np.testing.assert_array_equal(inact_t.numpy(), q["inactive_max"])
    g_t = tangent_norms(torch.as_tensor(q["EtZ"]), torch.as_tensor(U)).numpy()
    np.testing.assert_allclose(g_t, tangent_norms(q["EtZ"], U), rtol=1e-14)


def test_stationarity_and_stability_read_the_same_kernel():
    X, W, Z, b = _triple(1)
    lam = 0.3
    U, Y, corr, tang_ref, _ = _autograd(X, W, Z, b, lam)
    on = Y > 0
    N = X.shape[0]
    st = first_order_conditions(X, W, Z, b, lam=lam)
    assert st.code_active_error == pytest.approx(np.abs(corr[on] - lam).max(), rel=1e-10)
    assert st.code_margin == pytest.approx(lam - corr[~on].max(), rel=1e-10)
    assert st.atom_gradient == pytest.approx(tang_ref.max(), rel=1e-10)
    fs = feature_stability(X, W, Z, b, lam=lam, witnesses=False)
    S = Y.sum(0)
    live = S > 0
    np.testing.assert_allclose(fs.code_margin, lam - np.where(on, -np.inf, corr).max(0), rtol=1e-10)
    np.testing.assert_allclose(fs.code_active_error, np.where(on, np.abs(corr - lam), 0.0).max(0), rtol=1e-10,
                               atol=1e-14)
    # stability's atom residual is ||g_d|| / (lam S_d), with (2/N) ||g_d|| the tangent gradient
    np.testing.assert_allclose(fs.atom_residual[live], tang_ref[live] * N / 2 / (lam * S[live]), rtol=1e-10)
    assert fs.atom_residual[3] == 0.0 and not live[3]
