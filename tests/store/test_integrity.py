"""Stores that must not lie about their point: a point store read under a point's name is that
point's (plan, aggregate, the shard's simulation), an ensemble's metadata is what sgdsweep wrote
(load_ensemble, open_ensemble, fit, report, export), and a point store of the first layout (a
Zarr directory, which has no checksum) has all its chunk files. Exports: tests/share/test_share.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import as_directory_store, cli, make_finished_sweep, tiny_config, write_yaml

from sgdsweep.core.identity import content_hash
from sgdsweep.errors import StoreError
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import migrate
from sgdsweep.store import points as point_store
from sgdsweep.store.aggregate import build_ensemble, load_ensemble, open_ensemble
from sgdsweep.sweep.config import Sweep, build_sweep
from sgdsweep.sweep.plan import PlanFiles


def _finished(tmp_path: Path) -> tuple[Path, Sweep, PlanFiles]:
    """A finished tiny sweep (make_finished_sweep), its config file, sweep and files."""
    root = make_finished_sweep(tmp_path)
    cfg = tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1500, "replicas": 4})
    return write_yaml(tmp_path / "tiny.yaml", cfg), build_sweep(cfg), PlanFiles(root)


def _plan_line(config: Path, point_hash: str) -> tuple[str, str]:
    """(the whole output, the line of ``point_hash``) of the real ``sgdsweep plan CONFIG``."""
    proc = cli("plan", str(config))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, next(line for line in proc.stdout.splitlines() if point_hash in line)


def _by_axes(sweep: Sweep) -> dict[tuple[float, int], object]:
    return {(p.params["lr"], p.params["batch_size"]): p for p in sweep.points}


def test_a_store_copied_onto_another_points_name_does_not_count_as_stored(tmp_path):
    """Point (0.2, 2)'s store copied under point (0.4, 2)'s name: not stored, the plan says whose
    results it holds, aggregation refuses it naming the file; the point's simulation replaces the
    copy with its own results, and the ensemble then holds each point once."""
    config, sweep, files = _finished(tmp_path)
    points = _by_axes(sweep)
    a, b = points[(0.2, 2)], points[(0.4, 2)]
    store_a, store_b = (point_store.point_path(files.points_dir, p.hash) for p in (a, b))
    original_a = store_a.read_bytes()
    own_b = point_store.read_array(store_b, "weight_var_replica")
    shutil.copyfile(store_a, store_b)
    assert point_store.is_complete(store_b)  # a whole store, but not point b's
    everything = {p.hash for p in sweep.points}
    assert point_store.complete_points(files.points_dir, everything) == everything - {b.hash}
    out, line = _plan_line(config, b.hash)
    assert "3 stored, 1 to simulate (1 misnamed)" in out, out
    assert f"misnamed ({store_b.name}: it holds the results of point {a.hash}: lr 0.2 where this point has 0.4" in line
    assert "replaced when this point is simulated" in line, line
    with pytest.raises(StoreError, match=f"point store {store_b} is not the store of point {b.hash}: "
                                         f"it holds the results of point {a.hash}"):
        build_ensemble(json.loads(files.sweep_spec.read_text()))
    simulate_points([b.spec()], str(files.points_dir))  # what the shard's job does with it
    assert point_store.read_attrs(store_b)["point_hash"] == b.hash
    np.testing.assert_array_equal(point_store.read_array(store_b, "weight_var_replica"), own_b)
    assert store_a.read_bytes() == original_a
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    assert sorted(zip(ds["lr"].values.tolist(), ds["batch_size"].values.tolist())) == sorted(points)


def test_a_store_renamed_onto_another_points_name_is_moved_back_when_that_point_runs(tmp_path, caplog):
    """A store moved (not copied) onto another point's name is that other point's only copy: the
    simulation of the point whose name it took moves it back to its own name, saying so, and
    never overwrites it."""
    config, sweep, files = _finished(tmp_path)
    points = _by_axes(sweep)
    a, b = points[(0.2, 2)], points[(0.4, 2)]
    store_a, store_b = (point_store.point_path(files.points_dir, p.hash) for p in (a, b))
    original_a = store_a.read_bytes()
    os.replace(store_a, store_b)
    out, line = _plan_line(config, b.hash)
    assert "2 stored, 2 to simulate (1 misnamed, 1 new)" in out, out
    assert f"moved to point {a.hash}'s name if that point has no store" in line, line
    with caplog.at_level(logging.WARNING, logger="sgdsweep.store.point_identity"):
        simulate_points([b.spec()], str(files.points_dir))
    assert f"held point {a.hash}'s results, not point {b.hash}'s: moved to {store_a}" in caplog.text
    assert store_a.read_bytes() == original_a  # back under its own name, bitwise
    assert point_store.read_attrs(store_b)["point_hash"] == b.hash
    everything = {p.hash for p in sweep.points}
    assert point_store.complete_points(files.points_dir, everything) == everything


def test_a_store_with_edited_parameters_is_not_its_points(tmp_path):
    """A store whose recorded parameters were changed (and so hash to another point) is not the
    point's store, whatever hash it records; nor is a store that records no identity."""
    h = content_hash({"lr": 0.1})
    path = point_store.point_path(tmp_path, h)
    arrays = {"x": (("replica",), np.ones(2))}
    point_store.write_point(path, arrays, {"point_hash": h, "params": {"lr": 0.2}})
    assert point_store.is_complete(path) and not point_store.is_complete(path, point_hash=h)
    with point_store.PointStore(path) as store, pytest.raises(
            StoreError, match=f"its parameters hash to {content_hash({'lr': 0.2})}, not {h}"):
        store.check_identity(h)
    other = point_store.point_path(tmp_path, content_hash({"lr": 0.3}))
    point_store.write_point(other, arrays, {"summary": {}})
    assert point_store.complete_points(tmp_path, [h, other.stem]) == set()


