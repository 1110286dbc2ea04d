"""Declarative parameter checks (widelimit/_params.py): one message format, checked before any work."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from widelimit import _params as P
from widelimit import certify_sae
from fixtures.saes import orthogonal_rays_sae

LAM = 0.5


def test_interval_words_and_message_format():
    c = P.Interval("real", 0, 1, closed="left")
    assert c.allowed == "a finite number in [0, 1)"
    assert P.check_value(0.25, c, "p") == 0.25
    for bad, got in ((1.0, "1"), (-0.5, "-0.5"), (math.nan, "nan"), ("x", "str 'x'"), (True, "bool True")):
        with pytest.raises(ValueError, match=rf"^p must be a finite number in \[0, 1\), got {got}$"):
            P.check_value(bad, c, "p")
    assert P.check_value(None, [P.NONNEG_INT, None], "n") is None
    with pytest.raises(ValueError, match=r"^n must be an integer >= 0 or None, got 2.5$"):
        P.check_value(2.5, [P.NONNEG_INT, None], "n")
    with pytest.raises(ValueError, match=r"^algo must be one of 'a', 'b', got str 'c'$"):
        P.check_value("c", P.StrOptions(("a", "b")), "algo")
    assert P.check_value(np.int64(3), P.NONNEG_INT, "n") == 3 and type(P.check_value(np.int64(3), P.NONNEG_INT, "n")) is int


def test_decorator_checks_once_before_the_body_and_converts():
    calls = []

    @P.validate_params({"x": P.ArrayLike(), "lam": P.LAM, "n": P.NONNEG_INT, "progress": P.PROGRESS})
    def f(x, *, lam, n=3, progress=None):
        calls.append((lam, n))
        return lam

    with pytest.raises(ValueError, match=r"^n must be an integer >= 0, got -1$"):
        f([1.0], lam=1.0, n=-1)
    with pytest.raises(ValueError, match=r"^progress must be a callable or None, got 3$"):
        f([1.0], lam=1.0, progress=3)
    with pytest.raises(ValueError, match=r"^lam must be a finite number > 0, got -2$"):
        f([1.0], lam=-2)
    assert calls == []  # nothing ran
    assert f([1.0], lam=np.float32(0.5)) == 0.5 and type(calls[-1][0]) is float
    assert P.constraints_of(f)["n"] is P.NONNEG_INT

    with pytest.raises(TypeError, match="no constraint for \\['b'\\]"):
        @P.validate_params({"a": P.TOL})
        def g(a, b):
            return a


def test_cli_type_gives_the_python_message():
    t = P.cli_type(P.TOL)
    assert t("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        t("-1")
    with pytest.raises(ValueError) as py:
        P.check_value(-1.0, P.TOL, "tol")
    assert str(py.value) == "tol " + str(cli.value)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a finite number >= 0, got str 'abc'$"):
        t("abc")
    assert P.cli_type(P.MAX_ITER, none="none")("none") is None


@pytest.mark.parametrize("option, value, message", [
    ("containment", -5, r"^containment must be a finite number in \[0, 1\], got -5$"),
    ("max_pairs", -1, r"^max_pairs must be an integer >= 0, got -1$"),
    ("antipodal_cosine", math.nan, r"^antipodal_cosine must be a finite number in \[-1, 1\], got nan$"),
    ("stability_witnesses", -3, r"^stability_witnesses must be an integer >= 0, got -3$"),
    ("dense_threshold", "x", r"^dense_threshold must be a finite number in \[0, 1\], got str 'x'$"),
    ("seed", "abc", r"^seed must be an integer >= 0, got str 'abc'$"),
    ("batch_size", 0, r"^batch_size must be an integer >= 1, got 0$"),
    ("coding_algorithm", "lbfgs", r"^coding_algorithm must be one of 'auto', 'cd', 'working_set', 'fista', 'screened', got"),
    ("device", "tpu", r"^device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device or None, got str 'tpu'$"),
])
def test_certify_sae_refuses_bad_options_before_work(option, value, message, monkeypatch):
    X, sae = orthogonal_rays_sae(LAM)
    import widelimit.sae.certify as C

    def boom(*a, **k):  # the body must not start
        raise AssertionError("certify_sae started work on a bad option")
    monkeypatch.setattr(C, "_certify", boom)
    with pytest.raises(ValueError, match=message):
        certify_sae(X, sae, lam=LAM, **{option: value})
