"""Torch device selection shared by the torch solvers (optimal coding, gradient dictionary learning)."""

from __future__ import annotations

__all__ = ["resolve_device", "torch_dtype"]


def resolve_device(device="auto"):
    """Return a ``torch.device`` for ``device``.

    ``"auto"`` (or ``None``) picks CUDA when it is available and the CPU otherwise;
    ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` are taken as given.
    Asking for CUDA on a machine without a usable CUDA device is a
    :class:`ValueError` (one line), not a deep torch traceback.
    """
    import torch

    if device is None or (isinstance(device, str) and device.lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine "
                             "(use device='cpu' or 'auto')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or a CUDA device, got {device!r}")
    return dev


def torch_dtype(dtype):
    """``torch.float32`` or ``torch.float64`` from a name or dtype; anything else is a ValueError."""
    import torch

    table = {"float32": torch.float32, "float64": torch.float64, torch.float32: torch.float32,
             torch.float64: torch.float64, "single": torch.float32, "double": torch.float64}
    try:
        return table[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}") from None
