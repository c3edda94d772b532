"""The file system and the processes a run meets: point stores whose metadata member is a zip
bomb, a stale Dask scheduler file, and symbolic links planted where sgdsweep writes in the sweep
directory."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from conftest import REPO, cli, tiny_config, write_yaml

from sgdsweep.errors import StoreError, UsageError
from sgdsweep.run import cluster, locking
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan

META = f"{point_store.META_MEMBER}.npy"
#: The metadata member's limit, bytes (point_store.MAX_META_BYTES).
LIMIT = 16 << 20


# --- point stores whose metadata member inflates beyond any store sgdsweep writes ---------------


def _meta_header(length: int) -> bytes:
    """The ``.npy`` header of a 0-d bytes array of ``length`` bytes (the metadata member's form)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": f"|S{length}", "fortran_order": False, "shape": ()})
    return out.getvalue()


def _bomb(path, inflated: int, declared: int | None = None, stored: bool = False) -> None:
    """A checksummed ``.npz`` whose only member is a deflated metadata member of ``inflated``
    bytes (an ``.npy`` header, then spaces); its zip directory declares ``declared`` bytes
    (default: the truth). Written without ever holding the inflated bytes; ``stored``: the
    member stored uncompressed instead, as sgdsweep stores members."""
    header = _meta_header(inflated - 128)
    header = _meta_header(inflated - len(header))
    comp, crc, chunk = zlib.compressobj(9, zlib.DEFLATED, -15), zlib.crc32(header), b" " * (1 << 20)
    body, left = [comp.compress(header)], inflated - len(header)
    while left:
        part = chunk[:left]
        crc, left = zlib.crc32(part, crc), left - len(part)
        body.append(comp.compress(part))
    data = header + b" " * (inflated - len(header)) if stored else b"".join([*body, comp.flush()])
    size, method = inflated if declared is None else declared, 0 if stored else 8
    name = META.encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 33, crc, len(data), size, len(name), 0)
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 33, crc, len(data), size,
                          len(name), 0, 0, 0, 0, 0, 0)
    comment = point_store.CHECKSUM_MARKER + b"0" * 8
    directory = central + name
    offset = len(local) + len(name) + len(data)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), offset, len(comment))
    raw = bytearray(local + name + data + directory + end + comment)
    raw[-8:] = b"%08x" % zlib.crc32(raw[:-8])
    path.write_bytes(bytes(raw))


def _peak_bytes_opening(path) -> tuple[int, str]:
    """Peak bytes allocated by Python while opening the point store ``path``, and the error."""
    tracemalloc.start()
    try:
        with pytest.raises(StoreError) as info:
            point_store.PointStore(path)
        return tracemalloc.get_traced_memory()[1], str(info.value)
    finally:
        tracemalloc.stop()


def test_a_metadata_member_declaring_more_than_the_limit_is_refused_unread(tmp_path):
    """A 256 MiB metadata member deflated to a few hundred kB is refused as compressed (sgdsweep
    stores members uncompressed), and one stored just past the limit from its declared size:
    each naming the store and the member, without inflating or parsing it."""
    path = tmp_path / "0123456789abcdef.npz"
    _bomb(path, 256 << 20)
    assert path.stat().st_size < 1 << 20
    peak, text = _peak_bytes_opening(path)
    assert peak < 4 * LIMIT
    assert f"point store {path}" in text and f"member '{META}' is compressed" in text
    assert "delete it and rerun the workflow" in text
    assert not point_store.is_complete(path)
    _bomb(path, LIMIT + 4096, stored=True)
    peak, text = _peak_bytes_opening(path)
    assert peak < 4 * LIMIT
    assert f"point store {path}" in text and f"member '{META}' holds more than" in text
    assert f"declared {LIMIT + 4096}" in text and "delete it and rerun the workflow" in text
    assert not point_store.is_complete(path)


def test_a_metadata_member_that_lies_about_its_size_inflates_no_more_than_the_limit(tmp_path):
    """The zip directory declares a few bytes, the member inflates to 256 MiB: at most the limit
    is inflated, and the store counts as damaged."""
    path = tmp_path / "0123456789abcdef.npz"
    _bomb(path, 256 << 20, declared=1000)
    peak, text = _peak_bytes_opening(path)
    assert peak < 4 * LIMIT
    assert f"point store {path}" in text
    _bomb(path, 256 << 20, declared=LIMIT)
    peak, text = _peak_bytes_opening(path)
    assert peak < 4 * LIMIT
    assert f"point store {path}" in text


