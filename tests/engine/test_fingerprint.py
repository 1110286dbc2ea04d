"""The data fingerprint (widelimit.engine.fingerprint): every row and its order count, the chunking does not,
and the numba XXH64 equals the xxhash library's."""

import numpy as np


def test_fingerprint_sees_every_row_and_not_the_chunking():
    from widelimit.engine import fingerprint_of
    from widelimit.engine.fingerprint import _keep, _none
    from widelimit.engine.local import LocalEngine

    X = np.random.default_rng(1).standard_normal((5000, 3))
    f = fingerprint_of(X)
    for i in (0, 2500, 4999):  # any single row, one ulp
        Y = X.copy()
        Y[i, 1] = np.nextafter(Y[i, 1], np.inf)
        assert fingerprint_of(Y) != f
    assert fingerprint_of(X[::-1].copy()) != f  # the order of the rows counts
    assert fingerprint_of(X.astype(np.float32)) != f
    for rows in (1, 7, 999):
        e = LocalEngine(X, rows=rows)
        e.reduce(_none, _keep, fingerprint=True)
        assert e.fingerprint == f


def test_fingerprint_kernel_is_xxh64():
    """The numba XXH64 against the real xxhash library, every tail length of a row."""
    import xxhash

    from widelimit.engine.fingerprint import row_hashes

    rng = np.random.default_rng(2)
    for n in range(1, 20):
        for dt in (np.float32, np.float64):
            X = rng.standard_normal((3, n)).astype(dt)
            got = [int(h) for h in row_hashes(X, 41)]
            assert got == [xxhash.xxh64_intdigest(X[i].tobytes(), seed=41 + i) for i in range(3)]
