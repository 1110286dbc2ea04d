r"""Trained sparse autoencoders: one object for every supported file layout.

An :class:`SAE` holds the weights in SAELens' layout (``W_enc`` ``(d_in, d_sae)``,
``b_enc`` ``(d_sae,)``, ``W_dec`` ``(d_sae, d_in)`` rows = atoms, ``b_dec``
``(d_in,)``) plus the settings that change what the encoder computes. Its
:meth:`SAE.encode` reproduces each library's encoder, and :meth:`SAE.decode`
is always ``f @ W_dec + b_dec``, so the SAE objective of theory.md §1 is

.. math:: L = \frac1N\sum_i \|x_i - f_i W_{dec} - b_{dec}\|^2 + 2\lambda\sum_d f_{id}\,\|W_{dec,d}\|,

the loss SAELens (v6) and dictionary_learning minimise with
``l1_coefficient = 2 lam`` (atoms of non-unit norm are read as unit atoms with
codes ``f_d ||W_dec,d||``; the reconstruction is unchanged).

Encoders (``x_in = x - b_dec`` when ``apply_b_dec_to_input`` else ``x``,
``p = x_in @ W_enc + b_enc``):

============  ======================================================================
standard      ``f = relu(p)``
jumprelu      ``f = relu(p) * (p > threshold)``
topk          the ``k`` largest entries of ``p`` (of ``p * ||W_dec,d||`` when
              ``rescale_acts_by_decoder_norm``), ReLU'd, others 0; with
              ``rescale_acts_by_decoder_norm`` the decoder reads ``f_d / ||W_dec,d||``,
              which is stored here as the code so that decode stays ``f @ W_dec + b_dec``
gated         ``f = 1[x_in W_enc + b_gate > 0] * relu(x_in (W_enc * exp(r_mag)) + b_mag)``
decoder_only  no encoder (plain ``W_dec`` / ``b_dec`` files): only optimal codes exist
============  ======================================================================

Supported layouts, read by :func:`load_sae` (never unpickling anything):

* **SAELens** folder: ``cfg.json`` + ``sae_weights.safetensors``; v6 configs
  (``architecture``, ``metadata``/``meta``) and the older flat ones
  (``activation_fn_str``/``activation_fn_kwargs``, boolean
  ``normalize_activations``, a ``scaling_factor`` tensor when
  ``finetuning_scaling_factor``). Architectures standard, jumprelu, topk, gated.
* **dictionary_learning** folder or file: ``ae.pt`` (``torch.load(weights_only=True)``)
  + ``config.json`` (``trainer.dict_class`` AutoEncoder, JumpReluAutoEncoder,
  AutoEncoderTopK, GatedAutoEncoder).
* **sparsify** folder: ``cfg.json`` + ``sae.safetensors`` (TopK; the encoder always
  subtracts ``b_dec``).
* a plain ``.npz`` / ``.safetensors`` / ``.pt`` file with ``W_dec``, ``b_dec`` and
  optionally ``W_enc``, ``b_enc`` (and ``threshold`` or ``k``).

Settings that change the computation and how they are handled:

* ``apply_b_dec_to_input``: honoured (subtract ``b_dec`` before encoding).
* ``normalize_activations``: ``"none"``; ``"constant_norm_rescale"`` and
  ``"layer_norm"`` are applied per token by :meth:`SAE.preprocess` and the SAE is
  certified in that normalised space (the space its dictionary lives in);
  ``"expected_average_only_in"`` needs the dataset's norm scaling factor, which the
  files do not store: pass ``norm_scaling_factor=`` to :func:`load_sae` to fold it
  into the weights (as SAELens' ``fold_activation_norm_scaling_factor`` does),
  otherwise loading fails with a message saying so.
* ``finetuning_scaling_factor`` (old SAELens): folded into ``W_dec``.
* ``rescale_acts_by_decoder_norm`` (SAELens TopK): honoured.

Not supported (loading raises :class:`SAEFormatError` naming the setting):
transcoders (``d_out``/``transcode``), sparsify ``skip_connection`` /
``signed`` / ``activation="groupmax"``, BatchTopK's batch-level selection,
``hook_z`` reshaping of 3-D activations (pass flattened ``(N, d_in)`` activations
instead; the SAE itself is unaffected), and any other architecture name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = [
    "SAE",
    "SAEFormatError",
    "ARCHITECTURES",
    "load_sae",
    "save_saelens",
    "save_dictionary_learning",
    "save_sparsify",
    "save_plain",
    "orthogonal_rays_sae",
]

#: Architectures the toolkit can encode with.
ARCHITECTURES = ("standard", "jumprelu", "topk", "gated", "decoder_only")
_NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in")


class SAEFormatError(ValueError):
    """An SAE file is missing, malformed, or uses a setting the toolkit does not support."""


# --------------------------------------------------------------------------------------
# the SAE object
# --------------------------------------------------------------------------------------


def _arr(a, name, where):
    """A float numpy array from a numpy array or torch tensor (bf16/f16 -> float32)."""
    if a is None:
        return None
    if hasattr(a, "detach"):
        t = a.detach().cpu()
        if not t.dtype.is_floating_point:
            raise SAEFormatError(f"{where}: tensor {name!r} has non-float dtype {t.dtype}")
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        a = t.numpy()
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise SAEFormatError(f"{where}: tensor {name!r} has non-float dtype {a.dtype}")
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    return a


@dataclass(eq=False)
class SAE:
    """A trained sparse autoencoder in SAELens' layout, with its encoder settings.

    Attributes
    ----------
    W_dec : ndarray (d_sae, d_in)
        Decoder; row ``d`` is feature ``d``'s atom (any norm).
    b_dec : ndarray (d_in,)
        Decoder bias (theory.md's ``b``).
    W_enc : ndarray (d_in, d_sae) or None
        Encoder weights (``None`` for ``decoder_only``; for ``gated`` the shared gate/magnitude matrix).
    b_enc : ndarray (d_sae,) or None
        Encoder bias (not used by ``gated``).
    architecture : str
        One of :data:`ARCHITECTURES`.
    threshold : ndarray (d_sae,) or None
        JumpReLU thresholds.
    k : int or None
        TopK: number of active features per token.
    b_gate, b_mag, r_mag : ndarray (d_sae,) or None
        Gated SAE parameters.
    apply_b_dec_to_input : bool
        Subtract ``b_dec`` from the input before encoding.
    normalize_activations : str
        ``"none"``, ``"constant_norm_rescale"`` or ``"layer_norm"`` (see :meth:`preprocess`).
    rescale_acts_by_decoder_norm : bool
        SAELens TopK option: rank ``p_d ||W_dec,d||`` (see the module docstring).
    source_format : str
        ``"saelens"``, ``"saelens-legacy"``, ``"dictionary_learning"``, ``"sparsify"``, ``"plain"`` or ``"memory"``.
    path : str or None
        Where it was loaded from.
    dtype : str
        Storage dtype of the weights in the file.
    l1_coefficient : float or None
        The training L1 coefficient if the config records it (``lam = l1_coefficient / 2``).
    config : dict
        The configuration as read.
    warnings : list of str
        Non-fatal findings while loading (e.g. config dtype differs from the tensors).
    """

    W_dec: np.ndarray
    b_dec: np.ndarray
    W_enc: np.ndarray | None = None
    b_enc: np.ndarray | None = None
    architecture: str = "standard"
    threshold: np.ndarray | None = None
    k: int | None = None
    b_gate: np.ndarray | None = None
    b_mag: np.ndarray | None = None
    r_mag: np.ndarray | None = None
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    rescale_acts_by_decoder_norm: bool = False
    source_format: str = "memory"
    path: str | None = None
    dtype: str = "float32"
    l1_coefficient: float | None = None
    config: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def __post_init__(self):
        where = self.path or "SAE"
        for name in ("W_dec", "b_dec", "W_enc", "b_enc", "threshold", "b_gate", "b_mag", "r_mag"):
            setattr(self, name, _arr(getattr(self, name), name, where))
        if self.architecture not in ARCHITECTURES:
            raise SAEFormatError(
                f"{where}: unknown architecture {self.architecture!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        if self.normalize_activations not in _NORMALIZATIONS:
            raise SAEFormatError(
                f"{where}: unknown normalize_activations {self.normalize_activations!r}; "
                f"supported: none, constant_norm_rescale, layer_norm"
            )
        if self.normalize_activations == "expected_average_only_in":
            raise SAEFormatError(
                f"{where}: normalize_activations='expected_average_only_in' needs the dataset norm scaling "
                "factor, which is not stored in the SAE files; load with norm_scaling_factor=... to fold it in"
            )
        if self.W_dec is None or self.W_dec.ndim != 2:
            raise SAEFormatError(f"{where}: tensor 'W_dec' must be 2-D (d_sae, d_in), got {getattr(self.W_dec, 'shape', None)}")
        d_sae, d_in = self.W_dec.shape
        if d_sae == 0 or d_in == 0:
            raise SAEFormatError(f"{where}: tensor 'W_dec' is empty: shape {self.W_dec.shape}")
        expect = {"b_dec": (d_in,), "W_enc": (d_in, d_sae), "b_enc": (d_sae,), "threshold": (d_sae,),
                  "b_gate": (d_sae,), "b_mag": (d_sae,), "r_mag": (d_sae,)}
        for name, shape in expect.items():
            a = getattr(self, name)
            if a is None:
                continue
            if name == "threshold" and a.ndim == 0:  # a scalar threshold for all features
                a = np.full(d_sae, float(a), dtype=a.dtype)
                setattr(self, name, a)
            if a.shape != shape:
                raise SAEFormatError(f"{where}: tensor {name!r} has shape {tuple(a.shape)}, expected {shape} "
                                     f"(d_in={d_in}, d_sae={d_sae} from W_dec)")
        if self.b_dec is None:
            raise SAEFormatError(f"{where}: missing tensor 'b_dec'")
        need = {"standard": ("W_enc", "b_enc"), "jumprelu": ("W_enc", "b_enc", "threshold"),
                "topk": ("W_enc", "b_enc"), "gated": ("W_enc", "b_gate", "b_mag", "r_mag"), "decoder_only": ()}
        for name in need[self.architecture]:
            if getattr(self, name) is None:
                raise SAEFormatError(f"{where}: architecture {self.architecture!r} needs tensor {name!r}, which is missing")
        if self.architecture == "topk":
            if self.k is None:
                raise SAEFormatError(f"{where}: topk architecture needs k")
            k = int(self.k)
            if k != self.k or not 1 <= k <= d_sae:
                raise SAEFormatError(f"{where}: topk k must be an integer in [1, d_sae={d_sae}], got {self.k!r}")
            self.k = k
        for name in ("W_dec", "b_dec", "W_enc", "b_enc", "threshold", "b_gate", "b_mag", "r_mag"):
            a = getattr(self, name)
            if a is not None and not np.isfinite(a).all():
                raise SAEFormatError(f"{where}: tensor {name!r} has non-finite values")
        self._torch_cache = {}

    # ---- shape ----------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        """Input (activation) dimension ``n``."""
        return int(self.W_dec.shape[1])

    @property
    def d_sae(self) -> int:
        """Number of features ``k`` (dictionary width)."""
        return int(self.W_dec.shape[0])

    @property
    def has_encoder(self) -> bool:
        """Whether the SAE has an encoder (everything but ``decoder_only``)."""
        return self.architecture != "decoder_only"

    def decoder_norms(self) -> np.ndarray:
        """``||W_dec,d||`` for every feature (float64)."""
        return np.linalg.norm(np.asarray(self.W_dec, dtype=np.float64), axis=1)

    def unit_dictionary(self) -> np.ndarray:
        """Decoder rows scaled to unit norm (zero rows stay zero): the ``W`` of theory.md §1."""
        W = np.asarray(self.W_dec, dtype=np.float64)
        nrm = np.linalg.norm(W, axis=1)
        out = np.zeros_like(W)
        live = nrm > 0
        out[live] = W[live] / nrm[live, None]
        return out

    # ---- computation ----------------------------------------------------------------
    def _t(self, name, device):
        import torch

        key = (name, str(device))
        if key not in self._torch_cache:
            a = getattr(self, name)
            self._torch_cache[key] = None if a is None else torch.as_tensor(np.asarray(a, dtype=np.float64), device=device)
        return self._torch_cache[key]

    def preprocess(self, X):
        """Apply the SAE's per-token input normalisation (float64 rows in, float64 rows out).

        ``constant_norm_rescale``: ``x * sqrt(d_in) / ||x||`` (SAELens);
        ``layer_norm``: ``(x - mean(x)) / (std(x) + 1e-5)`` with the unbiased std
        (SAELens' run-time layer norm). ``none``: unchanged. The decoder output
        of SAELens is mapped back to the raw space afterwards, but the dictionary
        and the objective live in the normalised space, which is where
        certification happens.
        """
        X = np.asarray(X, dtype=np.float64)
        if self.normalize_activations == "constant_norm_rescale":
            nrm = np.linalg.norm(X, axis=1, keepdims=True)
            return X * (math.sqrt(self.d_in) / np.where(nrm > 0, nrm, 1.0))
        if self.normalize_activations == "layer_norm":
            mu = X.mean(axis=1, keepdims=True)
            Xc = X - mu
            std = Xc.std(axis=1, ddof=1, keepdims=True) if X.shape[1] > 1 else np.zeros_like(mu)
            return Xc / (std + 1e-5)
        return X

    def encode(self, X, device="cpu"):
        """Feature activations ``f`` (N, d_sae) of the SAE's own encoder, in float64.

        ``X`` holds already preprocessed rows (see :meth:`preprocess`). The result
        is a torch tensor on ``device`` when ``X`` is one, else a numpy array; in
        both cases ``decode(f) = f @ W_dec + b_dec``.
        """
        import torch

        if not self.has_encoder:
            raise ValueError("this SAE has no encoder (decoder-only file); only optimal codes are available")
        as_numpy = not isinstance(X, torch.Tensor)
        x = torch.as_tensor(np.asarray(X, dtype=np.float64), device=device) if as_numpy else X.to(torch.float64)
        dev = x.device
        if self.apply_b_dec_to_input:
            x = x - self._t("b_dec", dev)
        W_enc = self._t("W_enc", dev)
        arch = self.architecture
        if arch == "gated":
            g = x @ W_enc + self._t("b_gate", dev)
            m = x @ (W_enc * torch.exp(self._t("r_mag", dev))) + self._t("b_mag", dev)
            f = (g > 0).to(torch.float64) * torch.relu(m)
        else:
            p = x @ W_enc + self._t("b_enc", dev)
            if arch == "standard":
                f = torch.relu(p)
            elif arch == "jumprelu":
                f = torch.relu(p) * (p > self._t("threshold", dev)).to(torch.float64)
            else:  # topk
                nrm = None
                if self.rescale_acts_by_decoder_norm:
                    nrm = torch.linalg.norm(self._t("W_dec", dev), dim=1)
                    p = p * nrm
                top = torch.topk(p, k=self.k, dim=-1)
                f = torch.zeros_like(p).scatter_(-1, top.indices, torch.relu(top.values))
                if nrm is not None:
                    f = f / torch.where(nrm > 0, nrm, torch.ones_like(nrm))
        return f.cpu().numpy() if as_numpy else f

    def decode(self, f):
        """Reconstruction ``f @ W_dec + b_dec`` (float64)."""
        f = np.asarray(f, dtype=np.float64)
        return f @ np.asarray(self.W_dec, dtype=np.float64) + np.asarray(self.b_dec, dtype=np.float64)

    def state_dict(self) -> dict:
        """The weights in SAELens naming (only those the architecture uses)."""
        names = {"standard": ("W_enc", "b_enc", "W_dec", "b_dec"), "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
                 "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
                 "gated": ("W_enc", "b_gate", "b_mag", "r_mag", "W_dec", "b_dec"), "decoder_only": ("W_dec", "b_dec")}
        return {n: getattr(self, n) for n in names[self.architecture]}

    def with_b_dec_applied(self, flag: bool) -> "SAE":
        """An equivalent SAE with ``apply_b_dec_to_input = flag`` (folds ``b_dec @ W_enc`` into the encoder biases).

        ``(x - b_dec) W_enc + b_enc = x W_enc + (b_enc - b_dec W_enc)``: the encoder
        computes exactly the same codes (up to rounding).
        """
        if flag == self.apply_b_dec_to_input or not self.has_encoder:
            return replace(self, apply_b_dec_to_input=flag, warnings=list(self.warnings))
        b64 = np.asarray(self.b_dec, dtype=np.float64)
        shift = b64 @ np.asarray(self.W_enc, dtype=np.float64)  # added to the pre-activation when b_dec is NOT subtracted
        sign = -1.0 if flag is False else 1.0  # False: b' = b - b_dec W ; True: b' = b + b_dec W
        dt = self.W_enc.dtype
        kw = {}
        if self.architecture == "gated":
            kw["b_gate"] = (self.b_gate + sign * shift).astype(dt)
            kw["b_mag"] = (self.b_mag + sign * shift * np.exp(np.asarray(self.r_mag, dtype=np.float64))).astype(dt)
        else:
            kw["b_enc"] = (self.b_enc + sign * shift).astype(dt)
        return replace(self, apply_b_dec_to_input=flag, warnings=list(self.warnings), **kw)

    def summary(self) -> dict:
        """JSON-friendly description (no weights)."""
        return {"architecture": self.architecture, "d_in": self.d_in, "d_sae": self.d_sae, "k": self.k,
                "apply_b_dec_to_input": bool(self.apply_b_dec_to_input),
                "normalize_activations": self.normalize_activations,
                "rescale_acts_by_decoder_norm": bool(self.rescale_acts_by_decoder_norm),
                "source_format": self.source_format, "path": self.path, "dtype": self.dtype,
                "l1_coefficient": self.l1_coefficient, "warnings": list(self.warnings)}


def orthogonal_rays_sae(lam: float, *, n_pairs: int = 4, dim: int = 12, points_per_ray: int = 15,
                        radius=(1.0, 5.0), architecture: str = "standard", n_core: int = 0, seed: int = 0):
    r"""Data with a known globally optimal SAE (any width), for tests and sanity checks.

    Rays ``±q_j`` (``q_j`` orthonormal, ``j < n_pairs``) from a random centre
    ``c``, the same radii ``t > lam`` on both rays of a pair, plus ``n_core``
    points at ``c`` itself. Then ``b* = c`` (the clipped residuals cancel in
    pairs) and the tied SAE ``W_dec = [Q; -Q]``, ``W_enc = W_dec^T``, encoder
    bias ``-lam`` reconstructs ``x = c + t q`` as ``c + (t - lam) q``: residual
    ``lam q``, objective ``h_lam(t)`` per point, which is the wide-limit lower
    bound of theory.md §3. So this SAE attains the global optimum exactly, for
    the architectures ``standard``, ``jumprelu`` (threshold 0), ``topk``
    (``k = 1``) and ``gated`` (``b_gate = b_mag = -lam``, ``r_mag = 0``).

    Returns
    -------
    X : ndarray (2 * n_pairs * points_per_ray + n_core, dim)
    sae : SAE
    """
    if 2 * n_pairs > 2 * dim or n_pairs > dim:
        raise ValueError(f"need n_pairs <= dim, got n_pairs={n_pairs}, dim={dim}")
    if radius[0] <= lam:
        raise ValueError(f"radii must exceed lam so every ray point is coded (radius[0]={radius[0]}, lam={lam})")
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((dim, n_pairs)))[0].T
    U = np.vstack([Q, -Q])
    c = rng.standard_normal(dim)
    t = rng.uniform(radius[0], radius[1], (n_pairs, points_per_ray))
    t = np.vstack([t, t])
    X = (c + t[:, :, None] * U[:, None, :]).reshape(-1, dim)
    if n_core:
        X = np.vstack([X, np.tile(c, (n_core, 1))])
    k = U.shape[0]
    kw = {"W_dec": U, "b_dec": c, "W_enc": U.T.copy(), "architecture": architecture, "dtype": "float64"}
    if architecture == "standard":
        kw["b_enc"] = np.full(k, -lam)
    elif architecture == "jumprelu":
        kw.update(b_enc=np.full(k, -lam), threshold=np.zeros(k))
    elif architecture == "topk":
        kw.update(b_enc=np.full(k, -lam), k=1)
    elif architecture == "gated":
        kw.update(b_gate=np.full(k, -lam), b_mag=np.full(k, -lam), r_mag=np.zeros(k))
    else:
        raise ValueError(f"architecture must be standard, jumprelu, topk or gated, got {architecture!r}")
    return X, SAE(**kw)


# --------------------------------------------------------------------------------------
# reading files
# --------------------------------------------------------------------------------------


def _read_json(p: Path) -> dict:
    try:
        with open(p) as fh:
            d = json.load(fh)
    except json.JSONDecodeError as e:
        raise SAEFormatError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise SAEFormatError(f"{p}: cannot read ({e.strerror})") from None
    if not isinstance(d, dict):
        raise SAEFormatError(f"{p}: expected a JSON object, found {type(d).__name__}")
    return d


def _read_safetensors(p: Path) -> dict:
    from safetensors.torch import load_file

    if not p.exists():
        raise SAEFormatError(f"{p}: no such file")
    try:
        return dict(load_file(str(p)))
    except Exception as e:  # noqa: BLE001 - any reader failure is one line naming the file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SAEFormatError(f"{p}: not a readable safetensors file ({msg})") from None


def _read_pt(p: Path) -> dict:
    import pickle

    import torch

    if not p.exists():
        raise SAEFormatError(f"{p}: no such file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        from ..data.source import unpickle_reason

        raise SAEFormatError(
            f"{p}: refused to unpickle: the file holds Python objects other than tensors "
            f"({unpickle_reason(e)}); save a plain state dict of tensors instead"
        ) from None
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SAEFormatError(f"{p}: not a readable torch file ({msg[:200]})") from None
    if not isinstance(obj, dict):
        raise SAEFormatError(f"{p}: expected a state dict (name -> tensor), found {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise SAEFormatError(f"{p}: entry {k!r} is a {type(v).__name__}, expected a tensor")
        out[str(k)] = v
    return out


def _get(sd: dict, name: str, where: Path, why: str):
    if name not in sd:
        have = ", ".join(sorted(sd)) or "nothing"
        raise SAEFormatError(f"{where}: missing tensor {name!r} ({why}); the file holds: {have}")
    return sd[name]


def _dtype_name(sd: dict) -> str:
    for v in sd.values():
        return str(v.dtype).replace("torch.", "")
    return "float32"


def _check_dims(sae: SAE, where: Path, d_in, d_sae):
    if d_in is not None and int(d_in) != sae.d_in:
        raise SAEFormatError(f"{where}: config says d_in={d_in} but tensor 'W_dec' has d_in={sae.d_in}")
    if d_sae is not None and int(d_sae) != sae.d_sae:
        raise SAEFormatError(f"{where}: config says d_sae={d_sae} but tensor 'W_dec' has d_sae={sae.d_sae}")


def _check_config_dtype(cfg_dtype, sd, warnings):
    if cfg_dtype is None:
        return
    got = _dtype_name(sd)
    want = str(cfg_dtype).replace("torch.", "")
    if want != got:
        warnings.append(f"config dtype {want} but tensors are stored as {got} (read as stored, computed in float64)")


def _fold_norm_scaling(sae_kw: dict, s: float) -> None:
    """SAELens ``fold_activation_norm_scaling_factor``: W_enc *= s, W_dec /= s, b_dec /= s."""
    sae_kw["W_enc"] = np.asarray(sae_kw["W_enc"], dtype=np.float64) * s
    sae_kw["W_dec"] = np.asarray(sae_kw["W_dec"], dtype=np.float64) / s
    sae_kw["b_dec"] = np.asarray(sae_kw["b_dec"], dtype=np.float64) / s


def _saelens(folder: Path, norm_scaling_factor) -> SAE:
    cfg_path = folder / "cfg.json"
    w_path = folder / "sae_weights.safetensors"
    cfg = _read_json(cfg_path)
    sd = _read_safetensors(w_path)
    meta = cfg.get("metadata") or cfg.get("meta") or {}
    version = str(cfg.get("sae_lens_version") or (meta.get("sae_lens_version") if isinstance(meta, dict) else "") or "")
    try:
        major = int(version.split(".")[0]) if version else 0
    except ValueError:
        major = 0
    # v6 configs carry a version >= 6 (top level or in metadata); a config without any version is v6 only if it
    # has the v6 metadata block
    legacy = major < 6 and not (not version and ("metadata" in cfg or "meta" in cfg))
    arch = cfg.get("architecture", "standard")
    if legacy:
        act = cfg.get("activation_fn_str", cfg.get("activation_fn", "relu"))
        if arch == "standard" and act == "topk":
            arch = "topk"
    if "d_out" in cfg or str(arch).endswith("transcoder"):
        raise SAEFormatError(f"{cfg_path}: transcoders (architecture {arch!r}) are not supported; only SAEs x -> x")
    if arch not in ("standard", "jumprelu", "topk", "gated"):
        raise SAEFormatError(f"{cfg_path}: unsupported SAELens architecture {arch!r}; supported: standard, jumprelu, topk, gated")
    if cfg.get("reshape_activations", "none") not in ("none", "hook_z"):
        raise SAEFormatError(f"{cfg_path}: unsupported reshape_activations {cfg.get('reshape_activations')!r}")
    norm = cfg.get("normalize_activations", "none")
    if isinstance(norm, bool):  # pre-6 boolean form
        norm = "expected_average_only_in" if norm else "none"
    norm = "none" if norm is None else str(norm)
    warnings: list[str] = []
    _check_config_dtype(cfg.get("dtype"), sd, warnings)
    kw = {"W_dec": _get(sd, "W_dec", w_path, "the decoder"), "b_dec": _get(sd, "b_dec", w_path, "the decoder bias")}
    if arch == "gated":
        kw["W_enc"] = _get(sd, "W_enc", w_path, "gated encoder")
        for n in ("b_gate", "b_mag", "r_mag"):
            kw[n] = _get(sd, n, w_path, "gated encoder")
    else:
        kw["W_enc"] = _get(sd, "W_enc", w_path, f"{arch} encoder")
        kw["b_enc"] = _get(sd, "b_enc", w_path, f"{arch} encoder")
    k = None
    if arch == "jumprelu":
        if "threshold" in sd:
            kw["threshold"] = sd["threshold"]
        elif "log_threshold" in sd:
            kw["threshold"] = sd["log_threshold"].double().exp()
        elif "jump_relu_threshold" in cfg:
            kw["threshold"] = np.full(int(cfg.get("d_sae", kw["W_dec"].shape[0])), float(cfg["jump_relu_threshold"]))
        else:
            _get(sd, "threshold", w_path, "jumprelu thresholds")
    if arch == "topk":
        k = cfg.get("k")
        if k is None:
            k = (cfg.get("activation_fn_kwargs") or {}).get("k")
        if k is None:
            raise SAEFormatError(f"{cfg_path}: topk SAE without k (neither 'k' nor activation_fn_kwargs.k)")
    if "scaling_factor" in sd or "finetuning_scaling_factor" in sd:
        sf = sd.get("finetuning_scaling_factor", sd.get("scaling_factor"))
        if hasattr(sf, "ndim") and sf.ndim == 1 and sf.shape[0] == kw["W_dec"].shape[0]:
            W = _arr(kw["W_dec"], "W_dec", w_path).astype(np.float64)
            kw["W_dec"] = W * _arr(sf, "scaling_factor", w_path).astype(np.float64)[:, None]
            if not np.allclose(_arr(sf, "scaling_factor", w_path), 1.0):
                warnings.append("finetuning scaling_factor folded into W_dec")
        else:
            raise SAEFormatError(f"{w_path}: tensor 'scaling_factor' has shape {tuple(sf.shape)}, expected ({kw['W_dec'].shape[0]},)")
    if norm == "expected_average_only_in":
        if norm_scaling_factor is None:
            raise SAEFormatError(
                f"{cfg_path}: normalize_activations='expected_average_only_in' scales inputs by a dataset norm factor "
                "that is not stored in the SAE files; pass norm_scaling_factor= (SAELens: sqrt(d_in) / E||x||) to fold it in"
            )
        _fold_norm_scaling(kw, float(norm_scaling_factor))
        norm = "none"
        warnings.append(f"norm scaling factor {float(norm_scaling_factor):g} folded into the weights")
    elif norm_scaling_factor is not None:
        raise SAEFormatError(f"{cfg_path}: norm_scaling_factor given but the SAE uses normalize_activations={norm!r}")
    l1 = cfg.get("l1_coefficient")
    sae = SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
              normalize_activations=norm,
              rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)),
              source_format="saelens-legacy" if legacy else "saelens", path=str(folder),
              dtype=_dtype_name(sd), l1_coefficient=None if l1 is None else float(l1), config=cfg, warnings=warnings)
    _check_dims(sae, cfg_path, cfg.get("d_in"), cfg.get("d_sae"))
    return sae


_DL_CLASSES = {"AutoEncoder": "standard", "JumpReluAutoEncoder": "jumprelu", "AutoEncoderTopK": "topk",
               "GatedAutoEncoder": "gated"}


def _dictionary_learning(ae_path: Path, cfg_path: Path | None) -> SAE:
    sd = _read_pt(ae_path)
    cfg = _read_json(cfg_path) if cfg_path is not None and cfg_path.exists() else {}
    trainer = cfg.get("trainer", cfg) if isinstance(cfg.get("trainer", cfg), dict) else {}
    cls = trainer.get("dict_class")
    if cls is None:  # infer from the keys
        if "W_enc" in sd and "threshold" in sd:
            cls = "JumpReluAutoEncoder"
        elif "k" in sd and "encoder.weight" in sd:
            cls = "AutoEncoderTopK"
        elif "r_mag" in sd:
            cls = "GatedAutoEncoder"
        elif "encoder.weight" in sd and "bias" in sd:
            cls = "AutoEncoder"
        else:
            raise SAEFormatError(f"{ae_path}: cannot tell the dictionary_learning class from its tensors "
                                 f"({', '.join(sorted(sd))}) and there is no config.json with trainer.dict_class")
    if cls == "BatchTopKSAE":
        raise SAEFormatError(f"{ae_path}: dictionary_learning BatchTopKSAE (batch-level top-k) is not supported; "
                             "only per-token AutoEncoderTopK")
    if cls not in _DL_CLASSES:
        raise SAEFormatError(f"{ae_path}: unsupported dictionary_learning dict_class {cls!r}; "
                             f"supported: {', '.join(_DL_CLASSES)}")
    arch = _DL_CLASSES[cls]
    warnings: list[str] = []
    k = None
    if arch == "standard":
        kw = {"W_enc": _get(sd, "encoder.weight", ae_path, "AutoEncoder encoder").T,
              "b_enc": _get(sd, "encoder.bias", ae_path, "AutoEncoder encoder"),
              "W_dec": _get(sd, "decoder.weight", ae_path, "AutoEncoder decoder").T,
              "b_dec": _get(sd, "bias", ae_path, "AutoEncoder bias")}
        apply = True
    elif arch == "jumprelu":
        kw = {n: _get(sd, n, ae_path, "JumpReluAutoEncoder") for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
        apply = bool(trainer.get("apply_b_dec_to_input", False))
    elif arch == "topk":
        kw = {"W_enc": _get(sd, "encoder.weight", ae_path, "AutoEncoderTopK encoder").T,
              "b_enc": _get(sd, "encoder.bias", ae_path, "AutoEncoderTopK encoder"),
              "W_dec": _get(sd, "decoder.weight", ae_path, "AutoEncoderTopK decoder").T,
              "b_dec": _get(sd, "b_dec", ae_path, "AutoEncoderTopK decoder bias")}
        k = trainer.get("k")
        if "k" in sd:
            k_sd = int(sd["k"].item())
            if k is not None and int(k) != k_sd:
                raise SAEFormatError(f"{ae_path}: tensor 'k' = {k_sd} but {cfg_path} says k = {k}")
            k = k_sd
        if k is None:
            raise SAEFormatError(f"{ae_path}: AutoEncoderTopK without k (no 'k' tensor and no trainer.k in config)")
        apply = True
    else:  # gated
        kw = {"W_enc": _get(sd, "encoder.weight", ae_path, "GatedAutoEncoder encoder").T,
              "W_dec": _get(sd, "decoder.weight", ae_path, "GatedAutoEncoder decoder").T,
              "b_dec": _get(sd, "decoder_bias", ae_path, "GatedAutoEncoder decoder bias"),
              "b_gate": _get(sd, "gate_bias", ae_path, "GatedAutoEncoder"),
              "b_mag": _get(sd, "mag_bias", ae_path, "GatedAutoEncoder"),
              "r_mag": _get(sd, "r_mag", ae_path, "GatedAutoEncoder")}
        apply = True
    l1 = trainer.get("l1_penalty")
    sae = SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=apply, source_format="dictionary_learning",
              path=str(ae_path), dtype=_dtype_name(sd), l1_coefficient=None if l1 is None else float(l1),
              config=cfg, warnings=warnings)
    _check_dims(sae, cfg_path or ae_path, trainer.get("activation_dim"), trainer.get("dict_size"))
    return sae


def _sparsify(folder: Path) -> SAE:
    cfg_path = folder / "cfg.json"
    w_path = folder / "sae.safetensors"
    cfg = _read_json(cfg_path)
    for bad, why in (("transcode", "transcoders"), ("skip_connection", "a skip connection (W_skip)"),
                     ("signed", "signed top-k codes"), ("embed_skip", "an embedding skip connection"),
                     ("gram_lookup", "n-gram lookup targets")):
        if cfg.get(bad):
            raise SAEFormatError(f"{cfg_path}: sparsify option {bad}=true ({why}) is not supported")
    if cfg.get("activation", "topk") != "topk":
        raise SAEFormatError(f"{cfg_path}: sparsify activation {cfg.get('activation')!r} is not supported; only 'topk'")
    if "d_in" not in cfg or "k" not in cfg:
        raise SAEFormatError(f"{cfg_path}: sparsify cfg.json needs 'd_in' and 'k'")
    sd = _read_safetensors(w_path)
    d_in = int(cfg["d_in"])
    d_sae = int(cfg.get("num_latents") or 0) or d_in * int(cfg.get("expansion_factor", 32))
    kw = {"W_enc": _get(sd, "encoder.weight", w_path, "sparsify encoder").T,
          "b_enc": _get(sd, "encoder.bias", w_path, "sparsify encoder"),
          "W_dec": _get(sd, "W_dec", w_path, "sparsify decoder"),
          "b_dec": _get(sd, "b_dec", w_path, "sparsify decoder bias")}
    sae = SAE(**kw, architecture="topk", k=cfg["k"], apply_b_dec_to_input=True, source_format="sparsify",
              path=str(folder), dtype=_dtype_name(sd), config=cfg)
    _check_dims(sae, cfg_path, d_in, d_sae)
    return sae


def _plain(p: Path) -> SAE:
    ext = p.suffix.lower()
    if ext == ".npz":
        try:
            with np.load(p, allow_pickle=False) as z:
                sd = {k: z[k] for k in z.files}
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SAEFormatError(f"{p}: not a readable .npz file ({msg})") from None
    elif ext == ".safetensors":
        sd = _read_safetensors(p)
    else:
        sd = _read_pt(p)
    W_dec = _get(sd, "W_dec", p, "the decoder (d_sae, d_in)")
    b_dec = _get(sd, "b_dec", p, "the decoder bias (d_in,)")
    has_enc = "W_enc" in sd
    if has_enc and "b_enc" not in sd:
        raise SAEFormatError(f"{p}: has 'W_enc' but no 'b_enc'")
    arch, k = "decoder_only", None
    kw = {"W_dec": W_dec, "b_dec": b_dec}
    if has_enc:
        kw.update(W_enc=sd["W_enc"], b_enc=sd["b_enc"])
        arch = "standard"
        if "threshold" in sd:
            arch = "jumprelu"
            kw["threshold"] = sd["threshold"]
        elif "k" in sd:
            arch = "topk"
            k = int(np.asarray(sd["k"].cpu() if hasattr(sd["k"], "cpu") else sd["k"]).item())
    apply = True
    if "apply_b_dec_to_input" in sd:
        v = sd["apply_b_dec_to_input"]
        apply = bool(np.asarray(v.cpu() if hasattr(v, "cpu") else v).item())
    return SAE(**kw, architecture=arch, k=k, apply_b_dec_to_input=apply, source_format="plain", path=str(p),
               dtype=str(getattr(W_dec, "dtype", "float32")).replace("torch.", ""))


def load_sae(path, *, norm_scaling_factor: float | None = None) -> SAE:
    """Load a trained SAE from any supported layout (detected from the files present).

    Parameters
    ----------
    path : str or Path
        A folder (SAELens: ``cfg.json`` + ``sae_weights.safetensors``; sparsify:
        ``cfg.json`` + ``sae.safetensors``; dictionary_learning: ``ae.pt`` +
        ``config.json``), a dictionary_learning ``ae.pt`` file, or a plain
        ``.npz`` / ``.safetensors`` / ``.pt`` file with ``W_dec``, ``b_dec``
        (+ optional ``W_enc``, ``b_enc``, ``threshold`` or ``k``).
    norm_scaling_factor : float, optional
        For SAELens ``normalize_activations="expected_average_only_in"``: the
        factor the inputs were multiplied by in training, folded into the weights.

    Returns
    -------
    SAE

    Raises
    ------
    SAEFormatError
        (a ``ValueError``) naming the file and tensor for anything missing,
        mis-shaped, unreadable or unsupported. Nothing is unpickled.
    """
    if norm_scaling_factor is not None:
        import math

        try:
            ok = math.isfinite(float(norm_scaling_factor)) and float(norm_scaling_factor) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"norm_scaling_factor must be a finite number > 0, got {norm_scaling_factor!r}")
    p = Path(path)
    if not p.exists():
        raise SAEFormatError(f"{p}: no such file or folder")
    if p.is_dir():
        if (p / "sae_weights.safetensors").exists():
            if not (p / "cfg.json").exists():
                raise SAEFormatError(f"{p}: has sae_weights.safetensors but no cfg.json (SAELens layout needs both)")
            return _saelens(p, norm_scaling_factor)
        if (p / "sae.safetensors").exists():
            if not (p / "cfg.json").exists():
                raise SAEFormatError(f"{p}: has sae.safetensors but no cfg.json (sparsify layout needs both)")
            return _sparsify(p)
        if (p / "ae.pt").exists():
            return _dictionary_learning(p / "ae.pt", p / "config.json")
        raise SAEFormatError(
            f"{p}: no SAE found (expected cfg.json + sae_weights.safetensors [SAELens], cfg.json + sae.safetensors "
            "[sparsify] or ae.pt + config.json [dictionary_learning])"
        )
    ext = p.suffix.lower()
    if p.name == "ae.pt" or (ext in (".pt", ".pth") and (p.parent / "config.json").exists()):
        return _dictionary_learning(p, p.parent / "config.json")
    if ext in (".npz", ".safetensors", ".pt", ".pth"):
        return _plain(p)
    raise SAEFormatError(f"{p}: unsupported SAE file type {ext!r} (give a folder, ae.pt, .npz, .safetensors or .pt)")


# --------------------------------------------------------------------------------------
# writing files
# --------------------------------------------------------------------------------------


def _tensors(d: dict, dtype=None) -> dict:
    import torch

    out = {}
    for k, v in d.items():
        t = torch.as_tensor(np.ascontiguousarray(v))
        out[k] = t.to(dtype) if dtype is not None else t
    return out


def _storage_dtype(sae: SAE):
    import torch

    return {"float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(sae.dtype, torch.float32)


def save_saelens(sae: SAE, path, *, legacy: bool = False) -> Path:
    """Write ``cfg.json`` + ``sae_weights.safetensors`` in SAELens' layout.

    ``legacy=False`` writes a v6 config (``architecture``, ``k`` for topk,
    ``metadata.sae_lens_version = "6.0.0"``); ``legacy=True`` the older flat
    config (``activation_fn_str``, ``activation_fn_kwargs``, ``sae_lens_version``
    5.x). ``decoder_only`` SAEs cannot be written in this layout.
    """
    from safetensors.torch import save_file

    if not sae.has_encoder:
        raise ValueError("a decoder-only SAE cannot be saved in SAELens layout (it needs an encoder); use save_plain")
    if sae.normalize_activations not in ("none", "constant_norm_rescale", "layer_norm"):
        raise ValueError(f"cannot save normalize_activations={sae.normalize_activations!r}")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": sae.dtype,
           "device": "cpu", "apply_b_dec_to_input": bool(sae.apply_b_dec_to_input),
           "normalize_activations": sae.normalize_activations, "reshape_activations": "none"}
    if sae.architecture == "topk":
        cfg["k"] = int(sae.k)
        if sae.rescale_acts_by_decoder_norm:
            cfg["rescale_acts_by_decoder_norm"] = True
    if sae.l1_coefficient is not None:
        cfg["l1_coefficient"] = float(sae.l1_coefficient)
    if legacy:
        if sae.rescale_acts_by_decoder_norm:
            raise ValueError("rescale_acts_by_decoder_norm has no pre-6 SAELens form")
        cfg.pop("k", None)
        cfg.pop("reshape_activations")
        cfg["architecture"] = "standard" if sae.architecture == "topk" else sae.architecture
        cfg["activation_fn_str"] = "topk" if sae.architecture == "topk" else "relu"
        cfg["activation_fn_kwargs"] = {"k": int(sae.k)} if sae.architecture == "topk" else {}
        cfg["sae_lens_version"] = "5.9.0"
        cfg["finetuning_scaling_factor"] = False
        cfg["hook_point"] = "unknown"
    else:
        cfg["metadata"] = {"sae_lens_version": "6.0.0", "model_name": None, "hook_name": None}
    save_file(_tensors(sae.state_dict(), _storage_dtype(sae)), str(p / "sae_weights.safetensors"))
    (p / "cfg.json").write_text(json.dumps(cfg, indent=2))
    return p


def save_dictionary_learning(sae: SAE, path) -> Path:
    """Write ``ae.pt`` (a plain state dict of tensors) + ``config.json`` in dictionary_learning's layout.

    Class by architecture: standard -> AutoEncoder, jumprelu -> JumpReluAutoEncoder,
    topk -> AutoEncoderTopK, gated -> GatedAutoEncoder. Those classes fix whether
    ``b_dec`` is subtracted before encoding (yes, except JumpReLU); when the SAE
    differs, the equivalent encoder bias is written (:meth:`SAE.with_b_dec_applied`).
    """
    import torch

    if not sae.has_encoder:
        raise ValueError("a decoder-only SAE cannot be saved in dictionary_learning layout; use save_plain")
    if sae.normalize_activations != "none" or sae.rescale_acts_by_decoder_norm:
        raise ValueError("dictionary_learning has no input normalisation or decoder-norm rescaling options")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    arch = sae.architecture
    s = sae.with_b_dec_applied(arch != "jumprelu")
    dt = _storage_dtype(sae)
    if arch == "standard":
        sd = {"bias": s.b_dec, "encoder.weight": s.W_enc.T, "encoder.bias": s.b_enc, "decoder.weight": s.W_dec.T}
        cls, trainer_cls = "AutoEncoder", "StandardTrainer"
    elif arch == "jumprelu":
        sd = {"W_enc": s.W_enc, "b_enc": s.b_enc, "W_dec": s.W_dec, "b_dec": s.b_dec, "threshold": s.threshold}
        cls, trainer_cls = "JumpReluAutoEncoder", "JumpReluTrainer"
    elif arch == "topk":
        sd = {"decoder.weight": s.W_dec.T, "encoder.weight": s.W_enc.T, "encoder.bias": s.b_enc, "b_dec": s.b_dec}
        cls, trainer_cls = "AutoEncoderTopK", "TopKTrainer"
    else:
        sd = {"decoder_bias": s.b_dec, "encoder.weight": s.W_enc.T, "r_mag": s.r_mag, "gate_bias": s.b_gate,
              "mag_bias": s.b_mag, "decoder.weight": s.W_dec.T}
        cls, trainer_cls = "GatedAutoEncoder", "GatedSAETrainer"
    tensors = _tensors(sd, dt)
    if arch == "topk":
        tensors["k"] = torch.tensor(int(sae.k), dtype=torch.int)
        tensors["threshold"] = torch.tensor(-1.0, dtype=torch.float32)
    torch.save(tensors, p / "ae.pt")
    trainer = {"dict_class": cls, "trainer_class": trainer_cls, "activation_dim": sae.d_in, "dict_size": sae.d_sae}
    if arch == "topk":
        trainer["k"] = int(sae.k)
    if sae.l1_coefficient is not None:
        trainer["l1_penalty"] = float(sae.l1_coefficient)
    (p / "config.json").write_text(json.dumps({"trainer": trainer}, indent=2))
    return p


def save_sparsify(sae: SAE, path) -> Path:
    """Write ``cfg.json`` + ``sae.safetensors`` in EleutherAI sparsify's layout (TopK SAEs only).

    sparsify always subtracts ``b_dec`` before encoding; an SAE that does not is
    written with the equivalent encoder bias.
    """
    from safetensors.torch import save_file

    if sae.architecture != "topk":
        raise ValueError(f"sparsify stores TopK SAEs only; this SAE is {sae.architecture!r}")
    if sae.normalize_activations != "none" or sae.rescale_acts_by_decoder_norm:
        raise ValueError("sparsify has no input normalisation or decoder-norm rescaling options")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    s = sae.with_b_dec_applied(True)
    sd = {"encoder.weight": s.W_enc.T, "encoder.bias": s.b_enc, "W_dec": s.W_dec, "b_dec": s.b_dec}
    save_file(_tensors(sd, _storage_dtype(sae)), str(p / "sae.safetensors"))
    norms = sae.decoder_norms()
    cfg = {"activation": "topk", "expansion_factor": max(1, sae.d_sae // sae.d_in),
           "normalize_decoder": bool(np.allclose(norms, 1.0, atol=1e-5)), "num_latents": sae.d_sae,
           "k": int(sae.k), "multi_topk": False, "skip_connection": False, "transcode": False, "d_in": sae.d_in}
    (p / "cfg.json").write_text(json.dumps(cfg, indent=2))
    return p


def save_plain(sae: SAE, path) -> Path:
    """Write a plain ``.npz`` or ``.safetensors`` file with ``W_dec``, ``b_dec`` (+ ``W_enc``, ``b_enc``, ...).

    Plain files hold standard, jumprelu (``threshold``), topk (``k``) and
    decoder-only SAEs; ``apply_b_dec_to_input`` is stored as a 0-d flag.
    """
    if sae.architecture == "gated" or sae.normalize_activations != "none" or sae.rescale_acts_by_decoder_norm:
        raise ValueError("plain files hold standard / jumprelu / topk / decoder-only SAEs without extra options")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    d = {k: np.ascontiguousarray(v) for k, v in sae.state_dict().items()}
    if sae.architecture == "topk":
        d["k"] = np.array(int(sae.k), dtype=np.int64)
    d["apply_b_dec_to_input"] = np.array(bool(sae.apply_b_dec_to_input))
    ext = p.suffix.lower()
    if ext == ".npz":
        np.savez(p, **d)
    elif ext == ".safetensors":
        from safetensors.numpy import save_file

        d["apply_b_dec_to_input"] = d["apply_b_dec_to_input"].astype(np.uint8)
        save_file(d, str(p))
    else:
        raise ValueError(f"{p}: plain SAE files must end in .npz or .safetensors")
    return p
