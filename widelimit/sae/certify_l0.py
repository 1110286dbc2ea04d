r"""The certification of an SAE against its own sparsity alone (no L1 objective, no ``lam``): theory.md §9.

:func:`certify_l0` is what :func:`widelimit.sae.certify.certify_sae` runs for an L0-trained SAE (TopK,
BatchTopK, JumpReLU, Matryoshka) unless an L1 stand-in is asked for, and for ``objective="l0"``: one pass
over the tokens with the SAE's encoder, the reconstruction metrics (:mod:`widelimit.sae.metrics`), the
firing statistics and decoder-pair flags (dead, dense, antipodal, absorbed-looking) and the bracket at the
SAE's L0 (:class:`widelimit.sae.sparsity.SparsityPart`). The L1 fields of the certificate (objective,
gaps, wide-limit bound, first-order conditions) are ``None``: they assume an objective the SAE does not
have.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from ..engine import engine_for
from ..engine.local import Progress
from . import _kernels
from ._util import pair_candidates
from .metrics import DEFINITIONS, ReconstructionStats
from .sparsity import SparsityOptions, SparsityPart

__all__ = ["certify_l0"]


class _Setup(SimpleNamespace):
    """What :class:`SparsityPart` reads of a setup (``sae``, ``U``, ``b``, ``dev``, ``k``)."""


def _pass(acts, setup, part, flags, batch_size, progress):
    """One pass: metrics, firing counts, co-firing of candidate pairs, the sparsity part."""
    import torch

    sae, dev, k = setup.sae, setup.dev, setup.k
    nt = torch.as_tensor(setup.norms, device=dev)
    stats = ReconstructionStats(k)
    count = torch.zeros(k, dtype=torch.float64, device=dev)
    qa, qb = (torch.as_tensor(q, device=dev) for q in flags["absorb_pairs"])
    co = torch.zeros(qa.numel(), dtype=torch.float64, device=dev)
    N = int(acts.shape[0])
    for s, raw in engine_for(acts).batches(batch_size, name="activations"):
        Xb = sae.preprocess(np.asarray(raw, dtype=np.float64))
        x = torch.as_tensor(Xb, device=dev)
        f = sae.encode(x, device=dev)
        rows, cols = torch.nonzero(f, as_tuple=True)
        fv = f[rows, cols]
        zv = fv * nt[cols]
        Y0 = sp.csr_array((zv.cpu().numpy(), (rows.cpu().numpy(), cols.cpu().numpy())), shape=(Xb.shape[0], k))
        _, tok = _kernels.residuals(Xb, setup.b, setup.U, Y0)
        tok = torch.as_tensor(tok, device=dev)
        stats.update(x.sum(0), tok, cols, fv, x=x)
        count += torch.bincount(cols, minlength=k).to(torch.float64)
        if qa.numel():
            act = f > 0
            co += (act[:, qa] & act[:, qb]).sum(0).to(torch.float64)
        if part is not None:
            part.update(SimpleNamespace(xt=x - torch.as_tensor(setup.b, device=dev), Y0=Y0, m=Xb.shape[0],
                                        rows=rows, cols=cols, zv=zv, tok=tok))
        if progress is not None:
            e = s + raw.shape[0]
            progress(Progress(stage="certify", pass_index=1, rows_done=e, rows_total=N, done=e >= N))
    return stats.result(), count.cpu().numpy(), co.cpu().numpy()


def _flags(U, count, co, N, opts, pairs):
    """Per-feature table (frequency, dead, dense, antipodal partner, absorbed into) and the pair lists."""
    pa, pb, pc = pairs
    freq = count / N
    k = U.shape[0]
    feats = {"feature": np.arange(k), "frequency": freq, "dead": freq <= opts["dead_threshold"],
             "dense": freq >= opts["dense_threshold"], "antipodal_partner": np.full(k, -1),
             "absorbed_into": np.full(k, -1)}
    antipodal = []
    for a, b, c in zip(pa, pb, pc):
        if c <= opts["antipodal_cosine"] and a < b:
            antipodal.append({"features": [int(a), int(b)], "cosine": float(c)})
            feats["antipodal_partner"][a], feats["antipodal_partner"][b] = b, a
    antipodal.sort(key=lambda d: d["cosine"])
    absorbed, best = [], {}
    A, B = opts["absorb_pairs"]
    Cs = pc[pc >= opts["absorb_cosine"]]
    for a, b, c, n_ab in zip(A, B, Cs, co):
        if count[a] > 0 and count[b] > count[a] and n_ab >= opts["containment"] * count[a]:
            frac = n_ab / count[a]
            if a not in best or (frac, c) > (best[a][1], best[a][2]):
                best[a] = (int(b), float(frac), float(c))
    for a, (b, frac, c) in sorted(best.items()):
        absorbed.append({"feature": int(a), "contained_in": b, "containment": frac, "cosine": c,
                         "frequency": float(freq[a]), "partner_frequency": float(freq[b])})
        feats["absorbed_into"][a] = b
    return feats, antipodal, absorbed


def certify_l0(cls, acts, sae, choice, *, dev, sparsity: SparsityOptions, batch_size: int, progress, notes: list,
               n_total: int, flags: dict):
    """The :class:`~widelimit.sae.certify.SAECertificate` (``cls``) of the L0 objective alone (module docstring).

    ``flags``: ``dead_threshold``, ``dense_threshold``, ``antipodal_cosine``, ``absorb_cosine``, ``containment``,
    ``max_pairs`` as :func:`widelimit.sae.certify.certify_sae` takes them.
    """
    t0 = time.perf_counter()
    U, b, norms = sae.unit_dictionary(), np.asarray(sae.b_dec, dtype=np.float64), sae.decoder_norms()
    setup = _Setup(sae=sae, U=U, b=b, norms=norms, dev=dev, k=U.shape[0])
    pairs = pair_candidates(U, flags["antipodal_cosine"], flags["absorb_cosine"], flags["max_pairs"], dev)
    m = pairs[2] >= flags["absorb_cosine"]
    opts = dict(flags, absorb_pairs=(pairs[0][m], pairs[1][m]))
    part = SparsityPart(setup, sparsity) if sparsity.enabled and sae.has_encoder else None
    stats, count, co = _pass(acts, setup, part, opts, batch_size, progress)
    N = int(acts.shape[0])
    feats, antipodal, absorbed = _flags(U, count, co, N, opts, pairs)
    feats["decoder_norm"] = norms
    metrics = {**stats, "dead_features": int(feats["dead"].sum()), "dense_features": int(feats["dense"].sum()),
               "antipodal_pairs": len(antipodal), "absorbed_looking": len(absorbed), "definitions": dict(DEFINITIONS)}
    spx = part.result() if part is not None else None
    if spx is not None and spx["batches_stopped_by_time"]:
        notes.append(f"the pursuit stopped at its time budget on {spx['batches_stopped_by_time']} batches "
                     "(default: what the rest of the pass took); a larger pursuit time may find better codes")
    nan = float("nan")
    return cls(
        sae_objective=None, reconstruction=stats.get("mse", nan), penalty=None, optimal_code_objective=None,
        coding_gap=None, coding_max_gap=None, coding_converged=None, lower_bound=None, lower_bound_at_bias=None,
        huber_median_gap=None, encoder_gap=None, decoder_gap_at_bias=None, bias_gap=None, global_gap=None,
        certified_optimal=None, tol=None, lam=None, n_tokens=N, d_in=U.shape[1], d_sae=U.shape[0],
        bias_stationarity=None, max_residual_norm=None, bias_distance=None, metrics=metrics, features=feats,
        violations=[], antipodal_pairs=antipodal, absorbed=absorbed, sae_info=sae.summary(), optimal_bias=None,
        seconds=time.perf_counter() - t0, device=str(dev), notes=notes, objective=choice.as_dict(),
        n_tokens_total=n_total, sparsity=spx)
