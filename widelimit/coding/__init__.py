"""Certified optimal nonnegative codes for a fixed dictionary and bias (docs/theory.md §5).

One entry point, :func:`optimal_codes`.
"""

from .pdas import CodingResult, optimal_codes

__all__ = ["optimal_codes", "CodingResult"]
