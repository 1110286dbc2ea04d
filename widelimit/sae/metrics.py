r"""Reconstruction metrics of an SAE, accumulated over token batches, under SAELens / SAEBench names.

With ``x`` the (preprocessed) token, ``x_hat = f W_dec + b_dec`` its reconstruction
and ``f`` the codes (definitions as in ``sae_lens.evals``; means over tokens):

=============================  =============================================================
``mse``                        ``mean ||x - x_hat||^2`` (summed over dimensions)
``explained_variance``         ``1 - mean ||x - x_hat||^2 / (mean ||x||^2 - ||mean x||^2)``
``explained_variance_legacy``  SAELens's former formula: mean over tokens of ``1 - ||x - x_hat||^2 / ||x - mean x||^2``
                               with ``mean x`` over the batch (SAELens: its eval batch; here the certification
                               batch), tokens at the batch mean left out
``cossim``                     ``mean cos(x, x_hat)`` (0 for a zero vector)
``l2_ratio``                   ``mean ||x_hat|| / ||x||`` (``||x|| < 1e-4`` divides by 1)
``relative_reconstruction_bias`` ``mean ||x_hat||^2 / mean <x, x_hat>`` (Gao et al. 2024, eq. 10)
``l0``                         ``mean #{d : f_d != 0}``
``l1``                         ``mean sum_d |f_d|``
``frac_alive``                 fraction of features that fire on at least one token
=============================  =============================================================

``sae_lens.evals`` computes ``relative_reconstruction_bias`` per eval batch and
averages the batch ratios; here it is the ratio of the means over all tokens
(the two coincide on one batch; tests/sae/test_libraries.py runs SAELens' own code
for the comparison). The other metrics are token means in both.

The same numbers for the optimal codes of the SAE's decoder and bias
(``optimal_mse``, ``optimal_l0``) compare the decoder at equal sparsity.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ReconstructionStats", "DEFINITIONS"]

DEFINITIONS = {
    "mse": "mean over tokens of sum over dims of (x - x_hat)^2",
    "explained_variance": "1 - E||x - x_hat||^2 / (E||x||^2 - ||E x||^2)",
    "explained_variance_legacy": "mean over tokens of 1 - ||x - x_hat||^2 / ||x - mean_batch x||^2 (SAELens, old)",
    "cossim": "mean over tokens of cos(x, x_hat)",
    "l2_ratio": "mean over tokens of ||x_hat|| / ||x||",
    "relative_reconstruction_bias": "E||x_hat||^2 / E<x, x_hat> (1 = unbiased scale)",
    "l0": "mean over tokens of the number of features with f != 0",
    "l1": "mean over tokens of sum_d |f_d| (the SAE's own activations)",
    "l1_unit": "mean over tokens of sum_d f_d ||W_dec,d|| (the penalised L1)",
    "frac_alive": "fraction of features firing on at least one token",
    "optimal_mse": "mse of the optimal codes for the SAE's decoder and bias at the certified lam",
    "optimal_l0": "l0 of those optimal codes",
}


class ReconstructionStats:
    """Running sums for the metrics of the module docstring (torch float64 tensors in, floats out)."""

    def __init__(self, d_sae: int):
        self.n = 0
        self.sum_x = None
        self.sum_x2 = self.rss = self.cos = self.ratio = self.xhat2 = self.dot = self.l0 = self.l1 = 0.0
        self.fired = np.zeros(d_sae, dtype=bool)
        self.opt_n = 0
        self.opt_rss = 0.0
        self.opt_l0 = 0.0
        self.opt_l0_known = True
        self.ev_legacy = 0.0
        self.ev_legacy_n = 0

    def update(self, sum_x, tok, cols, fv, x=None) -> None:
        """Add a batch from its sums: ``sum_x`` (sum of the tokens), ``tok`` (m, 5) per token
        ``||x||^2, ||x_hat||^2, <x, x_hat>, ||x - x_hat||^2, .`` and the codes' nonzeros
        (feature ids ``cols``, values ``fv``); torch tensors on one device. With the tokens ``x``
        themselves also ``explained_variance_legacy``'s per-token terms."""
        import torch

        if x is not None:
            dev = ((x - x.mean(0)) ** 2).sum(1)
            ok = dev > 0
            self.ev_legacy += float((1.0 - tok[:, 3][ok] / dev[ok]).sum())
            self.ev_legacy_n += int(ok.sum())

        self.n += int(tok.shape[0])
        s = sum_x.double().cpu().numpy()
        self.sum_x = s if self.sum_x is None else self.sum_x + s
        xx, hh, dot = tok[:, 0], tok[:, 1], tok[:, 2]
        self.sum_x2 += float(xx.sum())
        self.rss += float(tok[:, 3].sum())
        nx, nh = torch.sqrt(xx), torch.sqrt(hh)
        ok = (nx > 0) & (nh > 0)
        self.cos += float(torch.where(ok, dot / torch.where(ok, nx * nh, torch.ones_like(nx)), 0.0).sum())
        self.ratio += float((nh / torch.where(nx.abs() < 1e-4, torch.ones_like(nx), nx)).sum())
        self.xhat2 += float(hh.sum())
        self.dot += float(dot.sum())
        self.l0 += float(cols.numel())
        self.l1 += float(fv.abs().sum())
        self.fired[cols.cpu().numpy()] = True

    def update_optimal(self, n_tokens: int, reconstruction: float, nnz: int | None = None) -> None:
        """Add a batch of optimal codes: its mean reconstruction error and (optionally) their number of nonzeros."""
        self.opt_n += int(n_tokens)
        self.opt_rss += float(reconstruction) * n_tokens
        if nnz is None:
            self.opt_l0_known = False
        else:
            self.opt_l0 += float(nnz)

    def merge(self, other: "ReconstructionStats") -> "ReconstructionStats":
        """Add the sums of another row range (in place; associative, for Dask blocks)."""
        self.n += other.n
        if other.sum_x is not None:
            self.sum_x = other.sum_x.copy() if self.sum_x is None else self.sum_x + other.sum_x
        for a in ("sum_x2", "rss", "cos", "ratio", "xhat2", "dot", "l0", "l1", "opt_n", "opt_rss", "opt_l0", "ev_legacy",
                  "ev_legacy_n"):
            setattr(self, a, getattr(self, a) + getattr(other, a))
        self.fired |= other.fired
        self.opt_l0_known = self.opt_l0_known and other.opt_l0_known
        return self

    def result(self) -> dict:
        """The metrics (``None`` where undefined)."""
        out = {}
        if self.n:
            N = self.n
            mean_x = self.sum_x / N
            var = self.sum_x2 / N - float(mean_x @ mean_x)
            out.update(mse=self.rss / N, explained_variance=(1.0 - self.rss / N / var) if var > 0 else None,
                       cossim=self.cos / N, l2_ratio=self.ratio / N,
                       relative_reconstruction_bias=self.xhat2 / self.dot if self.dot != 0 else None,
                       l0=self.l0 / N, l1=self.l1 / N, frac_alive=float(self.fired.mean()),
                       explained_variance_legacy=self.ev_legacy / self.ev_legacy_n if self.ev_legacy_n else None)
        if self.opt_n:
            out["optimal_mse"] = self.opt_rss / self.opt_n
            out["optimal_l0"] = self.opt_l0 / self.opt_n if self.opt_l0_known else None
        return out
