"""A training-loop callback: certify an SAE every so many steps on a fixed token sample and log the flat metrics."""

from __future__ import annotations

import numpy as np

from .certify import certify_sae, sample_rows
from .report import flat_dict

__all__ = ["CertifyCallback"]


class CertifyCallback:
    """Certify an SAE every ``every`` steps of a training loop and hand the flat metrics to a logger.

    Parameters
    ----------
    acts : array-like (N, d_in)
        Held-out activations.
    every : int
        Certify when ``step % every == 0``.
    log : callable(dict, step), optional
        Receives :func:`flat_dict` (keys prefixed ``prefix``), e.g.
        ``lambda d, s: wandb.log(d, step=s)``. The results are kept in :attr:`history` too.
    max_tokens : int
        Fast mode: a fixed random sample of this many tokens (drawn once, ``seed``),
        and no optimal-code atom diagnostics.
    lam, l1_coefficient, architecture, device, prefix :
        As for :func:`widelimit.certify_sae`; ``prefix`` defaults to ``"certify/"``.

    Call it as ``cb(step, sae)`` with any SAE :func:`widelimit.certify_sae` accepts
    (a ``sae_lens.SAE`` in training too).
    """

    def __init__(self, acts, *, every: int = 1000, log=None, max_tokens: int = 2048, lam=None,
                 l1_coefficient=None, architecture=None, device="cpu", prefix: str = "certify/", seed: int = 0):
        if int(every) < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.log, self.prefix = int(every), log, prefix
        self.acts = np.asarray(sample_rows(acts, max_tokens, seed))
        self.kw = {"lam": lam, "l1_coefficient": l1_coefficient, "architecture": architecture, "device": device}
        self.history: list[tuple[int, dict]] = []

    def __call__(self, step: int, sae):
        if step % self.every:
            return None
        cert = certify_sae(self.acts, sae, optimal_codes_diagnostics=False, **self.kw)
        d = flat_dict(cert, prefix=self.prefix)
        self.history.append((int(step), d))
        if self.log is not None:
            self.log(d, step)
        return cert
