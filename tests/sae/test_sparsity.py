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


def test_dead_jumprelu_with_a_recorded_l0_coefficient(tmp_path):
    """A JumpReLU that fires nothing and records its l0_coefficient (the penalised search starts from empty
    codes: it once failed on an argmin over zero slots). At L0 = 0 both brackets are exact: the empty code."""
    sl = libraries.sae_lens()
    torch.manual_seed(0)
    m = sl.JumpReLUTrainingSAE(sl.JumpReLUTrainingSAEConfig(d_in=12, d_sae=30, l0_coefficient=0.05, dtype="float64"))
    with torch.no_grad():
        m.threshold.fill_(1e6)
    m.save_inference_model(tmp_path / "dead")
    sae = load_sae(tmp_path / "dead")
    assert l0_penalty(sae) == 0.05
    X = np.random.default_rng(4).standard_normal((80, 12))
    cert = wl.certify_sae(X, sae, device="cpu", sparsity=SparsityOptions(time_limit=600.0))
    xx = ((X - sae.b_dec) ** 2).sum(1)
    s, pen = cert.sparsity, cert.sparsity["penalised"]
    assert s["value"] == pytest.approx(xx.mean(), rel=1e-12) and s["lower_bound"] == pytest.approx(xx.mean(), rel=1e-12)
    # the empty code pays no penalty; a nonempty one pays at least c, so min(||x - b||^2, c) per token is the bound
    assert pen["sae_value"] == pytest.approx(xx.mean(), rel=1e-12)
    assert pen["lower_bound"] == pytest.approx(np.minimum(xx, 0.05).mean(), rel=1e-12)
    assert pen["lower_bound"] <= pen["value"] <= pen["sae_value"] * (1 + 1e-12)
    assert any(n.startswith("the SAE is dead") for n in cert.notes)


def test_default_time_share_is_the_whole_rest_for_l0_saes_and_a_tenth_for_l1_saes():
    # the bracket ran as long as the rest of a certification (its allowance) on a SAELens ReLU SAE at d_sae
    # 16,384, doubling it, though an L1 SAE's own objective is the rest; its default share there is now 1/10
    from functools import partial

    from widelimit.sae.certify import _setup
    from widelimit.sae.model import SAE
    from widelimit.sae.options import CodingOptions, RunOptions
    from widelimit.sae.parts import default_parts

    rng = np.random.default_rng(0)
    W = rng.standard_normal((20, 8))
    sae = SAE(W_dec=W, b_dec=np.zeros(8), W_enc=W.T.copy(), b_enc=np.zeros(20), architecture="standard")
    X = rng.standard_normal((30, 8))
    setup, _, _ = _setup(sae, X, 0.2, None, 0, CodingOptions(), RunOptions(device="cpu"))
    make = partial(default_parts, setup, pairs=(np.zeros(0), np.zeros(0)), sparsity=SparsityOptions())
    l1, l0 = make(coding=CodingOptions())["sparsity"], make(coding=None)["sparsity"]
    for part, share in ((l1, 0.1), (l0, 1.0)):
        part.sums.update(rest_s=20.0, own_s=1.0)
        assert part._deadline(100.0) == 100.0 + share * 20.0 - 1.0
    mine = make(coding=CodingOptions(), sparsity=SparsityOptions(time_share=0.5))["sparsity"]
    mine.sums.update(rest_s=8.0, own_s=1.0)
    assert mine._deadline(100.0) == 103.0
    with pytest.raises(ValueError, match="time_share"):
        SparsityOptions(time_share=-0.5)


def test_the_pursuit_step_uses_the_float32_atoms_and_stays_an_upper_estimate(monkeypatch):
    """The step's ``||U||_2^2`` comes from the float32 atoms, one copy shared with the screened coder (half the memory
    traffic of the float64 atoms: 8 s, a forward pass, at 65,536 x 2,304; two float32 copies were 1.2 GB there),
    and is still the SVD's value, padded by 1 %."""
    import widelimit.sae.sparsity as S
    from widelimit.coding._atoms import spectral_norm_sq
    from widelimit.sae.parts import Setup

    seen = []
    monkeypatch.setattr(S, "spectral_norm_sq", lambda U: seen.append(U.dtype) or spectral_norm_sq(U))
    rng = np.random.default_rng(0)
    U = rng.standard_normal((3000, 64))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    sae = wl.SAE(W_dec=U, b_dec=np.zeros(64), W_enc=U.T.copy(), b_enc=-np.ones(3000), architecture="standard")
    setup = Setup(sae=sae, lam=0.1, dev=torch.device("cpu"), numba=True, coding_algorithm="screened",
                  coding_tol=1e-6, U=U, norms=np.ones(3000), b=np.zeros(64))
    part = S.SparsityPart(setup)
    assert seen == [torch.float32]
    assert abs(part._Lsq / 1.01 / np.linalg.norm(U, 2) ** 2 - 1.0) < 1e-5
    assert part._atoms.U32 is setup.coder.U32  # one float32 copy
    np.testing.assert_array_equal(part._atoms.U32.numpy(), U.astype(np.float32))
