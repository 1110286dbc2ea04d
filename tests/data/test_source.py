"""Activation sources (widelimit.data.source): rows across shard boundaries, safetensors and Arrow shards,
and corrupted or truncated shards named in one line."""

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import widelimit as wl
import widelimit.engine.local as wl_local
from widelimit import _validation
from widelimit.data.source import ActivationSource, DataError

from fixtures.sources import clustered as _clustered
from fixtures.sources import write_npy_shards as _write_npy_shards


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 64 KiB, so the test data span many chunks and several shards per chunk."""
    monkeypatch.setattr(wl_local, "CHUNK_BYTES", 1 << 16)


# --------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 199), max_size=5, unique=True), a=st.integers(0, 200), b=st.integers(0, 200),
       idx=st.lists(st.integers(-200, 199), min_size=1, max_size=20))
def test_source_rows_match_array_across_shard_boundaries(tmp_path_factory, cuts, a, b, idx):
    X = np.arange(200 * 3, dtype=np.float32).reshape(200, 3)
    d = _write_npy_shards(tmp_path_factory.mktemp("s"), X, sorted(cuts))
    S = ActivationSource.open(d)
    assert S.shape == (200, 3) and len(S) == 200 and S.dtype == np.float32
    assert np.array_equal(S[a:b], X[a:b])
    assert np.array_equal(S[np.array(idx)], X[np.array(idx)])
    assert np.array_equal(S[idx[0]], X[idx[0]])
    assert np.array_equal(S[a:b, 1], X[a:b, 1])


def test_safetensors_shards_bf16_f16_and_natural_order(tmp_path, rng):
    import torch
    from safetensors.torch import save_file

    X = rng.standard_normal((300, 5)).astype(np.float32)
    d = tmp_path / "st"
    d.mkdir()
    t = torch.tensor(X).to(torch.bfloat16)
    save_file({"acts": t[:100].contiguous(), "ids": torch.arange(100)}, d / "acts_2.safetensors")
    save_file({"acts": t[100:].contiguous(), "ids": torch.arange(200)}, d / "acts_10.safetensors")
    S = ActivationSource.open(d, key="acts")
    assert [s.name.rsplit("/", 1)[-1] for s in S.shards] == ["acts_2.safetensors", "acts_10.safetensors"]
    assert S.storage_dtypes == ["bf16"] and S.dtype == np.float32
    assert np.array_equal(S[:], t.float().numpy())  # bf16 -> f32 is exact
    save_file({"x": torch.tensor(X).half()}, tmp_path / "h.safetensors")
    assert np.array_equal(ActivationSource.open(tmp_path / "h.safetensors")[:], X.astype(np.float16).astype(np.float32))
    with pytest.raises(DataError, match="several tensors"):
        ActivationSource.open(d)


def test_datasets_arrow_cache_as_saelens_writes_it(tmp_path, rng):
    datasets = pytest.importorskip("datasets")
    X = rng.standard_normal((60 * 8, 6)).astype(np.float32)
    hook = "blocks.3.hook_resid_pre"
    feats = datasets.Features({hook: datasets.Array2D(shape=(8, 6), dtype="float32"),
                               "token_ids": datasets.Sequence(datasets.Value("int32"), length=8)})
    for i in range(2):  # SAELens' shard_0, shard_1 folders, each a save_to_disk dataset
        part = X[i * 240 : (i + 1) * 240].reshape(30, 8, 6)
        ds = datasets.Dataset.from_dict({hook: part, "token_ids": np.zeros((30, 8), np.int32)}, features=feats)
        ds.save_to_disk(str(tmp_path / "cache" / f"shard_{i}"), num_shards=2)
    S = ActivationSource.open(tmp_path / "cache")
    assert S.shape == X.shape and len(S.shards) == 4
    assert np.array_equal(S[:], X) and np.array_equal(S[5:413], X[5:413])
    # one vector per row (Sequence(float)) and a single .arrow file
    ds = datasets.Dataset.from_dict({"acts": X}, features=datasets.Features({"acts": datasets.Sequence(datasets.Value("float32"))}))
    ds.save_to_disk(str(tmp_path / "flat"))
    S2 = ActivationSource.open(tmp_path / "flat", column="acts")
    assert np.array_equal(S2[100:200], X[100:200])
    with pytest.raises(DataError, match="no column"):
        ActivationSource.open(tmp_path / "flat", column="nope")


def test_corrupted_and_truncated_shards_name_the_shard(tmp_path, rng):
    X = rng.standard_normal((100, 4)).astype(np.float32)
    d = _write_npy_shards(tmp_path, X, [40, 70])
    bad = d / "part_1.npy"
    bad.write_bytes(bad.read_bytes()[:-10])  # truncated
    with pytest.raises(DataError, match=r"part_1\.npy: truncated"):
        ActivationSource.open(d)
    bad.write_bytes(b"\x93NUMPY garbage" + b"\0" * 200)  # corrupted header
    with pytest.raises(DataError, match=r"part_1\.npy: corrupted"):
        ActivationSource.open(d)
    np.save(bad, X[:30, :3])  # wrong width
    with pytest.raises(DataError, match=r"part_1\.npy: shard has 3 dims"):
        ActivationSource.open(d)

    from safetensors.numpy import save_file

    p = tmp_path / "a.safetensors"
    save_file({"x": X}, p)
    raw = p.read_bytes()
    p.write_bytes(raw[:-100])
    with pytest.raises(DataError, match=r"a\.safetensors: truncated"):
        ActivationSource.open(p)
    p.write_bytes(struct.pack("<Q", 40) + b"{not json" + b" " * 31 + raw[48:])
    with pytest.raises(DataError, match=r"a\.safetensors: corrupted"):
        ActivationSource.open(p)
    p.write_bytes(struct.pack("<Q", 10**12) + raw[8:])
    with pytest.raises(DataError, match=r"a\.safetensors: corrupted or truncated"):
        ActivationSource.open(p)


def test_truncated_arrow_shard_names_it(tmp_path, rng):
    datasets = pytest.importorskip("datasets")
    X = rng.standard_normal((200, 4)).astype(np.float32)
    ds = datasets.Dataset.from_dict({"acts": X}, features=datasets.Features({"acts": datasets.Sequence(datasets.Value("float32"))}))
    ds.save_to_disk(str(tmp_path / "c"), num_shards=2)
    f = tmp_path / "c" / "data-00001-of-00002.arrow"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(DataError, match=r"data-00001-of-00002\.arrow"):
        ActivationSource.open(tmp_path / "c")


def test_nonfinite_row_is_reported_with_its_shard(tmp_path, rng):
    X = _clustered(rng, N=3000, n=6)
    X[2345, 2] = np.nan
    S = ActivationSource.open(_write_npy_shards(tmp_path, X, [1000, 2000]))
    # shape checks only, without reading
    assert _validation.check_data(S) is S
    with pytest.raises(ValueError, match=r"part_2\.npy: non-finite value \(NaN\) in row 345 \(0-based; row 2345 of "):
        _validation.check_data(S, finite=True)
    with pytest.raises(ValueError, match=r"part_2\.npy: non-finite value \(NaN\) in row 345 \(0-based; row 2345 of "):
        wl.huber_median(S, lam=1.0)
    with pytest.raises(ValueError, match="row 2345"):
        wl.geometric_median(S)


def _mapped_kb(path) -> int:
    """Resident kB of this process's maps of ``path`` (/proc/self/smaps): the pages a memory map keeps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line: address range ... [path]
                inside = len(head) >= 6 and head[5] == os.path.realpath(path)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc")
