"""Declarative checks of public parameters: one constraint per parameter, checked once at the boundary.

Every public function (``widelimit.__all__`` and the :class:`~widelimit.Problem` methods) states what
each of its parameters accepts, and :func:`validate_params` checks the arguments of a call against it
before any work, in the spirit of scikit-learn's ``validate_params``::

    @validate_params({"X": Data(), "lam": LAM, "tol": TOL, "max_iter": MAX_ITER, "progress": PROGRESS})
    def solver(X, *, lam, tol=1e-6, max_iter=100, progress=None): ...

A bad argument is one ``ValueError`` line in one format, ``NAME must be ALLOWED, got VALUE``
(``max_pairs must be an integer >= 0, got -1``). The checks convert as they accept (``lam`` to a
``float``, data through :func:`~widelimit._validation.check_data`), so the function body gets checked
values and layers below it do not check them again. Defaults are not checked (they are the
function's own). The same constraints build the command line's argparse types (:func:`cli_type`), so a
flag and its Python parameter are refused with the same words, and they check the fields of frozen
option dataclasses (:func:`check_fields`).

A constraint is a :class:`Constraint`, ``None`` (the value ``None`` is allowed), or a list of these
(any one of them). The scalar checks are those of :mod:`widelimit._validation` (``check_int``,
``check_real``, ``check_lam``, ``check_data``); this module only says which applies to which parameter.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import re
from typing import Any, Callable as _Callable

import numpy as np

from ._runtime import check_threads
from ._validation import check_data, check_int, check_lam, check_real, interval_words, shown

__all__ = [
    "Constraint", "Interval", "StrOptions", "String", "Options", "Boolean", "Callable", "ArrayLike", "Data", "Lam", "Device",
    "Device", "PathLike", "InstanceOf", "Passed", "validate_params", "check_value", "check_fields", "cli_type",
    "constraints_of", "TOL", "MAX_ITER", "TIME_LIMIT", "THREADS", "DEVICE", "SEED", "PROGRESS", "LAM",
    "POSITIVE", "NONNEG", "POSITIVE_INT", "NONNEG_INT", "UNIT_OPEN",
]


class _Reject(Exception):
    """A constraint does not accept a value (the caller writes the one message)."""


class Constraint:
    """What one parameter accepts: :attr:`allowed` (words) and :meth:`convert` (the accepted value)."""

    allowed: str = "a value"

    def convert(self, value, name: str):
        """The value as the function receives it; raises ``_Reject`` (or a ``ValueError`` with a full
        message of the underlying check) when the value is not allowed."""
        return value

    def parse(self, text: str):
        """The Python value a command-line string stands for (before :meth:`convert`)."""
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.allowed!r})"


class Interval(Constraint):
    """A real (``kind="real"``, finite) or integer (``kind="int"``) number in an interval.

    ``closed`` is ``"both"``, ``"left"``, ``"right"`` or ``"neither"``; ``None`` for an end means
    unbounded on that side. Bools are refused. Checked by
    :func:`~widelimit._validation.check_int` / :func:`~widelimit._validation.check_real`.
    """

    def __init__(self, kind: str, low=None, high=None, *, closed: str = "both", finite: bool = True):
        if kind not in ("real", "int") or closed not in ("both", "left", "right", "neither"):
            raise TypeError(f"Interval({kind!r}, closed={closed!r})")
        self.kind, self.low, self.high, self.finite = kind, low, high, finite
        self.low_strict = closed in ("right", "neither")
        self.high_strict = closed in ("left", "neither")
        if kind == "int" and (self.low_strict or self.high_strict):
            raise TypeError("an integer Interval is closed: write Interval('int', 1, None) for > 0")
        self.allowed = interval_words(kind, low, high, low_strict=self.low_strict, high_strict=self.high_strict,
                                      finite=finite)

    def convert(self, value, name):
        if self.kind == "int":
            return check_int(value, name, low=self.low, high=self.high)
        return check_real(value, name, low=self.low, strict=self.low_strict, high=self.high,
                          high_strict=self.high_strict, finite=self.finite)

    def parse(self, text):
        try:
            return int(text) if self.kind == "int" else float(text)
        except (TypeError, ValueError):
            return text


class Threads(Constraint):
    """A thread count: an integer from 1 to :func:`widelimit._runtime.max_threads` (4 per usable core: more
    only contend for the cores, and 1000 BLAS threads ended in MemoryError). Checked by
    :func:`widelimit._runtime.check_threads`, which every thread setting goes through."""

    allowed = "an integer >= 1 and at most 4 per usable core"

    def convert(self, value, name):
        return check_threads(value, name)

    def parse(self, text):
        try:
            return int(text)
        except (TypeError, ValueError):
            return text


class StrOptions(Constraint):
    """One of a set of strings (compared exactly, or after ``fold="lower"`` / ``"upper"``)."""

    def __init__(self, options, *, fold: str | None = None):
        self.options = tuple(options)
        self.fold = fold
        self.allowed = "one of " + ", ".join(repr(o) for o in self.options)

    def convert(self, value, name):
        if isinstance(value, str):
            v = getattr(value, self.fold)() if self.fold else value
            if v in self.options:
                return v
        raise _Reject


class String(Constraint):
    """Any string (a name the function looks up itself: an array's key in a file, a column; a size the
    function parses)."""

    allowed = "a string"

    def __init__(self, *, allowed: str | None = None):
        if allowed:
            self.allowed = allowed

    def convert(self, value, name):
        if isinstance(value, str):
            return value
        raise _Reject


class Options(Constraint):
    """One of a set of values of any type (``{1, 2}``, ``{True, False, "auto"}``)."""

    def __init__(self, options):
        self.options = tuple(options)
        self.allowed = "one of " + ", ".join(repr(o) for o in self.options)

    def convert(self, value, name):
        for o in self.options:
            if type(value) is type(o) and value == o:
                return value
        raise _Reject


class Boolean(Constraint):
    """``True`` or ``False`` (a Python or NumPy bool; ``0`` and ``"yes"`` are refused)."""

    allowed = "True or False"

    def convert(self, value, name):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _Reject

    def parse(self, text):
        return {"true": True, "false": False}.get(str(text).lower(), text)


class Callable(Constraint):
    """A callable (a function, a method, an object with ``__call__``)."""

    allowed = "a callable"

    def convert(self, value, name):
        if callable(value):
            return value
        raise _Reject


class ArrayLike(Constraint):
    """An array: NumPy, torch, scipy.sparse, a list of numbers, a memory map or a Dask array.

    Only the kind is checked here (not a string, not a scalar); shapes against the other arguments are
    checked by the function (``check_dictionary``, ``check_codes``, ``check_vector``)."""

    allowed = "an array"

    def __init__(self, *, allowed: str | None = None):
        if allowed:
            self.allowed = allowed

    def convert(self, value, name):
        if isinstance(value, (str, bytes, bool, int, float, dict, set)) or value is None:
            raise _Reject
        if not (hasattr(value, "shape") or hasattr(value, "__array__") or isinstance(value, (list, tuple))):
            raise _Reject
        return value


class Data(Constraint):
    """A data matrix ``(N, n)``: :func:`~widelimit._validation.check_data` (its messages name the row).

    ``finite=False``: finiteness is left to the computation's first pass (a source or a large array);
    ``paths=True``: a ``str`` / ``os.PathLike`` is opened with :func:`widelimit.open_activations`.
    """

    allowed = "a 2-D array of data (N points, n dims)"

    def __init__(self, *, finite: bool | None = None, paths: bool = False):
        self.finite, self.paths = finite, paths
        if paths:
            self.allowed = "a 2-D array of data (N points, n dims) or a path"

    def convert(self, value, name):
        if self.paths and isinstance(value, (str, os.PathLike)):
            return value  # opened by the function (it knows the key / column options)
        if isinstance(value, (str, bytes, bool, int, float)) or value is None:
            raise _Reject
        return check_data(value, name, finite=self.finite)


class Lam(Constraint):
    """The sparsity ``lam``: :func:`~widelimit._validation.check_lam` (finite, ``>= 2^-1022``)."""

    allowed = "a finite number > 0"

    def convert(self, value, name):
        return check_lam(value) if name == "lam" else _renamed(check_lam, value, name)

    def parse(self, text):
        try:
            return float(text)
        except (TypeError, ValueError):
            return text


class Device(Constraint):
    """A device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` (whether CUDA is
    there is checked when the device is used, by :func:`widelimit._runtime.resolve_device`)."""

    allowed = "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device"

    def convert(self, value, name):
        if isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", value.lower()):
            return value.lower()
        if type(value).__module__ == "torch" and type(value).__name__ == "device":
            return value
        raise _Reject


class PathLike(Constraint):
    """A file or folder path (``str`` or ``os.PathLike``)."""

    allowed = "a file or folder path (str or os.PathLike)"

    def convert(self, value, name):
        if isinstance(value, (str, os.PathLike)) and str(value):
            return value
        raise _Reject


class InstanceOf(Constraint):
    """An instance of one of the given classes (given as classes or as ``"module:Name"`` strings,
    imported when first checked, so that this module imports nothing heavy)."""

    def __init__(self, *types, allowed: str | None = None):
        self._types = types
        self.allowed = allowed or "a " + " or a ".join(t if isinstance(t, str) else t.__name__ for t in types)

    def convert(self, value, name):
        for t in self._types:
            if isinstance(t, str):
                mod, _, attr = t.partition(":")
                t = getattr(importlib.import_module(mod), attr)
            if isinstance(value, t):
                return value
        raise _Reject


class Passed(Constraint):
    """Passed on unchecked to a function that checks it itself (``to``: ``widelimit.solve`` for
    ``Problem.solve(**options)``), or a value whose kind the function checks in context (``why``)."""

    def __init__(self, to: str):
        self.to = to
        self.allowed = f"what {to} accepts"


def _renamed(check, value, name):
    """Run a check whose messages say ``lam`` for a parameter of another name."""
    try:
        return check(value)
    except ValueError as e:
        raise ValueError(str(e).replace("lam", name, 1)) from None


def _allowed(constraint) -> str:
    if constraint is None:
        return "None"
    if isinstance(constraint, list):
        return " or ".join(_allowed(c) for c in constraint)
    return constraint.allowed


def check_value(value, constraint, name: str):
    """``value`` checked against ``constraint`` (a :class:`Constraint`, ``None`` or a list of them),
    converted; a ``ValueError`` ``NAME must be ALLOWED, got VALUE`` otherwise."""
    options = constraint if isinstance(constraint, list) else [constraint]
    if value is None and None in options:
        return None
    real = [c for c in options if c is not None]
    for c in real:
        try:
            return c.convert(value, name)
        except _Reject:
            continue
        except ValueError:
            if len(options) == 1:
                raise  # the underlying check's own message (it names the row, the bound, ...)
            continue
    raise ValueError(f"{name} must be {_allowed(constraint)}, got {shown(value)}")


def validate_params(constraints: dict[str, Any], *, error: type = ValueError):
    """Decorator: check every argument of a call against its constraint, once, before the body runs.

    ``constraints`` maps each parameter name (``**options`` included, by its name, to one constraint for
    every option or to a dict ``{option: constraint}``, other options refused) to a constraint; a
    parameter without one is a ``TypeError`` when the function is defined (``self`` / ``cls`` excepted),
    and so is a constraint for a parameter the function does not have. The wrapper keeps the signature
    and docstring (``functools.wraps``); the constraints are at ``wrapper.__wl_constraints__``. ``error``: the
    ``ValueError`` subclass a refusal raises (``widelimit.DataError`` for the data readers).
    """
    def deco(fn):
        sig = inspect.signature(fn)
        names = [p for p in sig.parameters if p not in ("self", "cls")]
        missing = [p for p in names if p not in constraints]
        extra = [p for p in constraints if p not in names]
        if missing or extra:
            raise TypeError(f"validate_params of {fn.__qualname__}: no constraint for {missing}, "
                            f"constraints for unknown parameters {extra}")
        var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                bound = _checked(sig.bind(*args, **kwargs))
            except ValueError as e:
                if error is ValueError or isinstance(e, error):
                    raise
                raise error(str(e)) from None
            return fn(*bound.args, **bound.kwargs)

        def _checked(bound):
            for name, value in bound.arguments.items():
                if name in ("self", "cls"):
                    continue
                c = constraints[name]
                if name == var_kw and isinstance(c, dict):  # each named option its own constraint
                    unknown = sorted(set(value) - set(c))
                    if unknown:
                        raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {unknown[0]!r} "
                                        f"(its options: {', '.join(sorted(c))})")
                    bound.arguments[name] = {k: check_value(v, c[k], k) for k, v in value.items()}
                elif name == var_kw:
                    if not isinstance(c, Passed):
                        bound.arguments[name] = {k: check_value(v, c, k) for k, v in value.items()}
                elif not isinstance(c, Passed):
                    bound.arguments[name] = check_value(value, c, name)
            return bound

        wrapper.__wl_constraints__ = dict(constraints)
        return wrapper

    return deco


def constraints_of(fn) -> dict | None:
    """The constraints :func:`validate_params` put on ``fn`` (a function, or a method of a class), or ``None``."""
    return getattr(fn, "__wl_constraints__", None)


def check_fields(obj, constraints: dict[str, Any]) -> None:
    """Check (and convert) the fields of a frozen dataclass instance in its ``__post_init__``::

        def __post_init__(self):
            check_fields(self, {"max_pairs": NONNEG_INT, "seed": SEED})
    """
    for name, c in constraints.items():
        value = getattr(obj, name)
        new = check_value(value, c, name)
        if new is not value:
            object.__setattr__(obj, name, new)


def cli_type(constraint, *, none: str | None = None) -> _Callable[[str], Any]:
    """An argparse ``type=`` from a constraint: the flag's text parsed, then checked as in Python.

    The message is the Python message without the parameter's name (argparse puts the flag in front):
    ``argument --tol: must be a finite number >= 0, got -1.0``. ``none`` is the text that stands for
    ``None`` (``"none"``), when the constraint allows it.
    """
    options = constraint if isinstance(constraint, list) else [constraint]
    parser = next((c for c in options if c is not None and type(c).parse is not Constraint.parse), None)

    def parse(text: str):
        if none is not None and text == none and None in options:
            return None
        value = parser.parse(text) if parser is not None else text
        try:
            return check_value(value, constraint, "\0")
        except ValueError as e:
            msg = str(e)
            raise argparse.ArgumentTypeError(msg[2:] if msg.startswith("\0 ") else msg.replace("\0", "value"))

    return parse


# --------------------------------------------------------------------------------------
# the glossary's options (docs/api.md): one constraint each, shared by every function and the CLI
# --------------------------------------------------------------------------------------

#: ``tol``: the relative tolerance of a certified gap, a finite number >= 0.
TOL = Interval("real", 0, None)
#: ``max_iter``: an iteration / round / node budget, an integer >= 0 (``None``: the function's own default).
MAX_ITER = [Interval("int", 0, None), None]
#: ``time_limit``: seconds, a number >= 0 (``inf`` or ``None``: no limit, or the function's default).
TIME_LIMIT = [Interval("real", 0, None, finite=False), None]
#: ``threads``: worker threads, an integer from 1 to 4 per usable core (``None``: the machine's cores).
THREADS = [Threads(), None]
#: ``device``: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (or a ``torch.device``).
DEVICE = [Device(), None]
#: ``seed``: an integer >= 0.
SEED = Interval("int", 0, None)
#: ``progress``: a callable receiving :class:`widelimit.Progress` events, or ``None``.
PROGRESS = [Callable(), None]
#: ``lam``: the sparsity, a finite number >= 2^-1022.
LAM = Lam()
POSITIVE = Interval("real", 0, None, closed="right")
NONNEG = Interval("real", 0, None)
POSITIVE_INT = Interval("int", 1, None)
NONNEG_INT = Interval("int", 0, None)
UNIT_OPEN = Interval("real", 0, 1, closed="neither")
