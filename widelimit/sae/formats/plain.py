"""Plain ``.npz`` / ``.safetensors`` / ``.pt`` files with ``W_dec``, ``b_dec`` (+ ``W_enc``, ``b_enc``, ...).

Without an encoder the SAE is ``decoder_only``. With one, the architecture is
what the file says (a string entry ``architecture`` in a ``.npz``, the
``architecture`` metadata key of a ``.safetensors``), else what the tensors that
name it say (``threshold``: jumprelu, ``k``: topk), else what the caller names;
a bare ``W_enc`` / ``b_enc`` pair is refused without one (a ReLU and a TopK
encoder store the same tensors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..model import SAE, SAEFormatError
from ._io import check_regular, check_unused, get_tensor, read_pt, read_safetensors, tensor_int


def load_plain(p: Path, *, architecture: str | None = None) -> SAE:
    """Read a plain weights file; errors name the file and tensor."""
    ext = p.suffix.lower()
    stated = None
    if ext == ".npz":
        check_regular(p)
        try:
            with np.load(p, allow_pickle=False) as z:
                sd = {k: z[k] for k in z.files}
            if "architecture" in sd:
                a = sd.pop("architecture")
                if a.dtype.kind != "U" or a.size != 1:
                    raise SAEFormatError(f"{p}: entry 'architecture' must be one string, got {a.dtype} {a.shape}")
                stated = str(a.reshape(()))
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SAEFormatError(f"{p}: not a readable .npz file ({msg})") from None
    elif ext == ".safetensors":
        sd = read_safetensors(p)
        from safetensors import safe_open

        with safe_open(str(p), "pt") as fh:
            stated = (fh.metadata() or {}).get("architecture")
    else:
        sd = read_pt(p)
    W_dec = get_tensor(sd, "W_dec", p, "the decoder (d_sae, d_in)")
    b_dec = get_tensor(sd, "b_dec", p, "the decoder bias (d_in,)")
    has_enc = "W_enc" in sd
    if has_enc and "b_enc" not in sd:
        raise SAEFormatError(f"{p}: has 'W_enc' but no 'b_enc'")
    kw = {"W_dec": W_dec, "b_dec": b_dec}
    k, warnings = None, []
    if not has_enc:
        arch = "decoder_only"
        if stated not in (None, "decoder_only"):
            raise SAEFormatError(f"{p}: the file says architecture {stated!r} but has no tensor 'W_enc'")
        if architecture not in (None, "decoder_only"):
            raise SAEFormatError(f"{p}: no tensor 'W_enc', so no {architecture!r} encoder")
    else:
        kw.update(W_enc=sd["W_enc"], b_enc=sd["b_enc"])
        told = stated or ("jumprelu" if "threshold" in sd else "topk" if "k" in sd else None)
        if stated is not None and architecture is not None and stated != architecture:
            raise SAEFormatError(f"{p}: the file says architecture {stated!r} but {architecture!r} was asked for")
        if architecture is None and told is None:
            raise SAEFormatError(f"{p}: the file has an encoder (W_enc, b_enc) but nothing names its activation "
                                 "(no 'threshold', no 'k'); name the architecture (standard, topk, ...)")
        arch = architecture or told
        if told is not None and architecture is None and stated is None:
            warnings.append(f"architecture {told} read from tensor {'threshold' if told == 'jumprelu' else 'k'!r}")
        if "threshold" in sd:
            if arch not in ("jumprelu", "batchtopk", "matryoshka"):
                raise SAEFormatError(f"{p}: tensor 'threshold' present but architecture {arch!r} was asked for")
            kw["threshold"] = sd["threshold"]
        if "k" in sd:
            k = tensor_int(sd, "k", p)
    apply = True
    if "apply_b_dec_to_input" in sd:
        v = sd["apply_b_dec_to_input"]
        a = np.asarray(v.detach().cpu() if hasattr(v, "detach") else v)
        if a.size != 1 or a.reshape(()).item() not in (0, 1):
            raise SAEFormatError(f"{p}: tensor 'apply_b_dec_to_input' must hold one flag (0/1 or a bool)")
        apply = bool(a.reshape(()).item())
    read = {"W_dec", "b_dec", "apply_b_dec_to_input"} | ({"W_enc", "b_enc", "threshold", "k"} if has_enc else set())
    check_unused(sd, read, p, arch, warnings)
    return SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=apply, source_format="plain", path=str(p),
               dtype=str(getattr(W_dec, "dtype", "float32")).replace("torch.", ""), warnings=warnings)
