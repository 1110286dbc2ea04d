"""Tests for widelimit.lab.frames: finite-field polynomial-incidence frames, random frames, Welch bounds."""

from __future__ import annotations

import numpy as np
import pytest

from widelimit.lab import frames as fr
from widelimit.lab import superposition as sp


@pytest.mark.parametrize(
    "q,r", [(2, 1), (3, 1), (3, 2), (5, 0), (5, 2), (5, 4), (7, 2), (11, 1), (4, 1), (4, 3), (8, 2), (9, 2), (16, 1)]
)
def test_finite_field_frame_coherence_equals_prediction(q, r):
    F = fr.finite_field_frame(q, r)
    assert F.vectors.shape == (q * q, q ** (r + 1))
    assert np.allclose(np.linalg.norm(F.vectors, axis=0), 1.0)
    assert fr.coherence(F) == pytest.approx(r / q, abs=1e-12)
    assert F.predicted_coherence == pytest.approx(r / q)
    G = F.vectors.T @ F.vectors
    assert np.allclose(np.round(G * q), G * q)  # entries are multiples of 1/q
    # every row holds value k/q exactly E[k] times (the histogram used for exact sums)
    E = fr.finite_field_root_counts(q, r)
    assert E.sum() == q ** (r + 1) - 1
    for i in (0, G.shape[0] // 2, G.shape[0] - 1):
        row = np.delete(np.round(G[i] * q).astype(int), i)
        assert np.array_equal(np.bincount(row, minlength=r + 1), E)


@pytest.mark.parametrize("q,r,m", [(3, 2, 1), (5, 2, 3), (5, 3, 5), (7, 2, 3)])
def test_finite_field_exact_sums_and_optimum_match_explicit(q, r, m):
    F = fr.finite_field_frame(q, r)
    assert fr.finite_field_power_sum(q, r, m) == pytest.approx(fr.frame_power_sum(F, m), rel=1e-10)
    p = 0.01
    ff = sp.finite_field_optimum(q, r, p, m, "gaussian")
    explicit = sp.scaled_frame(F.vectors, p, m, "gaussian")
    assert ff["value"] == pytest.approx(explicit.value, rel=1e-10)
    assert ff["c"] == pytest.approx(explicit.c, rel=1e-10)


def test_welch_bounds_hold():
    for d, n, seed in [(4, 9, 0), (5, 30, 1), (9, 27, 2)]:
        R = fr.random_frame(d, n, seed=seed)
        assert fr.coherence(R) >= fr.welch_bound(d, n) - 1e-12
        assert fr.coherence(R) >= fr.welch_coherence_bound(d, n)[0] - 1e-12
        for k in (1, 2, 3):
            assert fr.frame_power_sum(R, k) >= fr.welch_sum_bound(d, n, k) * (1 - 1e-12)
    for q, r in [(3, 2), (5, 2), (7, 3)]:
        d, n = q * q, q ** (r + 1)
        assert r / q >= fr.welch_bound(d, n)
        for k in (1, 2, 3):
            assert fr.finite_field_power_sum(q, r, k) >= fr.welch_sum_bound(d, n, k) * (1 - 1e-12)
    # an orthonormal basis meets the k = 1 bound with equality; d = 2 three-direction frame too
    ang = np.pi * np.arange(3) / 3
    V = np.stack([np.cos(ang), np.sin(ang)])
    assert fr.frame_power_sum(V, 1) == pytest.approx(fr.welch_sum_bound(2, 3, 1))
    assert fr.coherence(V) == pytest.approx(fr.welch_bound(2, 3))


@pytest.mark.parametrize("q", [2, 3, 4, 8, 9, 16, 25, 27])
def test_gf_tables_form_a_field(q):
    add, mul = fr.gf_tables(q)
    els = set(range(q))
    assert all(set(add[x].tolist()) == els for x in range(q))  # additive group rows are permutations
    assert all(set(mul[x, 1:].tolist()) == els - {0} for x in range(1, q))  # no zero divisors
    assert (add[0] == np.arange(q)).all() and (mul[1] == np.arange(q)).all() and (mul[0] == 0).all()
    x, y, z = np.meshgrid(np.arange(q), np.arange(q), np.arange(q), indexing="ij")
    assert (mul[x, add[y, z]] == add[mul[x, y], mul[x, z]]).all()  # distributive
    assert (mul[mul[x, y], z] == mul[x, mul[y, z]]).all()  # associative
    p = fr.prime_power(q)[0]
    px = np.zeros(q, dtype=int)
    for _ in range(p):  # characteristic p: adding any x to itself p times gives 0
        px = add[px, np.arange(q)]
    assert (px == 0).all()


def test_prime_power():
    assert fr.prime_power(49) == (7, 2) and fr.prime_power(2) == (2, 1)
    assert fr.prime_power(12) is None and fr.prime_power(1) is None and fr.prime_power(True) is None


def test_frame_input_errors():
    with pytest.raises(ValueError, match="prime power"):
        fr.finite_field_root_counts(1, 0)
    with pytest.raises(ValueError, match="prime power"):
        fr.finite_field_frame(12, 1)
    with pytest.raises(ValueError, match="positive integer"):
        fr.random_frame(0, 3)
    with pytest.raises(ValueError, match="positive integer"):
        fr.frame_power_sum(np.eye(2), 0)
    with pytest.raises(ValueError, match="non-finite"):
        fr.coherence(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="entries"):
        fr.finite_field_frame(31, 5)
