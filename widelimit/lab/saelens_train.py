"""SAEs trained by SAELens's own training code (its ``TrainingSAE`` classes and their ``training_forward_pass`` loss).

One loop for every architecture: minibatches drawn with replacement from the rows of ``X``, Adam on
the loss SAELens computes, ``b_dec`` started at the data mean. The loss of SAELens's ``standard``
(ReLU) SAE is ``mean ||x_hat - x||^2 + l1_coefficient mean sum_d f_d ||W_dec,d||``, the objective of
theory.md §1 with ``l1_coefficient = 2 lam`` (the SAE's ``lam`` is read back as ``l1_coefficient / 2``).
TopK keeps the ``k`` largest pre-activations; JumpReLU penalises ``l0_coefficient`` times its
(straight-through) L0. Used by ``widelimit experiment trained-predictions`` and
``benchmarks/l0_pursuit.py``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ARCHITECTURES", "train_saelens"]

#: architecture -> what ``sparsity`` means for it
ARCHITECTURES = {"standard": "lam (l1_coefficient = 2 lam)", "topk": "k", "batchtopk": "k",
                 "jumprelu": "l0_coefficient", "matryoshka": "k"}


def _config(arch: str, d: int, width: int, sparsity: float, extra: dict):
    import sae_lens as sl

    if arch == "standard":
        return sl.StandardTrainingSAE(sl.StandardTrainingSAEConfig(d_in=d, d_sae=width, l1_coefficient=2.0 * sparsity,
                                                                   **extra))
    if arch == "jumprelu":
        extra = {"jumprelu_init_threshold": 0.05, **extra}
        return sl.JumpReLUTrainingSAE(sl.JumpReLUTrainingSAEConfig(d_in=d, d_sae=width, l0_coefficient=float(sparsity),
                                                                   **extra))
    k = int(sparsity)
    if arch == "topk":
        return sl.TopKTrainingSAE(sl.TopKTrainingSAEConfig(d_in=d, d_sae=width, k=k, **extra))
    if arch == "batchtopk":
        return sl.BatchTopKTrainingSAE(sl.BatchTopKTrainingSAEConfig(d_in=d, d_sae=width, k=k, **extra))
    return sl.MatryoshkaBatchTopKTrainingSAE(sl.MatryoshkaBatchTopKTrainingSAEConfig(
        d_in=d, d_sae=width, k=k, matryoshka_widths=[width // 4, width // 2, width], **extra))


def train_saelens(X, arch: str, *, width: int, sparsity: float, steps: int = 200, batch_size: int = 512,
                  lr: float | None = None, seed: int = 0, config: dict | None = None):
    """Train an SAE of SAELens's architecture ``arch`` on the rows of ``X`` with SAELens's own loss.

    Parameters
    ----------
    X : array (N, d)
        Activations, one token per row.
    arch : str
        ``"standard"`` (ReLU + L1), ``"topk"``, ``"batchtopk"``, ``"jumprelu"`` or ``"matryoshka"``.
    width : int
        ``d_sae``.
    sparsity : float
        ``lam`` for ``standard`` (the SAE is built with ``l1_coefficient = 2 lam``, theory.md §1),
        ``k`` for the TopK family, ``l0_coefficient`` for ``jumprelu``.
    steps : int
        Adam steps (one minibatch each).
    batch_size : int
        Rows per minibatch (drawn with replacement).
    lr : float, optional
        Adam's step size (default 3e-4 for ``jumprelu``, 1e-3 otherwise).
    seed : int
        Seeds the initialisation (``torch.manual_seed``) and the minibatches.
    config : dict, optional
        More fields of SAELens's training config (``{"jumprelu_sparsity_loss_mode": "tanh"}``: Anthropic's
        tanh penalty instead of the default straight-through L0 ``"step"``; JumpReLU starts at threshold 0.05
        unless ``jumprelu_init_threshold`` is given).

    Returns
    -------
    sae_lens TrainingSAE
        The trained SAELens object (read it with :func:`widelimit.sae.formats.from_object`).
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    import torch
    from sae_lens.saes.sae import TrainStepInput

    torch.manual_seed(int(seed))
    Xt = torch.as_tensor(np.ascontiguousarray(X, dtype=np.float32))
    sae = _config(arch, int(Xt.shape[1]), int(width), sparsity, dict(config or {}))
    with torch.no_grad():
        sae.b_dec.copy_(Xt.mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=lr if lr is not None else (3e-4 if arch == "jumprelu" else 1e-3))
    coeffs = {name: c.value if hasattr(c, "value") else c for name, c in sae.get_coefficients().items()}
    g = torch.Generator().manual_seed(int(seed))
    for step in range(int(steps)):
        idx = torch.randint(0, Xt.shape[0], (int(batch_size),), generator=g)
        out = sae.training_forward_pass(TrainStepInput(sae_in=Xt[idx], coefficients=coeffs, dead_neuron_mask=None,
                                                       n_training_steps=step, is_logging_step=False))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return sae
