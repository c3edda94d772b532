"""Export, verify, import and merge of finished sweeps."""

from __future__ import annotations

import io
import json
import re
import shutil
import warnings
import zipfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import cli, make_finished_sweep, run_cli, run_snakemake

from sgdsweep.errors import UsageError
from sgdsweep.share.archive import ShareError, export_sweep, import_sweep, merge_exports, verify
from sgdsweep.store.aggregate import write_ensemble
from sgdsweep.store.points import PointStore, point_path
from sgdsweep.sweep.config import build_sweep


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("share")
    sweep_dir = make_finished_sweep(root)
    dest = root / "tiny.zip"
    manifest = export_sweep(sweep_dir, str(dest))
    return sweep_dir, dest, manifest


def test_export_opens_with_plain_xarray_and_carries_metadata(exported):
    sweep_dir, dest, manifest = exported
    assert manifest["schema_version"] == "sgdsweep-export/2" and len(manifest["points"]) == 4
    with zarr.storage.ZipStore(dest, mode="r") as store:
        ds = xr.open_zarr(store).load()
    original = xr.open_zarr(sweep_dir / "ensemble.zarr").load()
    xr.testing.assert_identical(ds.drop_attrs(), original.drop_attrs())
    for name in list(ds.data_vars) + list(ds.coords):
        assert {"long_name", "description"} <= set(ds[name].attrs), name
        assert ("units" in ds[name].attrs) != (ds[name].dtype.kind in "OTU"), name  # units for numbers only
    assert "weight_var_theory" in ds and json.loads(ds.attrs["fits"])["power_law"][0]["n_points"] == 4
    with zipfile.ZipFile(dest) as zf:
        names = zf.namelist()
        assert "README.txt" in names and "fits.json" in names
        stores = sorted(n for n in names if n.startswith("points/"))
        assert stores == sorted(f"points/{h}.npz" for h in manifest["points"])
        assert not any(n.endswith((".pkl", ".pickle")) for n in names)
        h = manifest["points"][0]
        with np.load(io.BytesIO(zf.read(f"points/{h}.npz")), allow_pickle=False) as npz:  # plain NumPy reads it
            assert "sgdsweep_meta" in npz.files and all(npz[k].dtype != object for k in npz.files)
        with PointStore(point_path(sweep_dir / "points", h)) as store:  # the store's bytes, unchanged
            assert store.raw == zf.read(f"points/{h}.npz")
    proc = cli("verify", str(dest))
    assert proc.returncode == 0 and "OK" in proc.stdout


def _rewrite(src: Path, dest: Path, change) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        zout.comment = zin.comment
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info, data)
    return dest


@pytest.mark.parametrize("case,change,message", [
    ("tampered_member", lambda n, d: d.replace(b'"float64"', b'"float32"') if n == "weight_var/zarr.json" else d,
     "'weight_var/zarr.json' does not match its SHA-256"),
    ("tampered_manifest",
     lambda n, d: d.replace(b'"sweep": "tiny"', b'"sweep": "evil"') if n == "sgdsweep-manifest.json" else d,
     "does not match the checksum in the zip comment"),
    ("removed_member", lambda n, d: None if n == "fits.json" else d, "'fits.json' listed in the manifest is missing"),
    ("added_member", None, "not listed in the manifest"),
])
def test_tampered_exports_fail_verification(exported, tmp_path, case, change, message):
    _, dest, _ = exported
    bad = tmp_path / f"{case}.zip"
    if change is None:
        bad.write_bytes(dest.read_bytes())
        with zipfile.ZipFile(bad, "a") as zf:
            zf.writestr("extra.bin", b"x")
    else:
        _rewrite(dest, bad, change)
    with pytest.raises(ShareError, match=message):
        verify(bad)
    run = run_cli if case == "tampered_member" else cli  # one through the real `python -m sgdsweep`
    proc = run("verify", str(bad))
    assert proc.returncode == 2 and message.split("'")[0] in proc.stderr


