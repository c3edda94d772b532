"""Crafted exports: what their arrays declare is bounded before anything is allocated, the data
types are sgdsweep's, a precision export's rounds are checked as its points are, and an import
never lands inside another sweep."""

from __future__ import annotations

import json
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, make_finished_sweep
from legacy_layouts import as_schema1
from test_share import _forged, _import_refused, _rewrite

from sgdsweep.share.archive import ShareError, export_sweep, import_sweep, verify


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    sweep_dir = make_finished_sweep(root)
    dest = root / "tiny.zip"
    manifest = export_sweep(sweep_dir, str(dest))
    return sweep_dir, dest, manifest


@pytest.fixture(scope="module")
def exported1(exported, tmp_path_factory):
    """The export of ``exported`` in the earlier schema 1 (each point's store a Zarr group),
    whose point arrays' metadata verify bounds."""
    sweep_dir, dest, _ = exported
    old = as_schema1(dest, tmp_path_factory.mktemp("schema1") / "tiny1.zip")
    return sweep_dir, old, verify(old)


def _recrafted(src: Path, dest: Path, replace: dict[str, bytes], drop: tuple[str, ...] = ()) -> Path:
    """``src`` with members ``drop`` removed and ``replace`` rewritten, its manifest and checksum
    made to match (a re-signed file)."""
    partial = dest.with_name(f"partial-{dest.name}")
    _rewrite(src, partial, lambda n, d: None if n in drop else d)

    def change(manifest):
        for name in drop:
            manifest["members"].pop(name)
    return _forged(partial, dest, change=change, replace=replace)


def _point_array(dest: Path, point: str, name: str) -> tuple[str, dict]:
    key = f"points/{point}.zarr/{name}/zarr.json"
    with zipfile.ZipFile(dest) as zf:
        return key, json.loads(zf.read(key))


def _with_shape(meta: dict, shape: list[int]) -> bytes:
    meta = {**meta, "shape": shape,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shape}}}
    return json.dumps(meta).encode()


def test_a_point_array_declared_huge_is_refused_before_it_is_allocated(exported1, tmp_path):
    """An export of ~270 kB whose point store declares a 16000² float64 array (2 GB) and lacks
    its chunk: verify and import refuse it from the metadata (exit 2, nothing written), and
    verifying allocates nothing near its size."""
    _, dest, manifest = exported1
    h = manifest["points"][0]
    key, meta = _point_array(dest, h, "weight_cov")
    bad = _recrafted(dest, tmp_path / "huge.zip", {key: _with_shape(meta, [16000, 16000])},
                     drop=(f"points/{h}.zarr/weight_cov/c/0/0",))
    assert bad.stat().st_size < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(ShareError, match=r"array 'weight_cov' of point .* declares shape \(16000, 16000\)"):
            verify(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    _import_refused(bad, tmp_path, r"declares shape \(16000, 16000\) of float64, 2048000000 bytes; allowed: "
                                   r"at most 1073741824 bytes")


def test_arrays_declaring_more_than_the_file_can_hold_are_refused(exported1, tmp_path):
    """Each array below the one-array bound, but together far more than the file's size allows
    (100 times): refused naming the bound."""
    _, dest, manifest = exported1
    h = manifest["points"][1]
    key, meta = _point_array(dest, h, "weight_cov")
    bad = _recrafted(dest, tmp_path / "large.zip", {key: _with_shape(meta, [3000, 3000])},
                     drop=(f"points/{h}.zarr/weight_cov/c/0/0",))
    _import_refused(bad, tmp_path, r"its arrays declare \d+ bytes or more .*more than 100 times the file's")


def test_an_array_with_more_chunks_than_the_file_has_members_is_refused(exported1, tmp_path):
    _, dest, manifest = exported1
    h = manifest["points"][2]
    key, meta = _point_array(dest, h, "weight_mean")
    meta = {**meta, "shape": [10**8], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
            "data_type": "bool", "fill_value": False}
    bad = _recrafted(dest, tmp_path / "chunks.zip", {key: json.dumps(meta).encode()},
                     drop=(f"points/{h}.zarr/weight_mean/c/0",))
    _import_refused(bad, tmp_path, r"array 'weight_mean' of point .* declares 100000000 chunks")


def test_a_string_array_in_a_point_store_is_refused(exported1, tmp_path):
    """A Zarr string array where a point store holds numbers: a clear error (exit 2), never a
    traceback, and nothing imported."""
    _, dest, manifest = exported1
    h = manifest["points"][0]
    key, meta = _point_array(dest, h, "weight_var_replica")
    meta = {**meta, "data_type": "string", "fill_value": "", "codecs": [{"name": "vlen-utf8", "configuration": {}}]}
    bad = _recrafted(dest, tmp_path / "strings.zip", {key: json.dumps(meta).encode()},
                     drop=(f"points/{h}.zarr/weight_var_replica/c/0",))
    _import_refused(bad, tmp_path, r"array 'weight_var_replica' of point \w+'s store .* has data type .*allowed "
                                   r"there: a number or a boolean")


def _ensemble_with(dest: Path, tmp: Path, name: str, edit) -> dict[str, bytes]:
    """The root members of the export ``dest`` after ``edit(meta)`` rewrote array ``name``'s
    metadata, re-consolidated and with the metadata record sgdsweep keeps rewritten to match
    (what a forger who knows the format does): member name → bytes."""
    import zarr

    from sgdsweep.store.integrity import record_metadata

    root = tmp / "ensemble.zarr"
    with zipfile.ZipFile(dest) as zf:
        for n in zf.namelist():
            if not n.startswith("points/") and n not in ("sgdsweep-manifest.json", "README.txt", "fits.json"):
                (root / n).parent.mkdir(parents=True, exist_ok=True)
                (root / n).write_bytes(zf.read(n))
    meta = json.loads((root / name / "zarr.json").read_text())
    (root / name / "zarr.json").write_text(json.dumps(edit(meta)))
    zarr.consolidate_metadata(str(root))
    record_metadata(root)
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in root.rglob("*") if f.is_file()}


