"""Trained SAEs from files and objects of every supported library: :func:`load_sae`, :func:`from_object`.

Layouts (detected from the files present; nothing is unpickled):

* **SAELens** folder: ``cfg.json`` + ``sae_weights.safetensors`` (:mod:`.saelens`);
* **dictionary_learning**: ``ae.pt`` + ``config.json`` (:mod:`.dictionary_learning`);
* **sparsify** folder: ``cfg.json`` + ``sae.safetensors`` (:mod:`.sparsify`);
* a plain ``.npz`` / ``.safetensors`` / ``.pt`` file (:mod:`.plain`).

A weights file is read together with the config beside it: ``folder/sae_weights.safetensors``
is the SAELens folder, ``folder/sae.safetensors`` the sparsify folder,
``folder/ae.pt`` the dictionary_learning pair. The architecture is never
guessed: a config that does not name it is refused unless ``architecture=`` does.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..._params import POSITIVE, PathLike, StrOptions, validate_params
from ..model import ARCHITECTURES
from ..model import SAE, SAEFormatError
from .dictionary_learning import load_dictionary_learning
from .objects import from_object
from .plain import load_plain
from .saelens import load_saelens, save_saelens
from .sparsify import load_sparsify

__all__ = ["load_sae", "from_object", "as_sae", "save_saelens"]


@validate_params({"path": PathLike(), "architecture": [StrOptions(ARCHITECTURES), None], "norm_scaling_factor": [POSITIVE, None]})
def load_sae(path, *, architecture: str | None = None, norm_scaling_factor: float | None = None) -> SAE:
    """Load a trained SAE from any supported layout (detected from the files present).

    Parameters
    ----------
    path : str or Path
        A folder (SAELens: ``cfg.json`` + ``sae_weights.safetensors``; sparsify:
        ``cfg.json`` + ``sae.safetensors``; dictionary_learning: ``ae.pt`` +
        ``config.json``), one of those weight files (read with the config beside
        it), or a plain ``.npz`` / ``.safetensors`` / ``.pt`` file with ``W_dec``,
        ``b_dec`` (+ optional ``W_enc``, ``b_enc``, ``threshold`` or ``k``).
    architecture : str, optional
        The encoder, when the files do not name it (a config without
        ``architecture``, a plain file with a bare ``W_enc``); checked against the
        files when they do.
    norm_scaling_factor : float, optional
        For SAELens ``normalize_activations="expected_average_only_in"``: the
        factor the inputs were multiplied by in training, folded into the weights.

    Returns
    -------
    SAE

    Raises
    ------
    SAEFormatError
        (a ``ValueError``) one line naming the file and the tensor or config field
        for anything missing, mistyped, mis-shaped, unreadable or unsupported.
    """
    if norm_scaling_factor is not None:
        try:
            ok = math.isfinite(float(norm_scaling_factor)) and float(norm_scaling_factor) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"norm_scaling_factor must be a finite number > 0, got {norm_scaling_factor!r}")
    p = Path(path)
    if not p.exists():
        raise SAEFormatError(f"{p}: no such file or folder")
    if not p.is_dir():
        sib = p.parent
        if p.name == "sae_weights.safetensors" and (sib / "cfg.json").exists():
            p = sib
        elif p.name == "sae.safetensors" and (sib / "cfg.json").exists():
            p = sib
        elif p.name == "cfg.json" and ((sib / "sae_weights.safetensors").exists() or (sib / "sae.safetensors").exists()):
            p = sib
    if p.is_dir():
        if (p / "sae_weights.safetensors").exists():
            if not (p / "cfg.json").exists():
                raise SAEFormatError(f"{p}: has sae_weights.safetensors but no cfg.json (SAELens layout needs both)")
            return load_saelens(p, architecture=architecture, norm_scaling_factor=norm_scaling_factor)
        if (p / "sae.safetensors").exists():
            if not (p / "cfg.json").exists():
                raise SAEFormatError(f"{p}: has sae.safetensors but no cfg.json (sparsify layout needs both)")
            return load_sparsify(p, architecture=architecture)
        if (p / "ae.pt").exists():
            return load_dictionary_learning(p / "ae.pt", p / "config.json", architecture=architecture)
        raise SAEFormatError(
            f"{p}: no SAE found (expected cfg.json + sae_weights.safetensors [SAELens], cfg.json + sae.safetensors "
            "[sparsify] or ae.pt + config.json [dictionary_learning])"
        )
    if norm_scaling_factor is not None:
        raise SAEFormatError(f"{p}: norm_scaling_factor applies to SAELens folders only")
    ext = p.suffix.lower()
    if p.name == "ae.pt" or (ext in (".pt", ".pth") and (p.parent / "config.json").exists()):
        return load_dictionary_learning(p, p.parent / "config.json", architecture=architecture)
    if ext in (".npz", ".safetensors", ".pt", ".pth"):
        return load_plain(p, architecture=architecture)
    raise SAEFormatError(f"{p}: unsupported SAE file type {ext!r} (give a folder, ae.pt, .npz, .safetensors or .pt)")


_SAE_FILES = ("sae_weights.safetensors", "sae.safetensors", "ae.pt")


def looks_like_sae(path) -> bool:
    """Whether ``path`` holds an SAE rather than activations (reads only names: no array is loaded).

    A folder with ``sae_weights.safetensors``, ``sae.safetensors`` or ``ae.pt``; one of those files, or the
    ``cfg.json`` beside them; an ``.npz`` / ``.safetensors`` file with a ``W_dec`` array. The command line
    uses it to name the order of its arguments when an SAE is given where the activations go."""
    p = Path(path)
    try:
        if p.is_dir():
            return any((p / f).exists() for f in _SAE_FILES)
        if p.name in _SAE_FILES or (p.name == "cfg.json" and any((p.parent / f).exists() for f in _SAE_FILES)):
            return True
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return "W_dec" in z.files
        if p.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(p), framework="numpy") as f:
                return "W_dec" in f.keys()
    except (OSError, ValueError, RuntimeError):
        return False
    return False


def as_sae(sae, *, architecture: str | None = None, norm_scaling_factor: float | None = None) -> SAE:
    """An :class:`SAE` from a path (:func:`load_sae`), an SAE object of a library (:func:`from_object`) or an SAE."""
    if isinstance(sae, SAE):
        return sae
    if isinstance(sae, (str, Path)):
        return load_sae(sae, architecture=architecture, norm_scaling_factor=norm_scaling_factor)
    return from_object(sae, architecture=architecture, norm_scaling_factor=norm_scaling_factor)
