"""Readers refuse what they cannot read faithfully, in one line naming where (issue 29).

A folder holding more than one kind of data; Arrow rows of different lengths; shards whose tensors have
different names; ``.npy`` versions numpy refuses (and the format 3.0 that numpy reads); ``.pt`` tensors that
are not plain dense arrays. Each answered silently with other data, or with an internal error, before.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.numpy import save_file

import widelimit as wl
from widelimit.cli import main


def _arrow(path, rows, type_=None):
    t = pa.table({"acts": pa.array(rows, type=type_ or pa.list_(pa.float32()))})
    with pa.ipc.new_stream(str(path), t.schema) as w:
        w.write_table(t)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


# --------------------------------------------------------------------------------------
# a folder holds one kind of data
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stray", ["arrow", "state.json sub-folder", "npz", "safetensors"])
def test_npy_shards_with_a_stray_file_of_another_kind(tmp_path, stray):
    X = np.random.default_rng(0).standard_normal((400, 3))
    d = tmp_path / "shards"
    d.mkdir()
    for i in range(4):
        np.save(d / f"part_{i}.npy", X[100 * i: 100 * (i + 1)])
    if stray == "arrow":
        _arrow(d / "stray.arrow", [[1.0, 2.0, 3.0]] * 10)
        kind, example = "a datasets / Arrow cache", "stray.arrow"
    elif stray == "state.json sub-folder":
        (d / "cache").mkdir()
        (d / "cache" / "state.json").write_text('{"_data_files": []}')
        kind, example = "datasets cache sub-folders", "cache"
    elif stray == "npz":
        np.savez(d / "extra.npz", a=X[:5])
        kind, example = ".npz files", "extra.npz"
    else:
        save_file({"acts": X[:5].astype(np.float32)}, str(d / "extra.safetensors"))
        kind, example = ".safetensors shards", "extra.safetensors"
    with pytest.raises(wl.DataError) as e:
        wl.open_activations(d)
    msg = _one_line(e)
    assert msg.startswith(f"{d}: holds more than one kind of data: ") and ".npy shards (e.g. part_0.npy)" in msg
    assert f"{kind}" in msg and f"(e.g. {example})" in msg and msg.endswith("keep one kind per folder"), msg
    (d / example).unlink() if (d / example).is_file() else __import__("shutil").rmtree(d / example)
    assert np.array_equal(np.asarray(wl.open_activations(d)), X)  # one kind again: every row, in order


def test_a_datasets_cache_with_its_json_files_is_one_kind(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    _arrow(d / "data-00000-of-00001.arrow", rows.tolist())
    (d / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    (d / "dataset_info.json").write_text("{}")
    assert np.array_equal(np.asarray(wl.open_activations(d)), rows)


# --------------------------------------------------------------------------------------
# ragged Arrow rows
# --------------------------------------------------------------------------------------


def test_ragged_arrow_rows_are_refused_by_row(tmp_path):
    """Lengths 4, 2, 6 sum to 12 = 3 x 4: the old total check re-cut them into vectors that are not in the data."""
    p = tmp_path / "r.arrow"
    _arrow(p, [[1.0, 2, 3, 4], [5.0, 6], [7.0, 8, 9, 10, 11, 12]])
    with pytest.raises(wl.DataError) as e:
        np.asarray(wl.open_activations(p))
    assert _one_line(e) == (f"{p}: ragged rows in column 'acts': row 1 holds a list of 2 values where row 0 holds "
                            "4; every row must have the same shape")


def test_ragged_blocks_of_an_array2d_column(tmp_path):
    p = tmp_path / "b.arrow"
    _arrow(p, [[[1.0, 2], [3, 4]], [[5.0, 6], [7, 8]], [[1.0, 2], [3, 4, 5]]], pa.list_(pa.list_(pa.float64())))
    with pytest.raises(wl.DataError, match=r"row 2 holds a list of 3 values where row 0 holds 2"):
        np.asarray(wl.open_activations(p))
    q = tmp_path / "ok.arrow"
    _arrow(q, [[[1.0, 2], [3, 4]], [[5.0, 6], [7, 8]]], pa.list_(pa.list_(pa.float64())))
    assert np.array_equal(np.asarray(wl.open_activations(q)), np.arange(1, 9, dtype=float).reshape(4, 2))


def test_ragged_rows_on_the_command_line(tmp_path, capsys):
    p = tmp_path / "r.arrow"
    _arrow(p, [[1.0, 2, 3, 4], [5.0, 6], [7.0, 8, 9, 10, 11, 12]])
    assert main(["bound", str(p), "--lam", "1", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ragged rows in column 'acts': row 1" in err, err


# --------------------------------------------------------------------------------------
# shards whose tensors differ in name; .npy versions
# --------------------------------------------------------------------------------------


def test_shards_with_different_tensor_names_ask_for_key(tmp_path, capsys):
    d = tmp_path / "st"
    d.mkdir()
    save_file({"acts": np.ones((3, 4), np.float32)}, str(d / "a.safetensors"))
    save_file({"resid": np.zeros((5, 4), np.float32)}, str(d / "b.safetensors"))
    with pytest.raises(wl.DataError) as e:
        wl.open_activations(d)
    assert _one_line(e) == (f"{d}: its shards hold tensors of different names: 'acts' (e.g. a.safetensors), "
                            "'resid' (e.g. b.safetensors); name the one to read with key=... (every shard must "
                            "hold it)")
    assert main(["bound", str(d), "--lam", "1"]) == 2
    assert "name the one to read with --key (every shard must hold it)" in capsys.readouterr().err
    save_file({"acts": np.zeros((5, 4), np.float32), "resid": np.ones((5, 4), np.float32)}, str(d / "b.safetensors"))
    assert wl.open_activations(d, key="acts").shape == (8, 4)


def _npy_bytes(X, version):
    b = io.BytesIO()
    np.lib.format.write_array(b, X, version=version)
    return bytearray(b.getvalue())


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_every_npy_version_numpy_reads_is_read(tmp_path, version):
    X = np.arange(12.0).reshape(4, 3)
    p = tmp_path / "x.npy"
    p.write_bytes(bytes(_npy_bytes(X, version)))
    assert np.array_equal(np.load(p), X)  # numpy's own reading
    assert np.array_equal(np.asarray(wl.open_activations(p)), X)


@pytest.mark.parametrize("minor", [1, 5])
def test_a_version_numpy_refuses_is_refused(tmp_path, minor):
    raw = _npy_bytes(np.arange(12.0).reshape(4, 3), (1, 0))
    raw[7] = minor
    p = tmp_path / "x.npy"
    p.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="we only support format version"):
        np.load(p)
    with pytest.raises(wl.DataError) as e:
        wl.open_activations(p)
    assert f"format version 1.{minor}, which numpy does not read (it reads 1.0, 2.0, 3.0)" in _one_line(e)


# --------------------------------------------------------------------------------------
# exotic .pt tensors
# --------------------------------------------------------------------------------------


def _exotic():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "float8": (torch.zeros(3, 4).to(torch.float8_e4m3fn), "has dtype torch.float8_e4m3fn"),
            "uint16": (torch.zeros(3, 4, dtype=torch.uint16), "has dtype torch.uint16"),
            "meta": (torch.empty(3, 4, device="meta"), "is on the meta device: the file holds its shape (3, 4)"),
            "sparse": (torch.eye(3).to_sparse(), "has layout torch.sparse_coo"),
            "quantized": (torch.quantize_per_tensor(torch.rand(3, 4), 0.1, 0, torch.quint8), "is quantized"),
            "nested": (torch.nested.nested_tensor([torch.rand(2), torch.rand(3)]), "is a nested tensor"),
        }


@pytest.mark.parametrize("kind", ["float8", "uint16", "meta", "sparse", "quantized", "nested"])
def test_exotic_pt_tensors_named_in_one_line(tmp_path, kind):
    t, needle = _exotic()[kind]
    p = tmp_path / "x.pt"
    torch.save({"other": torch.zeros(2, 2), "acts": t}, p)
    with pytest.raises(wl.DataError) as e:
        wl.open_activations(p, key="acts")
    msg = _one_line(e)
    assert msg.startswith(f"{p}: tensor 'acts' ") and needle in msg, msg


def test_exotic_tensor_in_an_sae_file(tmp_path):
    from widelimit.sae.formats._io import read_pt
    from widelimit.sae.model import SAEFormatError

    p = tmp_path / "ae.pt"
    torch.save({"encoder.weight": torch.zeros(4, 3).to(torch.float8_e5m2)}, p)
    with pytest.raises(SAEFormatError, match=r"ae\.pt: tensor 'encoder\.weight' has dtype torch\.float8_e5m2"):
        read_pt(p)