def test_merge_refuses_an_ensemble_array_declared_huge(exported, tmp_path):
    """`sgdsweep merge` of an export whose ensemble (re-recorded) declares a 1 GB array: refused
    from the metadata (exit 2, no traceback), nothing written; a larger one too, never a
    MemoryError."""
    _, dest, _ = exported
    for n, shape, message in ((1, [125_000_000], "its arrays declare 100000"),
                              (2, [4 * 10**9], ("array 'weight_var' of the ensemble (the zip's root group) "
                                                "declares shape (4000000000,)"))):
        replace = _ensemble_with(dest, tmp_path / f"e{n}", "weight_var", lambda m, s=shape: {
            **m, "shape": s, "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": s}}})
        bad = _forged(dest, tmp_path / f"ens{n}.zip", replace=replace)
        out = tmp_path / f"merged{n}.zip"
        proc = cli("merge", str(dest), str(bad), "--out", str(out))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr, proc.stderr
        assert not out.exists()


def test_a_legitimate_export_is_within_every_bound(exported):
    from sgdsweep.share.bounds import check_declared

    _, dest, manifest = exported
    total = check_declared(dest, manifest, dest.stat().st_size, dest)
    assert 0 < total < dest.stat().st_size


@pytest.mark.parametrize("schema", [2, 1])
def test_verify_reads_each_points_metadata_without_listing_the_whole_file(exported, exported1, monkeypatch, schema):
    """Verifying an export lists the zip's names for the ensemble only: a point's store is read
    from its own members. Zarr's ZipStore scans every name of the file to list one group, so
    listing each point's group there (schema 1) made verify quadratic (a 10^4-point export: over
    15 minutes)."""
    import zarr

    _, dest, manifest = exported if schema == 2 else exported1
    listed: list[str] = []
    original = zarr.storage.ZipStore.list_dir

    def counting(self, prefix):
        listed.append(prefix)
        return original(self, prefix)

    monkeypatch.setattr(zarr.storage.ZipStore, "list_dir", counting)
    assert verify(dest)["points"] == manifest["points"]
    assert listed, "the ensemble's group is listed through the zip store"
    assert not [p for p in listed if p.startswith("points")], listed


@pytest.mark.parametrize("shape", [[16000, 16000], [3]])
def test_a_point_group_of_zarr_format_2_is_refused(exported1, tmp_path, shape):
    """A point's group that says Zarr format 2 lists its arrays from ``.zarray`` members, which
    a reader of its ``zarr.json`` members would not see: verify and import refuse it, whatever
    array it hides."""
    _, dest, manifest = exported1
    h = manifest["points"][0]
    key = f"points/{h}.zarr/zarr.json"
    with zipfile.ZipFile(dest) as zf:
        group = {**json.loads(zf.read(key)), "zarr_format": 2}
    zarray = {"zarr_format": 2, "shape": shape, "chunks": shape, "dtype": "<f8", "compressor": None,
              "fill_value": 7.0, "order": "C", "filters": None}
    bad = _forged(dest, tmp_path / "v2.zip", replace={key: json.dumps(group).encode()},
                  add=[(f"points/{h}.zarr/hidden/.zarray", json.dumps(zarray).encode())])
    _import_refused(bad, tmp_path, rf"the metadata of point {h}'s store \(points/{h}.zarr\) is not what "
                    "sgdsweep writes")