def _chunks(directory: Path) -> list[Path]:
    return sorted(f for f in directory.rglob("*") if f.is_file() and f.name != "zarr.json")


def test_a_directory_store_missing_a_chunk_is_damaged_and_recomputed(tmp_path):
    """A point store of the first layout (a Zarr directory) whose chunk file was deleted reads
    zeros through Zarr; it is not migrated (the migration names the array; plan: corrupt), and
    the point's simulation stores it as .npz, which then supersedes it."""
    config, sweep, files = _finished(tmp_path)
    p = sweep.points[0]
    expected = point_store.read_array(point_store.point_path(files.points_dir, p.hash), "weight_var_replica")
    directory = as_directory_store(point_store.point_path(files.points_dir, p.hash))
    assert migrate.legacy_problem(directory) is None
    (chunk,) = _chunks(directory / "weight_var_replica")
    chunk.unlink()
    read = np.asarray(zarr.open_group(str(directory), mode="r")["weight_var_replica"][...])
    assert (read == 0).all()  # what Zarr alone reads for a lost chunk: the fill value
    _, line = _plan_line(config, p.hash)
    assert f"corrupt (incomplete or unreadable store of an earlier layout, {directory.name}" in line, line
    result = migrate.migrate_points(files.points_dir)
    assert result.migrated == [] and list(result.damaged) == [p.hash]
    assert f"point store {directory} is damaged: array 'weight_var_replica' has 1 of its 1 chunk file(s) " \
           "missing" in result.damaged[p.hash]
    assert directory.exists() and p.hash not in point_store.complete_points(files.points_dir, [p.hash])
    simulate_points([p.spec()], str(files.points_dir))
    assert migrate.remove_superseded(files.points_dir, [p.hash]) == [directory]
    np.testing.assert_array_equal(
        point_store.read_array(point_store.point_path(files.points_dir, p.hash), "weight_var_replica"), expected)


