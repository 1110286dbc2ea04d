"""Data: every kind of activation file behind one door, and the built-in datasets.

:func:`open_activations` opens a file or a folder of shards as an
:class:`~widelimit.data.source.ActivationSource`, which every solver streams.
"""

from __future__ import annotations

from .source import ActivationSource, DataError

__all__ = ["open_activations", "ActivationSource", "DataError"]


def open_activations(path, *, key: str | None = None, column: str | None = None) -> ActivationSource:
    """Open activations where they are: a file (``.npy``, ``.safetensors``, ...), a folder of shards,
    or a Hugging Face ``datasets`` Arrow cache; see :meth:`ActivationSource.open`."""
    return ActivationSource.open(path, key=key, column=column)
