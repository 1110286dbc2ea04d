"""The bracket at an SAE's own L0 (widelimit.sae.sparsity, theory.md §10) inside certify_sae: budgets per
architecture, JumpReLU's own L0-penalised objective from its SAELens config, and the time budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import widelimit as wl
from fixtures import libraries
from widelimit.sae.formats import load_sae
from widelimit.sae.sparsity import SparsityOptions, budget_rule, l0_penalty


def _jumprelu(tmp_path, c=0.05, mode="step"):
    sl = libraries.sae_lens()
    torch.manual_seed(0)
    m = sl.JumpReLUTrainingSAE(sl.JumpReLUTrainingSAEConfig(d_in=12, d_sae=30, l0_coefficient=c,
                                                            jumprelu_sparsity_loss_mode=mode, dtype="float64"))
    with torch.no_grad():
        m.W_enc.normal_(0, 0.5)
        m.threshold.fill_(0.3)
    m.save_inference_model(tmp_path / "jr")
    return load_sae(tmp_path / "jr")


def test_jumprelu_is_bracketed_on_its_recorded_l0_objective(tmp_path):
    sae = _jumprelu(tmp_path)
    assert l0_penalty(sae) == 0.05 and budget_rule(sae)[0] is None
    X = np.random.default_rng(2).standard_normal((150, 12))
    cert = wl.certify_sae(X, sae, device="cpu", sparsity=SparsityOptions(time_limit=600.0))
    s, pen = cert.sparsity, cert.sparsity["penalised"]
    f = sae.encode(X)
    own = (f != 0).sum(1)
    mse = ((X - sae.decode(f)) ** 2).sum(1)
    assert pen["sae_value"] == pytest.approx(np.mean(mse + 0.05 * own), rel=1e-12)
    xx = ((X - sae.b_dec) ** 2).sum(1)
    assert pen["lower_bound"] == pytest.approx(np.mean(np.minimum(xx, 0.05)), rel=1e-12)
    assert pen["lower_bound"] <= pen["value"] <= pen["sae_value"]
    assert pen["value"] <= s["value"] + 0.05 * s["l0"] + 1e-12  # never worse than the budgeted witness
    assert s["l0"] <= own.mean() and s["sae_l0"] == pytest.approx(own.mean())
    # a tanh-mode JumpReLU does not minimise an L0 penalty: no penalised row
    assert l0_penalty(_jumprelu(tmp_path, mode="tanh")) is None


def test_zero_time_budget_still_refits_the_sae_codes(tmp_path):
    sae = _jumprelu(tmp_path)
    X = np.random.default_rng(3).standard_normal((100, 12))
    cert = wl.certify_sae(X, sae, device="cpu", sparsity=SparsityOptions(time_limit=0.0))
    s = cert.sparsity
    assert s["n_iter"] == 0 and s["batches_stopped_by_time"] == 1
    assert s["value"] <= s["sae_value"] and s["gain"] >= 0
    assert any("time budget" in n for n in cert.notes)
    with pytest.raises(ValueError, match="time_limit"):
        SparsityOptions(time_limit=-1.0)


def _unit(rng, k, n):
    U = rng.standard_normal((k, n))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def test_babel_screen_is_below_the_babel_function_and_equal_with_every_row():
    from widelimit.coding.sparse_bound import babel
    from widelimit.sae.sparsity import babel_screen

    U = torch.as_tensor(_unit(np.random.default_rng(4), 60, 6))
    exact = babel(U, 12)
    assert np.all(babel_screen(U, 12, rows=15) <= exact)
    np.testing.assert_allclose(babel_screen(U, 12, rows=60), exact, atol=1e-13)
    assert babel_screen(U, 12, rows=15)[2:].min() > 0


def _topk(U, k):
    from widelimit.sae.model import SAE

    return SAE(W_dec=U, b_dec=np.zeros(U.shape[1]), W_enc=U.T.copy(), b_enc=np.zeros(U.shape[0]), architecture="topk",
               k=k)


@pytest.mark.parametrize("coherent", [True, False])
def test_babel_pass_skipped_only_where_the_screen_proves_it_useless(monkeypatch, coherent):
    """40 atoms in 6 dimensions: the Babel function is >= 1 at k = 8 and the screen shows it without the
    exact pass; 12 near-orthogonal atoms in 12 dimensions at k = 2: the screen cannot, the exact pass runs and
    the restricted-eigenvalue bound proves the bracket's lower end. Same bracket as with the exact pass."""
    import widelimit.sae.sparsity as S

    rng = np.random.default_rng(5)
    U = _unit(rng, 40, 6) if coherent else np.linalg.qr(rng.standard_normal((12, 12)))[0] + 0.01
    U = U / np.linalg.norm(U, axis=1, keepdims=True)
    sae, k = _topk(U, 8 if coherent else 2), 8 if coherent else 2
    X = rng.standard_normal((80, U.shape[1]))
    opts = SparsityOptions(max_subsets=0, time_limit=600.0)
    calls = []
    orig = S.babel
    monkeypatch.setattr(S, "babel", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    screened = wl.certify_sae(X, sae, device="cpu", sparsity=opts).sparsity
    assert len(calls) == (0 if coherent else 1)
    monkeypatch.setattr(S, "babel_screen", lambda U, s, rows=0: np.zeros(int(s) + 1))  # force the exact pass
    exact = wl.certify_sae(X, sae, device="cpu", sparsity=opts).sparsity
    assert len(calls) == (1 if coherent else 2)
    for key in ("value", "lower_bound", "bound_methods", "sae_value"):
        assert screened[key] == exact[key]
    method = "restricted eigenvalue (Babel function)"
    assert (method in screened["bound_methods"]) == (not coherent)
