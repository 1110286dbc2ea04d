import os

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")

# The suite's property tests draw the same examples on every run (CI must not pass or fail by luck);
# `HYPOTHESIS_PROFILE=explore python3 -m pytest` searches afresh, which is how the stalls fixed in
# widelimit.exact.median were found. Failures found that way are pinned with @example. No deadline:
# hypothesis's default (200 ms per example) fails a test on a loaded machine, not for what it checks.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test: small tensors run faster so (and do not spin on a loaded machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_QUICK_RUNS: dict = {}


@pytest.fixture(scope="session")
def quick_experiment(tmp_path_factory):
    """Each registered experiment's quick mode, run once per session: ``(result, out_dir)`` by name.

    tests/lab/test_registry.py runs every registered experiment through it; the tests that check an
    experiment's numbers share the same run.
    """
    from widelimit.lab import experiments

    def run(name):
        if name not in _QUICK_RUNS:
            out = tmp_path_factory.mktemp(name.replace("-", "_"))
            _QUICK_RUNS[name] = (experiments.get(name)(out, quick=True), out)
        return _QUICK_RUNS[name]

    return run


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small valid files of every format (30 x 4 float64 unless said otherwise) and a 200 x 5 .npy.

    ``files["arrow"]`` is there only where pyarrow is installed (a test of it skips without)."""
    import torch
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("fuzzdata")
    rng = np.random.default_rng(7)
    X = rng.standard_normal((30, 4))
    out = {"X": X, "dir": d}
    np.save(d / "x.npy", X)
    np.savez(d / "x.npz", acts=X)
    np.savetxt(d / "x.csv", X, delimiter=",")
    save_file({"acts": X.astype(np.float32)}, str(d / "x.safetensors"))
    torch.save({"acts": torch.tensor(X)}, d / "x.pt")
    for k in ("npy", "npz", "csv", "safetensors", "pt"):
        out[k] = d / f"x.{k}"
    try:
        import pyarrow as pa
    except ImportError:
        pa = None
    if pa is not None:
        table = pa.table({"acts": pa.array(list(X.astype(np.float32)), type=pa.list_(pa.float32()))})
        with pa.ipc.new_stream(str(d / "x.arrow"), table.schema) as w:
            w.write_table(table)
        out["arrow"] = d / "x.arrow"
    np.save(d / "good.npy", rng.standard_normal((200, 5)))
    out["good"] = d / "good.npy"
    return out