def test_a_points_consolidated_metadata_is_not_what_import_reads(exported1, tmp_path):
    """A point's group may carry a consolidated copy of its arrays' metadata in its ``zarr.json``;
    verify bounds each array's own ``zarr.json``, so import reads those too: a copy declaring
    another shape changes nothing imported."""
    from sgdsweep.store.points import PointStore, point_path

    sweep_dir, dest, manifest = exported1
    h = manifest["points"][0]
    _, array = _point_array(dest, h, "weight_cov")
    with zipfile.ZipFile(dest) as zf:
        group = json.loads(zf.read(f"points/{h}.zarr/zarr.json"))
    group["consolidated_metadata"] = {"kind": "inline", "must_understand": False,
                                      "metadata": {"weight_cov": json.loads(_with_shape(array, [4096, 4096]))}}
    crafted = _forged(dest, tmp_path / "cons.zip", replace={f"points/{h}.zarr/zarr.json": json.dumps(group).encode()})
    verify(crafted)
    target = import_sweep(crafted, tmp_path / "R")
    with PointStore(point_path(target / "points", h)) as got, PointStore(point_path(sweep_dir / "points", h)) as mine:
        assert sorted(got.arrays) == sorted(mine.arrays)
        assert np.array_equal(got.read("weight_cov"), mine.read("weight_cov"))


def test_import_refuses_to_land_inside_another_sweep(exported, tmp_path):
    """An import whose results directory lies inside another sweep's directory (whose next run
    would delete it) is refused before anything is written, as `sgdsweep run` refuses it."""
    _, dest, _ = exported
    outer = tmp_path / "results" / "outer"
    (outer / "plan").mkdir(parents=True)
    (outer / "plan" / "sweep.json").write_text("{}")
    proc = cli("import", str(dest), "--results-dir", str(outer / "figures"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "lies inside another sweep's directory" in proc.stderr and str(outer) in proc.stderr
    assert "--results-dir" in proc.stderr
    assert not (outer / "figures").exists()
    target = import_sweep(dest, tmp_path / "side")
    assert (target / "config.yaml").is_file()


@pytest.fixture(scope="module")
def precise(tmp_path_factory):
    """An export of a finished precision sweep whose rounds extended some points."""
    from conftest import precise_config as config
    from conftest import run_rounds

    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.core.paths import atomic_write_text
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble
    from sgdsweep.sweep.plan import write_plan

    root = tmp_path_factory.mktemp("precise")
    finished = run_rounds(config(root / "here"))
    files = write_plan(finished)
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    atomic_write_text(files.fits, json.dumps(fit_ensemble(ds, finished.config["fit"])))
    dest = root / "precise.zip"
    manifest = export_sweep(files.root, str(dest))
    return finished, dest, manifest


def test_a_precision_export_with_its_last_round_left_out_is_refused(precise, tmp_path):
    """Re-signed without the last round's store of an extended point (its checksums all match):
    replaying the rounds from the file reaches that point, which a run of the import would
    simulate, so verify and import refuse it."""
    finished, dest, manifest = precise
    h, last = next((h, p) for h, p in finished.rounds["points"].items() if p["rounds"])
    assert h in manifest["points"] and last["hashes"][-1] == h
    with zipfile.ZipFile(dest) as zf:
        drop = (f"points/{h}.npz",)
        assert drop[0] in zf.namelist()

    def change(m):
        m["points"].remove(h)
    partial = tmp_path / "partial.zip"
    _rewrite(dest, partial, lambda n, d: None if n in drop else d)
    bad = _forged(partial, tmp_path / "dropped.zip",
                  change=lambda m: (change(m), [m["members"].pop(n) for n in drop]))
    _import_refused(bad, tmp_path, rf"reaches point {h} .*which a run of the import would simulate")


def test_a_precision_export_with_a_tightened_target_is_refused(precise, tmp_path):
    """Re-signed with a tighter target and a huge budget: the rounds replayed from the file's own
    stores extend its points beyond them, so verify and import refuse it (exit 2)."""
    _, dest, _ = precise

    def change(m):
        m["config"]["precision"] = {"observables": {"weight_var": {"rel_se": 0.001}},
                                    "budget": {"max_rounds": 50, "max_replicas": 10**6, "max_replica_steps": 1e15}}
    bad = _forged(dest, tmp_path / "tight.zip", change=change)
    _import_refused(bad, tmp_path, r"reaches point \w+ .*which a run of the import would simulate")


def test_a_precision_export_verifies_and_its_rounds_are_replayed(precise, tmp_path):
    _, dest, manifest = precise
    assert verify(dest)["points"] == manifest["points"]
    proc = cli("verify", str(dest))
    assert proc.returncode == 0, proc.stderr
