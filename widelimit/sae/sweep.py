r"""Several SAEs on the same activations: one table and an MSE-L0 plot (a sweep over k, lam, width, checkpoints).

Each SAE is a point ``(L0, MSE)`` of its own encoder, as in SAEBench's frontier plots (MSE against L0,
one marker per architecture), and next to it the curve of its **decoder's** best codes found at several
sparsities (:func:`decoder_frontier`: the witness MSE of :func:`widelimit.coding.pursuit.sparse_codes` at
budgets around the SAE's L0, warm-started at the SAE's own budget from its codes), so that the distance
from a point to its own curve is what that SAE's encoder leaves on the table (theory.md §10), and the
curves of different SAEs compare their dictionaries at equal sparsity.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..coding.pursuit import PursuitOptions, sparse_codes

__all__ = ["decoder_frontier", "sweep_row", "plot_sweep", "SWEEP_COLUMNS"]

#: Columns of the sweep table (``sweep.csv``) and the keys of :func:`sweep_row`.
SWEEP_COLUMNS = ("sae", "architecture", "d_sae", "l0", "mse", "explained_variance", "mse_at_l0_found",
                 "mse_at_l0_lower_bound", "gain_at_l0", "gain_at_l0_upper", "encoder_gap_l1")


def decoder_frontier(X, sae, *, fractions=(0.25, 0.5, 1.0, 2.0, 4.0), max_iter: int = 2, time_limit=None,
                     device="cpu") -> list[dict]:
    """The decoder's best codes found at budgets ``max(1, round(f * L0))`` for ``f`` in ``fractions``.

    ``X``: preprocessed tokens (float64); ``L0`` is the SAE's mean L0 on them. Returns one dict per budget:
    ``budget``, ``value`` (witness MSE), ``lower_bound``, ``l0`` (mean L0 of the witness, at most ``budget``).
    """
    X = np.asarray(X, dtype=np.float64)
    f = sae.encode(X)
    own = float((f != 0).sum(1).mean())
    budgets = sorted({max(1, int(round(fr * own))) for fr in fractions} | ({int(sae.k)} if sae.k else set()))
    out = []
    for s in budgets:
        if s > sae.d_sae:
            continue
        Z0 = sp.csr_array(f) if (f != 0).sum(1).max(initial=0) <= s else None
        r = sparse_codes(X, sae.W_dec, sae.b_dec, budget=s, Z0=Z0, opts=PursuitOptions(max_iter=max_iter),
                         time_limit=time_limit, device=device)
        out.append({"budget": s, "value": r.value, "lower_bound": r.lower_bound, "l0": r.l0})
    return out


def sweep_row(name: str, cert) -> dict:
    """One row of the sweep table from a :class:`widelimit.sae.certify.SAECertificate`."""
    m, spx = cert.metrics, (getattr(cert, "sparsity", None) or {})
    l1 = cert.encoder_gap if (cert.objective or {}).get("stand_in") is False else None
    return {"sae": name, "architecture": cert.sae_info.get("architecture"), "d_sae": cert.d_sae, "l0": m.get("l0"),
            "mse": m.get("mse"), "explained_variance": m.get("explained_variance"),
            "mse_at_l0_found": spx.get("value"), "mse_at_l0_lower_bound": spx.get("lower_bound"),
            "gain_at_l0": spx.get("gain"), "gain_at_l0_upper": spx.get("gain_upper"), "encoder_gap_l1": l1}


def plot_sweep(rows: list[dict], curves: list[list[dict]], path) -> Path:
    """MSE against L0 (SAEBench's frontier-plot layout): each SAE a marker (one per architecture), its decoder's
    best codes found at several sparsities a dashed line of the same colour, the proven lower bounds as a
    shaded band where one is nonzero."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.6))
    ax = fig.subplots()
    markers = {"topk": "o", "batchtopk": "s", "jumprelu": "^", "matryoshka": "D", "standard": "v", "gated": "P"}
    for i, (row, curve) in enumerate(zip(rows, curves)):
        color = f"C{i % 10}"
        if curve:
            xs = [c["l0"] for c in curve]
            ax.plot(xs, [c["value"] for c in curve], ls="--", color=color, lw=1)
            lb = [c["lower_bound"] for c in curve]
            if any(v > 0 for v in lb):
                ax.fill_between(xs, lb, [c["value"] for c in curve], color=color, alpha=0.12, lw=0)
        if row.get("l0") is not None and row.get("mse") is not None:
            ax.scatter([row["l0"]], [row["mse"]], marker=markers.get(row["architecture"], "o"), color=color, s=40,
                       label=f"{row['sae']} ({row['architecture']}, d_sae {row['d_sae']})", zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("L0 (mean active features per token)")
    ax.set_ylabel("MSE (mean ||x - x_hat||^2)")
    ax.set_title("SAEs (markers) and their decoders' best codes found (dashed) at each sparsity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path

