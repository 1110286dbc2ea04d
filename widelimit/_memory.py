r"""One memory budget for every allocation that grows with a parameter (docs/theory.md §9).

Each solver that allocates memory growing with ``N``, ``n`` or a width estimates the peak
from a model fitted to measurements (``benchmarks/memory_models.py``, the fits in
``benchmarks/results/memory_models.json``) and calls :func:`check_memory` **before** it
allocates: an estimate above the budget is one :class:`MemoryBudgetError` line naming what
was asked for, the estimate and the budget, instead of a swap storm, an out-of-memory kill
or a ``RuntimeError`` deep inside torch after minutes of work.

The budget is, in this order: the ``budget=`` a caller passes; the environment variable
``WIDELIMIT_MEMORY_BUDGET`` (bytes, or a number with a ``K``/``M``/``G``/``T`` suffix,
powers of 1024; the command line's ``--memory-budget`` sets it); else half of this
machine's memory (the smaller of the physical memory and a cgroup limit).
"""

from __future__ import annotations

import os
import re

__all__ = ["ENV", "MemoryBudgetError", "memory_budget", "machine_memory", "parse_bytes", "check_memory", "gib"]

#: The environment variable that overrides the default budget.
ENV = "WIDELIMIT_MEMORY_BUDGET"
#: Share of the machine's memory used as the default budget.
DEFAULT_SHARE = 0.5

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class MemoryBudgetError(MemoryError):
    """An allocation estimated above the memory budget, refused before it was made (one line)."""


def gib(nbytes: float) -> str:
    """``nbytes`` as a short human string (``"2.4 GiB"``, ``"310 MiB"``)."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    return f"{nbytes / 2**10:.0f} KiB"


def parse_bytes(text, what: str = ENV) -> int:
    """``"4G"`` -> ``4 * 2**30``; ``"1500000"`` -> 1500000 bytes. Anything else is one ``ValueError`` naming ``what``."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), flags=re.IGNORECASE)
    if m is None:
        raise ValueError(f"{what} must be a number of bytes, optionally with a K, M, G or T suffix "
                         f"(e.g. 4G), got {str(text)[:80]!r}")
    v = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if v < 1:
        raise ValueError(f"{what} must be at least 1 byte, got {str(text)[:80]!r}")
    return v


def _cgroup_limit() -> int | None:
    """The cgroup (v2, then v1) memory limit of this process, when one is set."""
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(f) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    return None


def machine_memory() -> int:
    """Bytes of memory this process may use: the physical memory, or a smaller cgroup limit (8 GiB if unknown)."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        phys = 8 * 2**30
    lim = _cgroup_limit()
    return int(min(phys, lim) if lim else phys)


def memory_budget(budget=None) -> int:
    """The budget in bytes: ``budget`` if given (bytes or a string such as ``"4G"``), else ``$WIDELIMIT_MEMORY_BUDGET``,
    else half of :func:`machine_memory`."""
    if budget is not None:
        if isinstance(budget, str):
            return parse_bytes(budget, "budget")
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 1:
            raise ValueError(f"budget must be a number of bytes >= 1, got {budget!r}")
        return int(budget)
    env = os.environ.get(ENV)
    if env:
        return parse_bytes(env, ENV)
    return int(DEFAULT_SHARE * machine_memory())


def _where(budget) -> str:
    if budget is not None:
        return "the budget passed"
    if os.environ.get(ENV):
        return f"set to {os.environ[ENV]} by --memory-budget or {ENV}"
    return f"half of this machine's {gib(machine_memory())}; raise it with --memory-budget or {ENV}"


def check_memory(need: float, what: str, *, hint: str = "", budget=None) -> int:
    """Refuse (:class:`MemoryBudgetError`) an allocation of about ``need`` bytes above the budget; return the budget.

    ``what`` names the work (``"relax with SCS on cone 'dnn', N = 2000, n = 16"``); ``hint`` says how to
    need less (``"use a smaller N"``). Call it before allocating anything that grows with the parameters.
    """
    cap = memory_budget(budget)
    if need > cap:
        tail = f"; {hint}" if hint else ""
        raise MemoryBudgetError(f"{what} needs about {gib(need)} of memory, above the memory budget of {gib(cap)} "
                                f"({_where(budget)}){tail}")
    return cap