def test_certify_sae_reads_a_memory_map_through_its_file(tmp_path):
    """Issue 31 item 5: a pass over ``np.load(mmap_mode="r")`` kept every page it touched resident (a 10^6-token
    stream grew by the whole 1.5 GB file); the file is read with positional reads instead, so none of the
    map's pages become resident (the kernel's own count of the map's resident pages, /proc/self/smaps)."""
    from fixtures.saes import orthogonal_rays_sae
    from widelimit import certify_sae

    X, sae = orthogonal_rays_sae(0.5, dim=256, points_per_ray=40, seed=3)  # 320 x 256 float64: 160 pages
    path = tmp_path / "acts.npy"
    np.save(path, X)
    mm = np.load(path, mmap_mode="r")
    ref = certify_sae(X, sae, lam=0.5, device="cpu")
    cert = certify_sae(mm, sae, lam=0.5, device="cpu")
    assert cert.sae_objective == pytest.approx(ref.sae_objective, rel=1e-12)
    assert cert.lower_bound == pytest.approx(ref.lower_bound, rel=1e-12)
    assert _mapped_kb(path) == 0
    np.asarray(mm).sum()  # the same map, read through it: its pages are resident (the measurement sees them)
    assert _mapped_kb(path) >= X.nbytes // 1024


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_unmapped_reads_the_rows_of_the_map(tmp_path, mode):
    """Rows of a memory map, and of a row slice of one (its first row at a file offset of its own), read back
    through the file; a copy-on-write map (its writes are not in the file) and arrays are left as they are."""
    from widelimit.data.source import unmapped

    X = np.random.default_rng(0).standard_normal((300, 7)).astype(np.float32)
    path = tmp_path / "a.npy"
    np.save(path, X)
    mm = np.load(path, mmap_mode=mode)
    for view, ref in ((mm, X), (mm[123:250], X[123:250])):
        src = unmapped(view)
        assert isinstance(src, ActivationSource) and src.shape == ref.shape
        np.testing.assert_array_equal(src[0 : ref.shape[0]], ref)
    cow = np.load(path, mmap_mode="c")
    cow[0, 0] = 42.0
    assert unmapped(cow) is cow and unmapped(X) is X and unmapped(mm[:, :3]) is not None
    assert not isinstance(unmapped(mm[:, :3]), ActivationSource)  # not C-contiguous: the map itself
