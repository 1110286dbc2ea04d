"""Data: every kind of activation file behind one door, and the built-in datasets.

:func:`open_activations` (:mod:`widelimit.data.source`, the one loader of every format) opens a file or
a folder of shards as an :class:`~widelimit.data.source.ActivationSource`, which every solver streams.
Per-format readers: :mod:`~widelimit.data.readers`, :mod:`~widelimit.data.csv`, :mod:`~widelimit.data.arrow`.
"""

from __future__ import annotations

from .source import ActivationSource, DataError, open_activations

__all__ = ["open_activations", "ActivationSource", "DataError"]
