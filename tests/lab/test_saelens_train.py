"""train_saelens: SAELens's own loss is theory.md §1's objective at l1_coefficient = 2 lam; TopK keeps k latents."""

import numpy as np
import pytest

sae_lens = pytest.importorskip("sae_lens")

import torch  # noqa: E402
from sae_lens.saes.sae import TrainStepInput  # noqa: E402

from widelimit.lab.saelens_train import train_saelens  # noqa: E402
from widelimit.sae.formats.objects import from_object  # noqa: E402


def test_standard_loss_is_the_objective_of_theory_1():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 6)).astype(np.float32)
    lam = 0.3
    m = train_saelens(X, "standard", width=8, sparsity=lam, steps=5, batch_size=16, seed=1)
    w = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    F = np.maximum((X - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0.0)    # ReLU encoder, b_dec applied to the input
    R = F @ w["W_dec"] + w["b_dec"] - X
    objective = np.mean(np.sum(R * R, axis=1)) + 2 * lam * np.mean(F @ np.linalg.norm(w["W_dec"], axis=1))
    coeffs = {n: c.value if hasattr(c, "value") else c for n, c in m.get_coefficients().items()}
    with torch.no_grad():
        out = m.training_forward_pass(TrainStepInput(sae_in=torch.as_tensor(X), coefficients=coeffs,
                                                     dead_neuron_mask=None, n_training_steps=0, is_logging_step=False))
    assert float(out.loss) == pytest.approx(objective, rel=1e-5)
    assert from_object(m).l1_coefficient == pytest.approx(2 * lam)


def test_topk_keeps_k_latents_and_bad_arch_is_refused():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 5)).astype(np.float32)
    sae = from_object(train_saelens(X, "topk", width=10, sparsity=3, steps=3, batch_size=8))
    assert sae.k == 3 and ((sae.encode(X) > 0).sum(axis=1) <= 3).all()
    with pytest.raises(ValueError, match="arch must be one of standard, topk"):
        train_saelens(X, "relu", width=4, sparsity=1.0)