def test_directory_stores_are_written_with_every_chunk(tmp_path):
    """write_zarr_group writes the chunk of an array holding only the fill value (zeros) too, so
    such a store is complete (it would be migrated), and reads back the same."""
    h = content_hash({"lr": 0.1})
    path = point_store.point_path(tmp_path, h)
    point_store.write_point(path, {"zeros": (("replica",), np.zeros(3)), "ones": (("replica",), np.ones(3))},
                            {"point_hash": h, "params": {"lr": 0.1}})
    directory = as_directory_store(path)
    assert _chunks(directory / "zeros") and migrate.legacy_problem(directory) is None
    with migrate.open_legacy(directory) as group:
        group.check_identity(h)
        np.testing.assert_array_equal(group.read("zeros"), np.zeros(3))


def _edit(path: Path, change) -> None:
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta, indent=2))


def _big_endian(meta: dict) -> None:
    meta["codecs"][0]["configuration"]["endian"] = "big"


def _scaled(meta: dict) -> None:
    meta["attributes"]["scale_factor"] = 2


EDITS = {  # (where: the array's own zarr.json or its copy in the consolidated metadata, change)
    "own_big_endian": ("own", _big_endian), "own_scale_factor": ("own", _scaled),
    "consolidated_big_endian": ("consolidated", _big_endian), "consolidated_scale_factor": ("consolidated", _scaled),
}


def _edited_copy(ensemble: Path, dest: Path, case: str) -> Path:
    shutil.copytree(ensemble, dest)
    where, change = EDITS[case]
    if where == "own":
        _edit(dest / "weight_var" / "zarr.json", change)
    else:
        _edit(dest / "zarr.json", lambda root: change(root["consolidated_metadata"]["metadata"]["weight_var"]))
    return dest


def test_edited_ensemble_metadata_is_refused_naming_the_array(tmp_path):
    """An array's metadata edited so that it still parses (the bytes codec's endian, a
    scale_factor attribute), in its own zarr.json or in the consolidated copy that xarray reads:
    plain Zarr/xarray then read other numbers without an error (which no check can prevent);
    load_ensemble and open_ensemble refuse it, naming the array and the document."""
    _, _, files = _finished(tmp_path)
    good = load_ensemble(files.ensemble)["weight_var"].values
    assert "sgdsweep_metadata_sha256" not in load_ensemble(files.ensemble).attrs  # checked, not data
    for case, (where, _) in EDITS.items():
        path = _edited_copy(files.ensemble, tmp_path / f"{case}.zarr", case)
        plain = xr.open_zarr(path, consolidated=where == "consolidated")["weight_var"].values
        assert not np.allclose(plain, good), case  # the lie a plain reader is told
        document = path / "weight_var" / "zarr.json" if where == "own" else path / "zarr.json"
        for read in (load_ensemble, open_ensemble):
            with pytest.raises(StoreError, match=rf"the metadata of array 'weight_var' \(.*{document}\) differs "
                                                 "from what sgdsweep wrote"):
                read(path)


def test_fit_report_and_export_refuse_an_edited_ensemble(tmp_path):
    """The real commands on a sweep whose ensemble metadata was edited (scale_factor in the
    consolidated metadata, what xarray reads): fit and report fail naming the array and write
    nothing; export refuses before writing (exit 2)."""
    _, _, files = _finished(tmp_path)
    shutil.move(files.ensemble, tmp_path / "good.zarr")
    _edited_copy(tmp_path / "good.zarr", files.ensemble, "consolidated_scale_factor")
    message = "the metadata of array 'weight_var'"
    fit = cli("fit", str(files.ensemble), "--spec", str(files.fit_spec), "--out", str(tmp_path / "f.json"))
    report = cli("report", "--ensemble", str(files.ensemble), "--fits", str(files.fits), "--spec",
                 str(files.report_spec), "--out", str(tmp_path / "r.html"))
    for proc in (fit, report):
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "r.html").exists()
    export = cli("export", str(files.root), str(tmp_path / "out.zip"))
    assert export.returncode == 2 and f"{files.root} is not exported" in export.stderr, export.stderr
    assert message in export.stderr and not (tmp_path / "out.zip").exists()