def test_plan_names_a_store_with_an_oversized_metadata_member_corrupt(tmp_path):
    """``sgdsweep plan`` on a sweep where one point's store holds a metadata member just past the
    limit: that point is corrupt (simulated again), the others new; exit 0, no traceback."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    sweep = build_sweep(cfg)
    first = sweep.points[0].hash
    store = sweep.directory / "points" / f"{first}.npz"
    store.parent.mkdir(parents=True)
    _bomb(store, LIMIT + 4096, stored=True)
    before = store.read_bytes()
    proc = cli("plan", str(write_yaml(tmp_path / "cfg.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith(first))
    assert line.endswith("corrupt (incomplete or unreadable store)")
    assert store.read_bytes() == before  # planning reads; the store is replaced when simulated
    with pytest.raises(StoreError, match="holds more than 16777216 bytes"):
        point_store.read_attrs(store)


def test_a_real_stores_metadata_is_far_below_the_limit(tmp_path):
    """The limit leaves room: the metadata member of a store sgdsweep writes is a few kB."""
    assert point_store.MAX_META_BYTES == LIMIT
    path = tmp_path / "0123456789abcdef.npz"
    point_store.write_point(path, {"x": (("replica",), np.arange(8.0))}, {"params": {"lr": 0.1}})
    with zipfile.ZipFile(path) as zf:
        assert zf.getinfo(META).file_size < LIMIT // 1000
    assert point_store.read_array(path, "x").tolist() == list(np.arange(8.0))


# --- a stale scheduler file -------------------------------------------------------------------


#: A shard job with the probe's deadline shortened to 2 s (sgdsweep's own is 30 s).
SHARD_JOB = ("import sys; import sgdsweep.run.cluster as c; c.PROBE_TIMEOUT_S = 2.0; "
             "from sgdsweep.run.cli import main; sys.exit(main(sys.argv[1:]))")


def test_a_stale_scheduler_file_naming_a_silent_listener_fails_the_job_in_seconds(tmp_path):
    """A scheduler file whose address is a port that accepts connections and never answers: the
    shard job exits 1 within the probe's deadline, naming the address and the scheduler file,
    and writes no receipt."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    files = write_plan(build_sweep(cfg))
    (spec,) = sorted((files.root / "plan" / "shards").glob("*.json"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel completes connections; nobody ever reads or answers
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    cluster_dir = tmp_path / "stale"
    cluster_dir.mkdir()
    (cluster_dir / cluster.SCHEDULER_FILE).write_text(json.dumps({"address": address, "type": "Scheduler"}))
    receipt = tmp_path / "receipt.json"
    env = {k: v for k, v in os.environ.items() if k != cluster.SCHEDULER_ENV}
    env.update({cluster.SCHEDULER_FILE_ENV: str(cluster_dir / cluster.SCHEDULER_FILE), "PYTHONPATH": str(REPO)})
    try:
        proc = subprocess.run([sys.executable, "-c", SHARD_JOB, "simulate-shard", str(spec), "--receipt",
                               str(receipt), "--execution", str(files.root / "plan" / "execution.json")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        listener.close()
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"no Dask scheduler answered at {address} within 2 s" in proc.stderr
    assert f"scheduler file {cluster_dir / cluster.SCHEDULER_FILE}" in proc.stderr
    assert f"unset {cluster.SCHEDULER_FILE_ENV}" in proc.stderr
    assert not receipt.exists()


def test_a_scheduler_file_without_an_address_is_named(tmp_path, monkeypatch):
    """A scheduler file that records no address fails the job at once, naming it."""
    (tmp_path / cluster.SCHEDULER_FILE).write_text("{}")
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    with pytest.raises(cluster.SgdsweepError, match=r"names no scheduler \(its 'address' is None"), \
            cluster.dask_client({}):
        pass


# --- symbolic links planted in the sweep directory ---------------------------------------------


def _precious(tmp_path):
    """A file outside the sweep directory that no run may change."""
    target = tmp_path / "outside" / "precious.txt"
    target.parent.mkdir()
    target.write_text("precious contents\n")
    return target


def test_a_link_at_the_daemon_log_is_replaced_not_written_through(tmp_path):
    """The run's cluster process gets a new log file; the file a planted link pointed to keeps
    its contents."""
    target = _precious(tmp_path)
    cluster_dir = tmp_path / "sweep" / ".cluster"
    cluster_dir.mkdir(parents=True)
    (cluster_dir / cluster.DAEMON_LOG).symlink_to(target)
    proc = cluster.start_run_cluster(cluster_dir, 1)
    cluster.stop_run_cluster(proc, cluster_dir)
    assert target.read_text() == "precious contents\n"
    log = cluster_dir / cluster.DAEMON_LOG
    assert log.is_file() and not log.is_symlink()


def test_a_link_at_the_lock_file_is_refused_and_its_target_untouched(tmp_path):
    """Taking the sweep's lock where its file is a link: a UsageError naming the link and its
    target; the target keeps its contents."""
    target = _precious(tmp_path)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / locking.LOCK_NAME).symlink_to(target)
    with pytest.raises(UsageError, match=f"lock file {sweep_dir / locking.LOCK_NAME} is a symbolic link "
                                         f"\\(to {target}\\)"):
        locking.acquire(sweep_dir)
    locking.record_holder(sweep_dir / locking.LOCK_NAME, 1234)  # ignored, as any failure to record
    assert target.read_text() == "precious contents\n"


def test_run_refuses_a_linked_lock_file_with_exit_2(tmp_path):
    """``sgdsweep run --dry-run`` on a sweep whose lock file is a link: exit 2, the message names
    the link, nothing is written through it."""
    target = _precious(tmp_path)
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    sweep_dir = build_sweep(cfg).directory
    sweep_dir.mkdir(parents=True)
    (sweep_dir / locking.LOCK_NAME).symlink_to(target)
    proc = cli("run", "--dry-run", str(write_yaml(tmp_path / "cfg.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{sweep_dir / locking.LOCK_NAME} is a symbolic link" in proc.stderr
    assert target.read_text() == "precious contents\n"


def test_the_write_probe_does_not_write_through_a_planted_link(tmp_path):
    """Checking that the sweep directory is writable creates a new file of a random name: a link
    at the name an earlier version used (``.write-probe-<pid>``) is left alone, and so is its
    target."""
    target = _precious(tmp_path)
    link = tmp_path / f".write-probe-{os.getpid()}"
    link.symlink_to(target)
    locking.ensure_writable(tmp_path)
    assert target.read_text() == "precious contents\n"
    assert link.is_symlink()


def test_an_atomic_write_does_not_write_through_a_link_at_its_temporary_name(tmp_path):
    """The temporary file of an atomic write has a name that can be guessed (the pid): a link
    planted there is removed, the target keeps its contents, and the file written is a file."""
    from sgdsweep.core.paths import atomic_write_text

    target = _precious(tmp_path)
    path = tmp_path / "sweep" / ".cluster" / cluster.FAILURE_FILE
    path.parent.mkdir(parents=True)
    (path.parent / f".{path.name}.tmp{os.getpid()}").symlink_to(target)
    atomic_write_text(path, "RuntimeError: Cluster failed to start")
    assert target.read_text() == "precious contents\n"
    assert path.read_text() == "RuntimeError: Cluster failed to start" and not path.is_symlink()
    assert sorted(p.name for p in path.parent.iterdir()) == [cluster.FAILURE_FILE]


def test_a_jobs_log_file_is_created_afresh_not_written_through_a_link(tmp_path):
    """A workflow verb's ``--log`` (``<sweep>/logs/<job>.log``): a link planted there is
    replaced by the job's own log file; its target keeps its contents."""
    target = _precious(tmp_path)
    log = tmp_path / "sweep" / "logs" / "aggregate.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(target)
    proc = cli("aggregate", str(tmp_path / "missing.json"), "--out", str(tmp_path / "e.zarr"),
               "--receipt", str(tmp_path / "r.json"), "--log", str(log), cwd=tmp_path)
    assert proc.returncode == 2 and "file not found" in proc.stderr, proc.stderr
    assert target.read_text() == "precious contents\n"
    assert log.is_file() and not log.is_symlink()
