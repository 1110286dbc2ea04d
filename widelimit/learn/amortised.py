r"""Amortised SAE encoders for :func:`widelimit.fit_dictionary` (SAELens layout), trained with Adam.

``f = sigma((x - b_dec) W_enc + b_enc)`` with ``sigma`` = ReLU (``"standard"``), JumpReLU (threshold
``theta``, straight-through estimator with a rectangle kernel, Rajamanoharan et al. 2024) or TopK,
computed by :func:`widelimit.sae.model.encode`, the encoder that certifies trained SAEs; decoder
``W_dec`` with unit-norm rows (projected back after every step) and ``b_dec``, on the objective of
theory.md §1 with the encoder's codes.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .._validation import check_data, check_vector
from ..sae.model import encode
from ._steps import _minibatches, _rownorm

__all__ = ["encoder_codes"]


# ======================================================================================
# SAE encoders: the one encoder of the toolkit, widelimit.sae.model.encode (also what certifies
# trained SAEs), with SAELens' names; training passes torch tensors (autograd), evaluation numpy.
# ======================================================================================


def _encoder_params(params, encoder):
    """The :func:`widelimit.sae.model.encode` parameters of the training parameters (threshold = exp(log_threshold))."""
    import torch

    p = {"W_enc": params["W_enc"], "b_enc": params["b_enc"], "b_dec": params["b_dec"]}
    if encoder == "jumprelu":
        p["threshold"] = torch.exp(params["log_threshold"])
    return p


def encoder_codes(X, encoder: str, encoder_params: dict, bias, *, batch_size: int = 8192) -> sp.csr_array:
    """Codes of an SAELens-layout encoder on ``X`` (float64, sparse): :func:`widelimit.sae.model.encode` per batch.

    ``encoder`` is ``"standard"``, ``"jumprelu"`` (needs ``threshold``) or ``"topk"`` (needs ``k``);
    ``encoder_params`` holds ``W_enc``, ``b_enc`` and those; ``bias`` is ``b_dec``.
    """
    X = check_data(X)
    N, n = X.shape
    b = check_vector(bias, n, "bias")
    if encoder not in ("standard", "jumprelu", "topk"):
        raise ValueError(f"encoder must be one of standard, jumprelu, topk, got {encoder!r}")
    params = {name: encoder_params[name] for name in ("W_enc", "b_enc", "threshold") if name in encoder_params}
    params["b_dec"] = b
    blocks = []
    for s in range(0, N, batch_size):
        f = encode(np.asarray(X[s : s + batch_size], dtype=np.float64), params, encoder, k=encoder_params.get("k"))
        blocks.append(sp.csr_array(f))
    return sp.csr_array(sp.vstack(blocks, format="csr"))


def _fit_amortised(X, Xd, W, b, lam, encoder, opts, report, dev, cdt):
    import torch

    N, n = X.shape
    k = W.shape[0]
    topk = int(opts["topk"]) if opts["topk"] is not None else max(1, min(k, 32))
    params = {
        "W_enc": W.T.clone().requires_grad_(True),
        "b_enc": torch.full((k,), -lam, dtype=cdt, device=dev).requires_grad_(True),
        "W_dec": W.clone().requires_grad_(True),
        "b_dec": b.clone().requires_grad_(opts["learn_bias"]),
    }
    train = [p for p in params.values() if p.requires_grad]
    if encoder == "jumprelu":
        params["log_threshold"] = torch.full((k,), math.log(0.1 * lam), dtype=cdt, device=dev).requires_grad_(True)
        params["bandwidth"] = opts["bandwidth"] if opts["bandwidth"] is not None else 0.1 * lam
        train.append(params["log_threshold"])
    optim = torch.optim.Adam(train, lr=opts["lr"])
    bs = min(int(opts["batch_size"] or 4096), N)
    rng = np.random.default_rng(opts["seed"])
    step = 0
    reason = "max_iter"
    batches = _minibatches(N, bs, rng)
    while step < opts["max_iter"]:
        step += 1
        idx = next(batches)
        xb = Xd[torch.as_tensor(idx, device=dev)] if Xd is not None else torch.as_tensor(
            np.asarray(X[idx], dtype=np.float64), dtype=cdt, device=dev)
        f = encode(xb, _encoder_params(params, encoder), encoder, k=topk,
                   jumprelu_bandwidth=params.get("bandwidth") if encoder == "jumprelu" else None)
        rec = f @ params["W_dec"] + params["b_dec"] - xb
        loss = ((rec * rec).sum(1) + 2.0 * lam * (f * params["W_dec"].norm(dim=1)).sum(1)).mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        with torch.no_grad():
            params["W_dec"].copy_(_rownorm(params["W_dec"], old=params["W_dec"]))
        if report(step, float(loss.detach().double())):
            reason = report.reason
            break
    with torch.no_grad():
        Wd = params["W_dec"].detach()
        out = {"W_enc": params["W_enc"].detach().cpu().double().numpy(),
               "b_enc": params["b_enc"].detach().cpu().double().numpy()}
        if encoder == "jumprelu":
            out["threshold"] = torch.exp(params["log_threshold"]).detach().cpu().double().numpy()
        if encoder == "topk":
            out["k"] = topk
    return Wd, params["b_dec"].detach(), step, reason, out
