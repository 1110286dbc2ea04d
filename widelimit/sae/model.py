r"""Trained sparse autoencoders: one object, one encoder for every architecture.

An :class:`SAE` holds the weights in SAELens' layout (``W_enc`` ``(d_in, d_sae)``,
``b_enc`` ``(d_sae,)``, ``W_dec`` ``(d_sae, d_in)`` rows = atoms, ``b_dec``
``(d_in,)``) plus the settings that change what the encoder computes. Its
:meth:`SAE.encode` calls :func:`encode`, the one encoder of the toolkit (the
gradient solver :func:`widelimit.fit_dictionary` trains through it too), and
:meth:`SAE.decode` is always ``f @ W_dec + b_dec``, so the SAE objective of
theory.md §1 is

.. math:: L = \frac1N\sum_i \|x_i - f_i W_{dec} - b_{dec}\|^2 + 2\lambda\sum_d f_{id}\,\|W_{dec,d}\|,

the loss SAELens (v6) and dictionary_learning minimise with
``l1_coefficient = 2 lam`` (atoms of non-unit norm are read as unit atoms with
codes ``f_d ||W_dec,d||``; the reconstruction is unchanged).

Encoders, named as SAELens names them (``x_in = x - b_dec`` when
``apply_b_dec_to_input`` else ``x``, ``p = x_in @ W_enc + b_enc``):

============  ======================================================================
standard      ``f = relu(p)``
jumprelu      ``f = relu(p) * (p > threshold)``
topk          the ``k`` largest entries of ``p`` (of ``p * ||W_dec,d||`` when
              ``rescale_acts_by_decoder_norm``), ReLU'd, others 0; with
              ``rescale_acts_by_decoder_norm`` the decoder reads ``f_d / ||W_dec,d||``,
              which is stored here as the code so that decode stays ``f @ W_dec + b_dec``
batchtopk     inference form ``f = relu(p) * (relu(p) > threshold)`` (dictionary_learning's
              ``use_threshold=True``; SAELens saves BatchTopK SAEs as jumprelu); without a
              calibrated threshold (``threshold < 0``) the training form: the ``k * B``
              largest entries of ``relu(p)`` over the batch of ``B`` rows given
matryoshka    dictionary_learning's MatryoshkaBatchTopKSAE: the batchtopk encoder
gated         ``f = 1[x_in W_enc + b_gate > 0] * relu(x_in (W_enc * exp(r_mag)) + b_mag)``
decoder_only  no encoder (plain ``W_dec`` / ``b_dec`` files): only optimal codes exist
============  ======================================================================

Files are read by :func:`widelimit.sae.formats.load_sae` and objects of the
libraries (``sae_lens.SAE``, dictionary_learning, sparsify) converted by
:func:`widelimit.sae.formats.from_object`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .._validation import row_norms

__all__ = ["SAE", "SAEFormatError", "ARCHITECTURES", "L0_ARCHITECTURES", "encode", "jumprelu_ste"]

#: Architectures the toolkit can encode with (SAELens' names, plus ``decoder_only``).
ARCHITECTURES = ("standard", "jumprelu", "topk", "batchtopk", "gated", "matryoshka", "decoder_only")
#: Architectures trained with an L0 sparsity (a budget ``k`` or an L0 penalty), not an L1 one.
L0_ARCHITECTURES = ("jumprelu", "topk", "batchtopk", "matryoshka")
_NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in")
_TENSORS = ("W_dec", "b_dec", "W_enc", "b_enc", "threshold", "b_gate", "b_mag", "r_mag")


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
    training_architecture : str or None
        How it was trained when that differs from the inference encoder (SAELens saves a
        BatchTopK SAE as ``jumprelu`` and records ``metadata.training_architecture = "batchtopk"``).
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
    training_architecture: str | None = None
    config: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def __post_init__(self):
        where = self.path or "SAE"
        for name in _TENSORS:
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
                "topk": ("W_enc", "b_enc"), "batchtopk": ("W_enc", "b_enc"), "matryoshka": ("W_enc", "b_enc"),
                "gated": ("W_enc", "b_gate", "b_mag", "r_mag"), "decoder_only": ()}
        for name in need[self.architecture]:
            if getattr(self, name) is None:
                raise SAEFormatError(f"{where}: architecture {self.architecture!r} needs tensor {name!r}, which is missing")
        if self.architecture in ("topk", "batchtopk", "matryoshka"):
            if self.k is None and not (self.architecture != "topk" and self.threshold is not None
                                       and float(np.min(self.threshold)) >= 0):
                raise SAEFormatError(f"{where}: {self.architecture} architecture needs k")
            if self.k is not None:
                k = self.k
                if hasattr(k, "detach") or isinstance(k, np.ndarray):
                    k = np.asarray(k.detach().cpu() if hasattr(k, "detach") else k)
                    k = k.item() if k.size == 1 else k.tolist()
                if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer, float, np.floating)) \
                        or not float(k).is_integer() or not 1 <= int(k) <= d_sae:
                    raise SAEFormatError(f"{where}: field 'k' must be an integer in [1, d_sae={d_sae}], got {self.k!r}")
                self.k = int(k)
        elif self.k is not None:
            raise SAEFormatError(f"{where}: k is given but the architecture is {self.architecture!r}")
        for name in _TENSORS:
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
        """``||W_dec,d||`` for every feature (float64, row chunk by chunk: :func:`widelimit._validation.row_norms`)."""
        return row_norms(self.W_dec)

    def unit_dictionary(self) -> np.ndarray:
        """Decoder rows scaled to unit norm (zero rows stay zero): the ``W`` of theory.md §1.

        One float64 copy scaled in place (the former masked division held four ``d_sae x d_in`` float64 arrays at
        once: 4.8 GB at 65,536 x 2,304, the peak of a certification there)."""
        W = np.array(self.W_dec, dtype=np.float64)
        nrm = row_norms(W)
        W /= np.where(nrm > 0, nrm, 1.0)[:, None]
        return W

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

    def params(self) -> dict:
        """The weights as a dict (numpy, storage dtype) for :func:`encode`."""
        return {n: getattr(self, n) for n in _TENSORS if getattr(self, n) is not None}

    def encode(self, X, device="cpu"):
        """Feature activations ``f`` (N, d_sae) of the SAE's own encoder, in float64 (see :func:`encode`).

        ``X`` holds already preprocessed rows (see :meth:`preprocess`). The result
        is a torch tensor on ``device`` when ``X`` is one, else a numpy array; in
        both cases ``decode(f) = f @ W_dec + b_dec``.
        """
        import torch

        if not self.has_encoder:
            raise ValueError("this SAE has no encoder (decoder-only file); only optimal codes are available")
        as_numpy = not isinstance(X, torch.Tensor)
        x = torch.as_tensor(np.asarray(X, dtype=np.float64), device=device) if as_numpy else X.to(torch.float64)
        p = {n: self._t(n, x.device) for n in _TENSORS if getattr(self, n) is not None}
        f = encode(x, p, self.architecture, k=self.k, apply_b_dec_to_input=self.apply_b_dec_to_input,
                   rescale_acts_by_decoder_norm=self.rescale_acts_by_decoder_norm)
        return f.cpu().numpy() if as_numpy else f

    def decode(self, f):
        """Reconstruction ``f @ W_dec + b_dec`` (float64)."""
        f = np.asarray(f, dtype=np.float64)
        return f @ np.asarray(self.W_dec, dtype=np.float64) + np.asarray(self.b_dec, dtype=np.float64)

    def state_dict(self) -> dict:
        """The weights in SAELens naming (only those the architecture uses)."""
        names = {"standard": ("W_enc", "b_enc", "W_dec", "b_dec"), "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
                 "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
                 "batchtopk": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
                 "matryoshka": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
                 "gated": ("W_enc", "b_gate", "b_mag", "r_mag", "W_dec", "b_dec"), "decoder_only": ("W_dec", "b_dec")}
        return {n: getattr(self, n) for n in names[self.architecture] if getattr(self, n) is not None}

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
                "l1_coefficient": self.l1_coefficient, "training_architecture": self.training_architecture,
                "warnings": list(self.warnings)}




# --------------------------------------------------------------------------------------
# the one encoder
# --------------------------------------------------------------------------------------


def _jumprelu_ste():
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


_STE = []


def jumprelu_ste(pre, theta, bandwidth):
    """JumpReLU ``pre * 1[pre > theta]`` whose threshold gets a straight-through gradient (Rajamanoharan et al. 2024).

    The backward pass uses a rectangle kernel of width ``bandwidth`` around
    ``theta``: ``d/dtheta = -theta/bandwidth * 1[|pre - theta| < bandwidth/2]``
    (summed over rows), as SAELens' and dictionary_learning's JumpReLU trainers do.
    """
    if not _STE:
        _STE.append(_jumprelu_ste())
    return _STE[0](pre, theta, bandwidth)


def encode(x, params: dict, architecture: str, *, k: int | None = None, apply_b_dec_to_input: bool = True,
           rescale_acts_by_decoder_norm: bool = False, jumprelu_bandwidth: float | None = None):
    r"""Feature activations of an SAE encoder: the one encoder of the toolkit.

    Parameters
    ----------
    x : torch.Tensor or ndarray (B, d_in)
        Input rows. A torch tensor is computed in its own dtype and device and
        keeps autograd (training); an array is computed in float64 and returned
        as a float64 array.
    params : dict
        ``W_enc`` (d_in, d_sae), ``b_enc`` (d_sae,), ``b_dec`` (d_in,), and as the
        architecture needs: ``threshold`` (jumprelu, batchtopk, matryoshka),
        ``b_gate``, ``b_mag``, ``r_mag`` (gated), ``W_dec`` (topk with
        ``rescale_acts_by_decoder_norm``). Tensors or arrays like ``x``.
    architecture : str
        One of :data:`ARCHITECTURES` except ``decoder_only`` (see the module table).
    k : int, optional
        Active features per row (topk) or on average over the batch (batchtopk and
        matryoshka without a calibrated threshold).
    apply_b_dec_to_input : bool
        Encode ``x - b_dec`` instead of ``x``.
    rescale_acts_by_decoder_norm : bool
        SAELens TopK option: rank ``p_d ||W_dec,d||``; the code returned is the one
        the decoder ``f @ W_dec`` reads.
    jumprelu_bandwidth : float, optional
        jumprelu only: give the threshold a straight-through gradient with this
        kernel width (training; see :func:`jumprelu_ste`).

    Returns
    -------
    torch.Tensor or ndarray (B, d_sae)
    """
    import torch

    if architecture not in ARCHITECTURES or architecture == "decoder_only":
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES[:-1])}, got {architecture!r}")
    as_numpy = not isinstance(x, torch.Tensor)
    if as_numpy:
        x = torch.as_tensor(np.asarray(x, dtype=np.float64))
    ref = x

    def P(name):
        v = params.get(name)
        if v is None:
            raise ValueError(f"architecture {architecture!r} needs parameter {name!r}")
        if not isinstance(v, torch.Tensor):
            v = torch.as_tensor(np.asarray(v, dtype=np.float64))
        return v.to(device=ref.device, dtype=ref.dtype) if v.dtype != ref.dtype or v.device != ref.device else v

    if apply_b_dec_to_input:
        x = x - P("b_dec")
    W_enc = P("W_enc")
    if architecture == "gated":
        gate = (x @ W_enc + P("b_gate")) > 0
        f = gate.to(x.dtype) * torch.relu(x @ (W_enc * torch.exp(P("r_mag"))) + P("b_mag"))
        return f.numpy() if as_numpy else f
    p = x @ W_enc + P("b_enc")
    if architecture == "standard":
        f = torch.relu(p)
    elif architecture == "jumprelu":
        theta = P("threshold")
        if jumprelu_bandwidth is not None:
            f = jumprelu_ste(p, theta, jumprelu_bandwidth)  # = relu(p) * (p > theta) for theta >= 0
        else:
            f = torch.relu(p) * (p > theta).to(p.dtype)
    elif architecture == "topk":
        if k is None:
            raise ValueError("architecture 'topk' needs k")
        nrm = None
        if rescale_acts_by_decoder_norm:
            nrm = torch.linalg.norm(P("W_dec"), dim=1)
            p = p * nrm
        kk = min(int(k), p.shape[-1])
        top = torch.topk(p, k=kk, dim=-1)
        f = torch.zeros_like(p).scatter(-1, top.indices, torch.relu(top.values))
        if nrm is not None:
            f = f / torch.where(nrm > 0, nrm, torch.ones_like(nrm))
    else:  # batchtopk, matryoshka
        a = torch.relu(p)
        theta = params.get("threshold")
        if theta is not None and float(torch.as_tensor(theta).min()) >= 0:
            f = a * (a > P("threshold")).to(a.dtype)
        else:
            if k is None:
                raise ValueError(f"architecture {architecture!r} without a calibrated threshold needs k")
            flat = a.reshape(-1)
            top = torch.topk(flat, k=min(int(k) * a.shape[0], flat.numel()))
            f = torch.zeros_like(flat).scatter(-1, top.indices, top.values).reshape(a.shape)
    return f.numpy() if as_numpy else f
