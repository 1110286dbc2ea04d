r"""Amortised SAE encoders for :func:`widelimit.fit_dictionary` (SAELens layout), trained with Adam.

``f = sigma((x - b_dec) W_enc + b_enc)`` with ``sigma`` = ReLU, JumpReLU (threshold ``theta``,
straight-through estimator with a rectangle kernel, Rajamanoharan et al. 2024) or TopK; decoder
``W_dec`` with unit-norm rows (projected back after every step) and ``b_dec``, on the objective of
theory.md §1 with the encoder's codes.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .._validation import check_data, check_vector
from ._steps import _minibatches, _rownorm

__all__ = ["encoder_codes"]


# ======================================================================================
# SAE encoders: _jumprelu_fn (torch, training), _encode (torch, training), encoder_codes (numpy,
# float64 evaluation). Kept together: issue 14 replaces all three by one shared encoder in
# widelimit/sae/.
# ======================================================================================


def _jumprelu_fn():
    import torch

    class JumpReLU(torch.autograd.Function):
        """``pre * 1[pre > theta]`` with a rectangle-kernel straight-through gradient for ``theta``."""

        @staticmethod
        def forward(ctx, pre, theta, bandwidth):
            ctx.save_for_backward(pre, theta)
            ctx.bandwidth = bandwidth
            return pre * (pre > theta)

        @staticmethod
        def backward(ctx, grad):
            pre, theta = ctx.saved_tensors
            bw = ctx.bandwidth
            g_pre = grad * (pre > theta)
            kern = ((pre - theta).abs() < 0.5 * bw).to(grad.dtype) / bw
            g_theta = -(theta * kern * grad).sum(0)
            return g_pre, g_theta, None

    return JumpReLU.apply


def _encode(x, params, encoder, topk, jump):
    import torch

    pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
    if encoder == "relu":
        return torch.relu(pre)
    if encoder == "jumprelu":
        return jump(pre, torch.exp(params["log_threshold"]), params["bandwidth"])
    f = torch.relu(pre)
    if topk < f.shape[1]:
        vals, idx = torch.topk(f, topk, dim=1)
        f = torch.zeros_like(f).scatter_(1, idx, vals)
    return f


def encoder_codes(X, encoder: str, encoder_params: dict, bias, *, batch_size: int = 8192) -> sp.csr_array:
    """Codes of an SAELens-layout encoder on ``X`` (float64, sparse): ``f = sigma((x - b_dec) W_enc + b_enc)``.

    ``encoder`` is ``"relu"``, ``"jumprelu"`` (needs ``threshold``) or ``"topk"`` (needs ``k``).
    """
    X = check_data(X)
    N, n = X.shape
    b = check_vector(bias, n, "bias")
    We = np.asarray(encoder_params["W_enc"], dtype=np.float64)
    be = np.asarray(encoder_params["b_enc"], dtype=np.float64)
    blocks = []
    for s in range(0, N, batch_size):
        pre = (np.asarray(X[s : s + batch_size], dtype=np.float64) - b) @ We + be
        if encoder == "relu":
            f = np.maximum(pre, 0.0)
        elif encoder == "jumprelu":
            f = np.where(pre > encoder_params["threshold"], pre, 0.0)
        elif encoder == "topk":
            f = np.maximum(pre, 0.0)
            kk = int(encoder_params["k"])
            if kk < f.shape[1]:
                cut = np.argpartition(-f, kk - 1, axis=1)[:, kk:]
                np.put_along_axis(f, cut, 0.0, axis=1)
        else:
            raise ValueError(f"encoder must be one of relu, jumprelu, topk, got {encoder!r}")
        blocks.append(sp.csr_array(f))
    return sp.csr_array(sp.vstack(blocks, format="csr"))


# ======================================================================================
# end of the SAE encoders
# ======================================================================================


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
    jump = _jumprelu_fn()
    optim = torch.optim.Adam(train, lr=opts["lr"])
    bs = min(int(opts["batch_size"] or 4096), N)
    rng = np.random.default_rng(opts["seed"])
    step = 0
    reason = "max_steps"
    batches = _minibatches(N, bs, rng)
    while step < opts["max_steps"]:
        step += 1
        idx = next(batches)
        xb = Xd[torch.as_tensor(idx, device=dev)] if Xd is not None else torch.as_tensor(
            np.asarray(X[idx], dtype=np.float64), dtype=cdt, device=dev)
        f = _encode(xb, params, encoder, topk, jump)
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