def _crafted(src: Path, dest: Path, change_manifest=None, extra=None) -> Path:
    """A copy of ``src`` whose manifest ``change_manifest(text) -> text`` rewrites, with the zip
    comment recomputed to match (what a forger does), or with ``extra`` (name, bytes) entries
    written after the original ones."""
    import hashlib

    from sgdsweep.share.archive import COMMENT_PREFIX, MANIFEST

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        text = zin.read(MANIFEST)
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == MANIFEST and change_manifest is not None:
                text = data = change_manifest(data)
            zout.writestr(info, data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name": the point here
            for name, data in extra or ():
                zout.writestr(name, data)
        zout.comment = COMMENT_PREFIX + hashlib.sha256(text).hexdigest().encode()
    return dest


@pytest.mark.parametrize("case,message", [
    ("sweep_name_escapes", "is not a sweep name"),
    ("sweep_name_absolute", "is not a sweep name"),
    ("manifest_not_json", "is not valid JSON"),
    ("manifest_without_members", "lacks its members"),
    ("member_twice", "'fits.json' is in the file twice"),
])
def test_crafted_exports_fail_verification_and_import_writes_nothing(exported, tmp_path, monkeypatch, case, message):
    """A forger can rewrite the manifest and recompute the comment's checksum (it proves
    integrity, not origin): what the manifest says must still be checked, so that an import
    never writes outside its results directory; and a member added under an existing name (zip
    readers disagree on which of the two they read) is refused."""
    _, dest, _ = exported
    change = {"sweep_name_escapes": lambda t: t.replace(b'"sweep": "tiny"', b'"sweep": "../../escaped"'),
              "sweep_name_absolute": lambda t: t.replace(b'"sweep": "tiny"', f'"sweep": "{tmp_path}/abs"'.encode()),
              "manifest_not_json": lambda t: t[:-2],
              "manifest_without_members": lambda t: json.dumps({**json.loads(t), "members": None}).encode(),
              }.get(case)
    extra = [("fits.json", b'{"evil": 1}')] if case == "member_twice" else None
    bad = _crafted(dest, tmp_path / f"{case}.zip", change, extra)
    with pytest.raises(ShareError, match=message):
        verify(bad)
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    proc = cli("import", str(bad), "--results-dir", "R")
    assert proc.returncode == 2 and message.split("'")[-1].strip() in proc.stderr, proc.stderr
    assert not (tmp_path / "a" / "escaped").exists() and not (tmp_path / "abs").exists()
    assert not (tmp_path / "a" / "b" / "R").exists()


def test_export_and_merge_never_overwrite(exported, tmp_path):
    """An existing file, directory or input at the destination is refused before any work, and
    left as it was; an import into a results directory that is a file is refused."""
    sweep_dir, dest, _ = exported
    before = dest.read_bytes()
    taken = tmp_path / "taken.zip"
    taken.write_text("precious")
    (tmp_path / "dir.zip").mkdir()
    for target in (taken, tmp_path / "dir.zip", dest):
        with pytest.raises(UsageError, match="already exists; sgdsweep never overwrites a file"):
            export_sweep(sweep_dir, str(target))
    with pytest.raises(UsageError, match="already exists"):
        merge_exports([str(dest), str(dest)], str(dest))
    with pytest.raises(UsageError, match=r"must end in \.zip"):
        merge_exports([str(dest), str(dest)], str(tmp_path / "merged.txt"))
    assert taken.read_text() == "precious" and dest.read_bytes() == before and not any((tmp_path / "dir.zip").iterdir())
    with pytest.raises(UsageError, match="not a directory"):
        import_sweep(dest, taken)
    with pytest.raises(UsageError, match="export file 'nope://x/e.zip'"):
        verify("nope://x/e.zip")
    with pytest.raises(UsageError, match="export destination 'nope://x/e.zip'"):
        export_sweep(sweep_dir, "nope://x/e.zip")


def test_truncated_export_fails_verification(exported, tmp_path):
    _, dest, _ = exported
    data = dest.read_bytes()
    for cut in (len(data) // 2, len(data) - 10):
        bad = tmp_path / f"cut{cut}.zip"
        bad.write_bytes(data[:cut])
        with pytest.raises(ShareError, match="truncated|corrupted"):
            verify(bad)
    with pytest.raises(UsageError, match="not found"):
        verify(tmp_path / "missing.zip")


def test_export_to_fsspec_urls(exported, tmp_path):
    sweep_dir, _, _ = exported
    export_sweep(sweep_dir, "memory://sgdsweep-test/tiny.zip")
    manifest = verify("memory://sgdsweep-test/tiny.zip")
    assert len(manifest["points"]) == 4
    with fsspec.open("memory://sgdsweep-test/tiny.zip", "rb") as fh:
        assert fh.read(2) == b"PK"
    url = f"file://{tmp_path}/via-url.zip"
    export_sweep(sweep_dir, url)
    assert verify(str(tmp_path / "via-url.zip"))["sweep"] == "tiny"
    with pytest.raises(UsageError, match=r"\.zip"):
        export_sweep(sweep_dir, str(tmp_path / "x.tar"))
    with pytest.raises(UsageError, match="not a finished sweep"):
        export_sweep(tmp_path, str(tmp_path / "y.zip"))


def test_import_places_sweep_and_rerun_simulates_nothing(exported, tmp_path):
    _, dest, _ = exported
    work = tmp_path / "other-machine"
    work.mkdir()
    proc = cli("import", str(dest), cwd=work)
    assert proc.returncode == 0, proc.stderr
    target = work / "results" / "tiny"
    assert (target / "ensemble.zarr" / "zarr.json").is_file() and (target / "config.yaml").is_file()
    assert len(list((target / "points").glob("*.npz"))) == 4
    # never overwrite: a second import is refused
    again = cli("import", str(dest), cwd=work)
    assert again.returncode == 2 and "already exists" in again.stderr
    # the workflow on the imported config re-runs fits and report without simulating
    run = run_snakemake(work, target / "config.yaml", cluster="own")  # a shard job would start one
    assert run.returncode == 0, run.stderr[-3000:]
    shard_logs = (target / "logs" / "simulate").glob("*.log")  # a shard job, if one runs, simulates nothing
    assert all("0 to simulate" in log.read_text() for log in shard_logs)
    assert "Dask dashboard" not in run.stdout + run.stderr
    assert len(list((target / "points").glob("*.npz"))) == 4
    assert (target / "report.html").is_file()


def test_merge_gives_union_and_refuses_conflicts(tmp_path):
    a_dir = make_finished_sweep(tmp_path / "a", grid={"lr": [0.2, 0.4], "batch_size": [2]})
    b_dir = make_finished_sweep(tmp_path / "b", grid={"lr": [0.4, 0.3], "batch_size": [2]})
    a, b = tmp_path / "a.zip", tmp_path / "b.zip"
    export_sweep(a_dir, str(a))
    export_sweep(b_dir, str(b))
    merged = merge_exports([str(a), str(b)], str(tmp_path / "ab.zip"))
    assert len(merged["points"]) == 3  # lr 0.4 is in both and identical
    with zarr.storage.ZipStore(tmp_path / "ab.zip", mode="r") as store:
        ds = xr.open_zarr(store).load()
    assert sorted(ds["lr"].values) == [0.2, 0.3, 0.4]
    # importing the merge and running its config simulates nothing either
    target = import_sweep(tmp_path / "ab.zip", tmp_path / "imported")
    resolved = build_sweep(__import__("yaml").safe_load((target / "config.yaml").read_text()))
    assert sorted(p.hash for p in resolved.points) == sorted(merged["points"])

    # a conflicting duplicate: same point hash, different values
    c_dir = make_finished_sweep(tmp_path / "c", grid={"lr": [0.4], "batch_size": [2]})
    ens = c_dir / "ensemble.zarr"
    ds_c = xr.open_zarr(ens).load()
    ds_c["weight_var"] = ds_c["weight_var"] * 1.5
    write_ensemble(ds_c, ens)
    export_sweep(c_dir, str(tmp_path / "c.zip"))
    with pytest.raises(ShareError, match="different 'weight_var'"):
        merge_exports([str(a), str(tmp_path / "c.zip")], str(tmp_path / "ac.zip"))
    # incompatible sweeps (different model) are refused
    d_dir = make_finished_sweep(tmp_path / "d", model={"label_noise": 0.1})
    export_sweep(d_dir, str(tmp_path / "d.zip"))
    with pytest.raises(ShareError, match="not compatible"):
        merge_exports([str(a), str(tmp_path / "d.zip")], str(tmp_path / "ad.zip"))
    assert np.isfinite(ds["weight_var"].values).all()


def _forged(src: Path, dest: Path, change=None, add=(), replace=None) -> Path:
    """A copy of the export ``src`` as a forger makes it: members ``replace`` (name → bytes)
    rewritten and entries ``add`` ((name or ZipInfo, bytes, or a function returning the bytes'
    blocks, called once to hash them and once to write them)) added, each listed in the manifest
    with its SHA-256 and size; then ``change(manifest)`` edits the manifest, and the zip
    comment's checksum is recomputed to match."""
    import hashlib

    from sgdsweep.share.archive import COMMENT_PREFIX, MANIFEST

    def blocks(data):
        return [data] if isinstance(data, bytes) else data()

    replace = replace or {}
    with zipfile.ZipFile(src) as zin:
        manifest = json.loads(zin.read(MANIFEST))
        for item, data in [*replace.items(), *add]:
            digest, size = hashlib.sha256(), 0
            for block in blocks(data):
                digest.update(block)
                size += len(block)
            name = item.filename if isinstance(item, zipfile.ZipInfo) else item
            manifest["members"][name] = {"sha256": digest.hexdigest(), "size": size}
        if change is not None:
            change(manifest)
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        with zipfile.ZipFile(dest, "w") as zout:
            for info in zin.infolist():
                if info.filename != MANIFEST:
                    zout.writestr(info, replace.get(info.filename, zin.read(info.filename)))
            for item, data in add:
                info = item if isinstance(item, zipfile.ZipInfo) else zipfile.ZipInfo(item)
                with zout.open(info, "w", force_zip64=True) as fh:
                    for block in blocks(data):
                        fh.write(block)
            zout.writestr(MANIFEST, text)
            zout.comment = COMMENT_PREFIX + hashlib.sha256(text).hexdigest().encode()
    return dest


def _import_refused(bad: Path, tmp_path: Path, message: str) -> None:
    """``verify`` and the ``import`` command refuse ``bad`` with ``message`` (exit 2, no
    traceback), and the import writes nothing anywhere."""
    with pytest.raises(ShareError, match=message):
        verify(bad)
    work = tmp_path / "work"
    (work / "R" / "victim").mkdir(parents=True, exist_ok=True)
    (work / "R" / "victim" / "report.html").write_text("victim's report")
    before = sorted(tmp_path.parent.rglob("*"))
    proc = cli("import", str(bad), "--results-dir", "R", cwd=work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(message, proc.stderr), proc.stderr
    assert sorted(tmp_path.parent.rglob("*")) == before
    assert (work / "R" / "victim" / "report.html").read_text() == "victim's report"


def _set_config(**changes):
    def change(manifest):
        for key, value in changes.items():
            section, _, sub = key.partition(".")
            if sub:
                manifest["config"][section][sub] = value
            else:
                manifest["config"][key] = value
    return change


@pytest.mark.parametrize("case,change,message", [
    ("config_names_another_sweep", _set_config(sweep="victim"),
     "the config's sweep 'victim' is not the manifest's sweep 'tiny'"),
    ("config_other_points", _set_config(**{"grid.lr": [0.2, 0.5]}), "the config's points are not the manifest's"),
    ("config_invalid", _set_config(**{"dynamics.steps": -1}), "the manifest's config is not a valid sweep config"),
    ("point_without_store", lambda m: m["points"].append("0123456789abcdef"),
     "point 0123456789abcdef of the manifest has no point store"),
    ("sweep_name_with_newline", lambda m: (m.update(sweep="tiny\n"), _set_config(sweep="tiny\n")(m)),
     "sweep name 'tiny\\\\n' is not a sweep name"),
])
def test_forged_manifest_and_config_are_refused(exported, tmp_path, case, change, message):
    """What the manifest says about the sweep must agree with its config and its stores: a
    config of another sweep would make ``sgdsweep run`` of the import write that sweep's
    results, and a config of other points would simulate."""
    _, dest, _ = exported
    _import_refused(_forged(dest, tmp_path / f"{case}.zip", change), tmp_path, message)


def _non_utf8_name(src: Path, dest: Path) -> Path:
    """``src`` forged with a member whose name is flagged UTF-8 but is not (bytes patched in)."""
    _forged(src, dest, add=[("bad\u00e9x", b"x")])
    data = dest.read_bytes()
    assert data.count(b"bad\xc3\xa9x") == 2  # local header and central directory
    dest.write_bytes(data.replace(b"bad\xc3\xa9x", b"bad\xff\xfex"))
    return dest


def _entry(name: str, mode: int = 0, attr: int = 0) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (mode << 16) | attr
    return info


@pytest.mark.parametrize("case,entry,message", [
    ("dot", ".", "'.' is refused: it has an empty or '.' part"),
    ("empty", "", "'' is refused: it has an empty or '.' part"),
    ("dotdot", "..", "would escape the results directory"),
    ("dotdot_inside", "a/../../b", "would escape the results directory"),
    ("escape_far", "../../../../escaped", "would escape the results directory"),
    ("absolute", "/tmp/abs", "would escape the results directory"),
    ("backslash", "a\\..\\..\\b", "would escape the results directory"),
    ("drive", "C:evil", "would escape the results directory"),
    ("dot_inside", "a/./b", "has an empty or '.' part"),
    ("double_slash", "a//b", "has an empty or '.' part"),
    ("non_ascii", "caf\u00e9", "characters other than letters"),
    ("control_character", "a\nb", "characters other than letters"),
    ("directory_entry", _entry("extra/", 0o40755, 0x10), "is a directory entry"),
    ("directory_attribute", _entry("extra", 0o40755, 0x10), "is not a regular file"),
    ("symlink", _entry("link", 0o120777), "is not a regular file"),
    ("case_collision", "WEIGHT_VAR/zarr.json", "differ only in case"),
    ("file_and_directory", "fits.json/x", "'fits.json' is a file and also the directory of other members"),
    ("unknown_point_store", "points/0123456789abcdef.npz", "is not a file of the point store"),
    ("non_utf8", None, "a member's name is not valid UTF-8"),
])
def test_crafted_member_names_are_refused(exported, tmp_path, case, entry, message):
    """Every member name an adversary can put in a zip is refused with a message (never a
    traceback) unless it is a plain relative name an export uses; nothing is written."""
    _, dest, _ = exported
    bad = tmp_path / f"{case}.zip"
    if entry is None:
        _non_utf8_name(dest, bad)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            _forged(dest, bad, add=[(entry, b"/etc/passwd")])
    _import_refused(bad, tmp_path, re.escape(message))


def _zeros(megabytes: int):
    return lambda: (bytes(1 << 20) for _ in range(megabytes))


def test_zip_bomb_and_sizes_are_refused_before_reading(exported, tmp_path, monkeypatch):
    """The sizes a zip declares are checked before a member is read: all together against the
    file's size (a zip bomb), each against the manifest and against the limits."""
    from sgdsweep.share import verify as share_verify
    _, dest, _ = exported
    bomb = zipfile.ZipInfo("weight_var/c/1")
    bomb.compress_type = zipfile.ZIP_DEFLATED
    bad = _forged(dest, tmp_path / "bomb.zip", add=[(bomb, _zeros(200))])
    assert bad.stat().st_size < 2 * dest.stat().st_size
    _import_refused(bad, tmp_path, r"its members declare \d+ bytes in all, more than 100 times the file's")

    def grow(manifest):
        manifest["members"]["fits.json"]["size"] += 1
    _import_refused(_forged(dest, tmp_path / "size.zip", grow), tmp_path,
                    "member 'fits.json' declares .* bytes in the zip but .* in the manifest")
    monkeypatch.setattr(share_verify, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(ShareError, match=r"member '.*' declares \d+ bytes, more than the limit of 1000 bytes"):
        verify(dest)
    monkeypatch.setattr(share_verify, "MAX_MEMBER_BYTES", 1 << 30)
    monkeypatch.setattr(share_verify, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ShareError, match=r"'sgdsweep-manifest.json' declares \d+ bytes, more than the limit"):
        verify(dest)


def test_import_streams_members(exported, tmp_path):
    """A large member is hashed and copied in blocks: the import's Python allocations stay far
    below the member's size."""
    import tracemalloc

    _, dest, _ = exported
    rng = np.random.default_rng(0)
    blocks = [rng.bytes(1 << 20) for _ in range(48)]
    big = _forged(dest, tmp_path / "big.zip", add=[("big/c/0", lambda: iter(blocks))])
    tracemalloc.start()
    try:
        target = import_sweep(big, tmp_path / "R")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (target / "ensemble.zarr" / "big" / "c" / "0").read_bytes() == b"".join(blocks)
    assert peak < 16 << 20, peak


def test_import_drops_execution_and_names_its_own_directory(exported, tmp_path, monkeypatch):
    """The execution section describes the exporting machine: an export cannot choose where this
    machine's scheduler listens or which scheduler or cluster it uses. The imported config names
    the imported directory whatever the working directory it runs from."""
    from sgdsweep.sweep.config import load_sweep

    _, dest, _ = exported
    execution = {"host": "0.0.0.0", "scheduler": "tcp://elsewhere:8786", "cluster": "slurm", "workers": 64}
    bad = _forged(dest, tmp_path / "execution.zip", lambda m: m["config"].update(execution=execution))
    assert verify(bad)["config"]["execution"] == execution
    work = tmp_path / "work"
    work.mkdir()
    proc = cli("import", str(bad), "--results-dir", "R", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "execution section" in proc.stderr and "was not imported" in proc.stderr
    target = work / "R" / "tiny"
    assert "execution" not in __import__("yaml").safe_load((target / "config.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(target / "config.yaml")
    assert sweep.config["execution"]["host"] == "127.0.0.1" and sweep.config["execution"]["scheduler"] is None
    assert sweep.config["execution"]["cluster"] == "local" and sweep.config["execution"]["workers"] == "auto"
    assert sweep.directory.resolve() == target.resolve()


def test_export_refuses_a_missing_ensemble_chunk_and_a_misnamed_point_store(exported, tmp_path):
    """`sgdsweep export` checks what it ships as the readers do: an ensemble chunk file deleted
    (plain xarray would read NaN from the export) and a point store copied onto another point's
    name are refused naming them (exit 2), and nothing is written."""
    sweep_dir, _, manifest = exported
    copy = tmp_path / "results" / "tiny"
    shutil.copytree(sweep_dir, copy)
    (chunk,) = [f for f in (copy / "ensemble.zarr" / "weight_var").rglob("*") if f.is_file() and f.name != "zarr.json"]
    chunk.unlink()
    assert np.isnan(xr.open_zarr(copy / "ensemble.zarr")["weight_var"].values).all()
    proc = cli("export", str(copy), str(tmp_path / "a.zip"))
    assert proc.returncode == 2 and f"{copy} is not exported" in proc.stderr, proc.stderr
    assert "array 'weight_var' has 1 of its 1 chunk file(s) missing" in proc.stderr
    assert not (tmp_path / "a.zip").exists()
    shutil.rmtree(copy / "ensemble.zarr")
    shutil.copytree(sweep_dir / "ensemble.zarr", copy / "ensemble.zarr")
    a, b = manifest["points"][:2]
    shutil.copyfile(point_path(copy / "points", a), point_path(copy / "points", b))
    proc = cli("export", str(copy), str(tmp_path / "a.zip"))
    assert proc.returncode == 2 and f"is not the store of point {b}: it holds the results of point {a}" in proc.stderr
    assert not (tmp_path / "a.zip").exists()


def _dropped(src: Path, dest: Path, name: str) -> Path:
    """A copy of the export ``src`` without member ``name``, its manifest and checksum made to
    match (what an exporter that shipped an ensemble missing a chunk wrote)."""
    _rewrite(src, dest.with_name(f"partial-{dest.name}"), lambda n, d: None if n == name else d)
    return _forged(dest.with_name(f"partial-{dest.name}"), dest, change=lambda m: m["members"].pop(name))


def test_verify_refuses_an_ensemble_missing_a_chunk_or_with_edited_metadata(exported, tmp_path):
    """Exports whose members all match their manifest, but whose ensemble lacks a chunk (read as
    NaN) or has an array's metadata edited (a scale_factor that doubles what xarray reads): verify
    and import run the check open_ensemble runs and refuse them (exit 2)."""
    _, dest, _ = exported
    with zipfile.ZipFile(dest) as zf:
        (chunk,) = [n for n in zf.namelist() if n.startswith("weight_var/") and n != "weight_var/zarr.json"]
        root = json.loads(zf.read("zarr.json"))
    missing = _dropped(dest, tmp_path / "missing_chunk.zip", chunk)
    with zarr.storage.ZipStore(missing, mode="r") as store:
        assert np.isnan(xr.open_zarr(store)["weight_var"].values).all()
    _import_refused(missing, tmp_path, r"its ensemble \(the zip's root group\) is refused: .*array 'weight_var' "
                                       r"has 1 of its 1 chunk file\(s\) missing")
    root["consolidated_metadata"]["metadata"]["weight_var"]["attributes"]["scale_factor"] = 2
    scaled = _forged(dest, tmp_path / "scaled.zip", replace={"zarr.json": json.dumps(root, indent=2).encode()})
    _import_refused(scaled, tmp_path, r"its ensemble \(the zip's root group\) is refused: .*the metadata of array "
                                      r"'weight_var' \(its copy in the consolidated metadata")
