"""Fixtures of the Python code blocks of README.md and docs/, which the test suite runs (pytest-markdown-docs).

Every ```python block of those pages is a test: on its own, or continuing the blocks before it when its
fence says so (```python continuation in README.md, ```{.python continuation} in docs/, the form
mkdocs renders); ``notest`` marks one not run, with the reason in the text beside it. A block runs in a
fresh scratch folder (the files it writes, ``acts.npy``, ..., go there); ``fixture:NAME`` in its fence
gives it one of the fixtures below (a block that needs an optional package skips without it).
The tests' own fixtures are in tests/conftest.py.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def docs_scratch(tmp_path, monkeypatch) -> Path:
    """The folder a documentation code block runs in."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def _code_blocks_run_in_a_scratch_folder(request):
    if request.node.get_closest_marker("markdown-docs") is not None:
        request.getfixturevalue("docs_scratch")


@pytest.fixture
def distributed():
    """The Dask distributed scheduler (the ``dask`` extra)."""
    return pytest.importorskip("distributed")


@pytest.fixture
def saelens_sae_and_acts(docs_scratch):
    """``checkpoints/my_sae`` (a SAELens folder: an SAE whose optimum is known) and ``acts/`` (its
    activations in two ``.npy`` shards), for the SAE certification example."""
    pytest.importorskip("sae_lens")
    from tests.fixtures.saes import orthogonal_rays_sae
    from widelimit.sae.formats import save_saelens

    X, sae = orthogonal_rays_sae(0.5, seed=1)
    save_saelens(dataclasses.replace(sae, l1_coefficient=1.0), docs_scratch / "checkpoints" / "my_sae")  # 2 lam
    (docs_scratch / "acts").mkdir()
    for i, part in enumerate(np.array_split(X.astype(np.float32), 2)):
        np.save(docs_scratch / "acts" / f"shard_{i}.npy", part)
