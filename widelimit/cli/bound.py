"""``widelimit bound``: the certified wide-limit bound, streamed from disk or on a Dask cluster."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .._runtime import usable_cores
from ..data.source import ActivationSource

from ._common import (_console, certificate_table, check_out_file, lam_float, load_data, only_with,
                      positive_float, positive_int, print_json, progress_display)
from ..data.shards import first_line, show, special_file, special_message
from ..exact.median import geometric_median, huber_median
from ..engine.dask_engine import from_source


# --------------------------------------------------------------------------------------
# bound: the certified wide-limit bound, streamed from disk or run on a Dask cluster
# --------------------------------------------------------------------------------------


def _add_bound(sub):
    p = sub.add_parser(
        "bound",
        help="certified wide-limit lower bound (Huber median), streamed from disk or run on a Dask cluster",
        description="Compute min_b H(b), the lower bound on the SAE objective for every width, with its "
                    "certificate. Files are streamed in chunks (memory independent of N).",
    )
    p.add_argument("data", help=".npy / .safetensors / .arrow file, a folder of shards, a Hugging Face "
                                "datasets cache (SAELens), another data file, or a built-in dataset name")
    p.add_argument("--lam", type=lam_float, default=None, help="sparsity lam > 0 (l1_coefficient = 2 lam)")
    p.add_argument("--key", default=None, help="tensor name inside .safetensors / .npz / .pt")
    p.add_argument("--column", default=None, help="column of a datasets / Arrow cache (default: its float column)")
    p.add_argument("--header", action="store_true", help="text tables: the first row is a header")
    p.add_argument("--geometric", action="store_true", help="geometric median instead (no lam)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint file: written after every pass; an interrupted run resumes from it")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run the passes on a Dask cluster: a scheduler address (tcp://host:8786) or "
                        "'local' / 'local:N' for a LocalCluster of N worker processes (1 <= N <= the usable cores)")
    p.add_argument("--dask-timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="with --dask: give up when the local cluster has not started, or the scheduler does not "
                        "answer or has no worker, within this time in all (default 30)")
    p.add_argument("--rows", type=positive_int, default=None,
                   help="with --dask: rows per Dask block (default: a 32 MiB float64 block)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _start_local_cluster(spec: str, n_workers, timeout: float):
    """A ``LocalCluster`` of ``n_workers`` processes, or a one-line ``ValueError`` when it has not started
    within ``timeout`` seconds (the cluster is built on a helper thread, so a start that hangs cannot
    hang the command; one finished after the deadline is closed at once)."""
    from distributed import LocalCluster

    box: dict = {}
    lock = threading.Lock()

    def start():
        try:
            c = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                             silence_logs=logging.CRITICAL, death_timeout=timeout)
        except BaseException as e:  # noqa: BLE001 - reported by the caller, one line
            box["error"] = e
            return
        with lock:
            if box.get("abandoned"):
                c.close()
            else:
                box["cluster"] = c

    t = threading.Thread(target=start, name="widelimit-dask-start", daemon=True)
    t.start()
    t.join(timeout)
    with lock:
        if "cluster" not in box and "error" not in box:
            box["abandoned"] = True
            raise ValueError(f"--dask {spec}: the local cluster did not start within {timeout:g} s "
                             "(--dask-timeout)")
    if "error" in box:
        e = box["error"]
        raise ValueError(f"--dask {spec}: the local cluster did not start "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    return box["cluster"]


def _dask_client(spec: str, timeout: float = 30.0):
    """``(client, cluster)`` for ``--dask``: the address is checked, and the cluster must start (``local``), the
    scheduler answer and have at least one worker, all within ``timeout`` seconds together.

    The client is not made the process's default (the command computes inside ``client.as_current()``): a
    client that failed while connecting stayed the default, and later computations in the process went to it.

    ``local:N`` is at most the usable cores (:func:`usable_cores`): every worker is a process.
    """
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--dask needs dask[distributed]: pip install 'widelimit[dask]'") from None
    local = re.fullmatch(r"local(?::(\d+))?", spec.strip())
    if local is None and not re.fullmatch(r"(?:[a-z]+://)?\[?[\w.\-:]+\]?:\d+", spec.strip()):
        raise ValueError(f"--dask {spec!r}: expected 'local', 'local:N' or a scheduler address such as "
                         "tcp://host:8786")
    nw = int(local.group(1)) if local is not None and local.group(1) else None
    if nw is not None and nw < 1:
        raise ValueError(f"--dask {spec}: a local cluster needs at least 1 worker (local:N, N >= 1)")
    cores = usable_cores()
    if nw is not None and nw > cores:
        raise ValueError(f"--dask {spec}: at most {cores} local worker processes on this machine (one per usable "
                         f"core); use local:{cores} or fewer, or a scheduler address for more")
    # the CLI reports errors and Ctrl-C itself, in one line: no log records from the scheduler
    # connection or from asyncio tasks that a Ctrl-C leaves unfinished
    for name in ("distributed", "distributed.client", "distributed.comm", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    cluster = None
    try:
        if local is not None:
            cluster = _start_local_cluster(spec, nw, timeout)
            client = Client(cluster, timeout=left(), set_as_default=False)
        else:
            client = Client(spec, timeout=timeout, set_as_default=False)
    except ValueError:
        if cluster is not None:
            cluster.close()
        raise
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            cluster.close()
        raise ValueError(f"--dask {spec}: could not reach the scheduler within {timeout:g} s "
                         f"({' '.join(str(e).split())[:200] or type(e).__name__})") from None
    except Exception as e:  # noqa: BLE001 - a server that answers, but not in Dask's protocol
        if cluster is not None:
            cluster.close()
        raise _not_dask(spec, e) from None
    try:
        client.wait_for_workers(1, timeout=left())
    except (OSError, TimeoutError):
        client.close()
        if cluster is not None:
            cluster.close()
        raise ValueError(f"--dask {spec}: the scheduler has no worker after {timeout:g} s") from None
    except Exception as e:  # noqa: BLE001
        client.close()
        if cluster is not None:
            cluster.close()
        raise _not_dask(spec, e) from None
    return client, cluster


def _not_dask(spec: str, e: Exception) -> ValueError:
    """The one line for an address whose server answers in another protocol than Dask's: its reply, read as a
    Dask message, gives any error (a frame length of exabytes: MemoryError; garbage: a decoding error)."""
    return ValueError(f"--dask {spec}: the server at this address is not a Dask scheduler (its reply could not be "
                      f"read as a Dask message: {type(e).__name__}); give a scheduler address such as "
                      "tcp://host:8786, 'local' or 'local:N'")


_NPZ_MAGIC = b"PK\x03\x04"


def _check_checkpoint(path: Path) -> None:
    """``--checkpoint``: a path where a checkpoint can be written, or an existing widelimit checkpoint.

    An existing file that is not a checkpoint is refused (never overwritten), saying what it is instead.
    """
    check_out_file(path, "--checkpoint")
    if not path.exists():
        return
    kind = special_file(path)
    if kind is not None:  # a named pipe would block the read forever
        raise ValueError(f"--checkpoint {special_message(path, kind)}")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ValueError(f"--checkpoint {show(path)}: cannot read it ({e.strerror or first_line(e)})") from None
    if head != _NPZ_MAGIC:
        what = "it is empty" if not head else f"it starts with {head!r}"
        raise ValueError(f"--checkpoint {show(path)}: exists and is not a widelimit checkpoint (a checkpoint is "
                         f"an .npz archive; this file is not one: {what}); delete it or choose another path")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "__meta__" not in z.files:
                raise ValueError(f"--checkpoint {show(path)}: exists and is not a widelimit checkpoint (an .npz "
                                 f"archive without its __meta__ entry; it holds {', '.join(z.files) or 'nothing'}); "
                                 "delete it or choose another path")
            json.loads(bytes(z["__meta__"]).decode())
    except ValueError as e:
        if str(e).startswith("--checkpoint"):
            raise
        raise ValueError(f"--checkpoint {show(path)}: exists and is not a readable widelimit checkpoint "
                         f"({type(e).__name__}: {first_line(e)}); delete it or choose another path") from None
    except Exception as e:  # noqa: BLE001 - a corrupted archive
        raise ValueError(f"--checkpoint {show(path)}: exists and is not a readable widelimit checkpoint "
                         f"(a damaged .npz archive: {type(e).__name__}: {first_line(e)}); delete it or choose "
                         "another path") from None


def _run_bound(args) -> int:

    only_with({"--dask-timeout": args.dask_timeout, "--rows": args.rows}, bool(args.dask), "--dask")
    if args.dask_timeout is None:
        args.dask_timeout = 30.0
    if args.checkpoint is not None:
        _check_checkpoint(args.checkpoint)
    # no separate scan: the median's first pass refuses NaN / Inf and too large rows, naming the shard and row
    X, lam0, label = load_data(args.data, args.key, column=args.column, header=args.header or None, scan=False)
    if isinstance(X, ActivationSource):
        label = repr(X)
    if args.geometric and args.lam is not None:
        raise ValueError("--lam applies only without --geometric (the geometric median has no lam)")
    lam = args.lam if args.lam is not None else lam0
    if lam is None and not args.geometric:
        raise ValueError("--lam is required for data files (or use --geometric)")
    client = cluster = None
    if args.dask:

        client, cluster = _dask_client(args.dask, args.dask_timeout)
    con = _console()
    from rich.console import Console

    err = Console(stderr=True)
    try:
        if client is not None:
            X = from_source(X if isinstance(X, ActivationSource) else ActivationSource.from_array(X), rows=args.rows)
        t0 = time.perf_counter()
        with progress_display(err, enabled=not args.no_progress) as cb, \
                (client.as_current() if client is not None else contextlib.nullcontext()):
            if args.geometric:
                res = geometric_median(X, progress=cb, checkpoint=args.checkpoint)
            else:
                res = huber_median(X, lam=lam, progress=cb, checkpoint=args.checkpoint)
        secs = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    N, n = X.shape
    d = {
        "data": label, "n_points": int(N), "dim": int(n), "kind": res.kind, "lam": res.lam,
        "lower_bound": res.lower_bound, "value": res.value, "gap": res.gap, "rel_gap": res.rel_gap,
        "certified": bool(res.certified), "n_passes": res.n_passes, "n_iter": res.n_iter, "method": res.method,
        "time_s": secs, "backend": "dask" if args.dask else "local", "bias": res.point,
        "rounding": res.rounding, "fingerprint": res.fingerprint,
    }
    if args.json:
        print_json(d)
        return 0
    what = "geometric median" if args.geometric else "wide-limit bound (Huber median)"
    con.print(certificate_table(f"widelimit bound: {label}", [
        ("points N x dims n", f"{N} x {n}", "data size"),
        ("lam", res.lam if res.lam is not None else "-", "sparsity (SAELens l1_coefficient = 2 lam)"),
        ("lower bound", res.lower_bound, f"certified {what}: no width, dictionary or code does better"
         if not args.geometric else "certified lower bound on the mean distance"),
        ("value at b", res.value, "objective at the returned bias (an upper bound)"),
        ("gap", res.gap, "value - lower bound"),
        ("relative gap", res.rel_gap, "certificate quality"),
        ("passes", res.n_passes, f"passes over the data ({res.method})"),
        ("time_s", secs, f"{'Dask ' + args.dask if args.dask else 'single process'}"),
        ("certified", res.certified, "gap within tolerance"),
    ]))
    sys.stdout.flush()
    return 0
