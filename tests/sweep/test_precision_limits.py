"""Precision sweeps' limits and leftovers: targets on quantities the model does not measure are
refused, the lanes' disk use is estimated, printed and bounded by precision.budget.disk, and what
killed writes and imports leave is removed without touching a write in progress
(sgdsweep/sweep/precision.py, sgdsweep/store/leftovers.py, docs/precision.md, docs/reliability.md)."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PRECISE, cli, make_finished_sweep, run_rounds, write_yaml

from sgdsweep.errors import ConfigError
from sgdsweep.run.execute import run_shard
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import lanes as lanes_store
from sgdsweep.store import leftovers
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan
from sgdsweep.sweep.precision import lane_disk

#: Older than any write in progress (sgdsweep.store.points.STALE_TEMPORARY_SECONDS).
OLD = point_store.STALE_TEMPORARY_SECONDS + 60


def config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(PRECISE)
    cfg["results_dir"] = str(tmp_path / "results")
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


def aged(path: Path, seconds: float = OLD) -> Path:
    """``path`` (and, for a directory, everything in it) last modified ``seconds`` ago."""
    when = time.time() - seconds
    for root, dirs, files in os.walk(path) if path.is_dir() else ():
        for name in dirs + files:
            os.utime(os.path.join(root, name), (when, when))
    os.utime(path, (when, when))
    return path


# --- targets on quantities the model measures ---------------------------------------------------


def test_an_escape_time_target_on_the_linear_model_is_refused_before_any_round(tmp_path):
    """The linear model has no escape: every round would find no replica escaped and quadruple
    the steps until the budget ran out. `sgdsweep plan` refuses it, naming the target, the
    model and what it measures, with exit status 2 and no traceback; nothing is written."""
    cfg = config(tmp_path, precision={"observables": {"escape_time": {"rel_se": 0.05}}})
    path = write_yaml(tmp_path / "escape.yaml", cfg)
    proc = cli("plan", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "precision.observables.escape_time" in proc.stderr and "model.kind linear" in proc.stderr
    assert "weight_var, loss, loss_autocorr_time, test_loss" in proc.stderr  # what it measures
    assert "landscape" in proc.stderr  # the models that do measure it
    assert not (tmp_path / "results" / "precise" / "points").exists()


def test_targets_on_quantities_switched_off_or_not_defined_are_refused_naming_the_switch(tmp_path):
    cfg = config(tmp_path, dynamics={"observe": {"loss": False}},
                 precision={"observables": {"loss_autocorr_time": {"rel_se": 0.05}}})
    with pytest.raises(ConfigError, match=r"precision\.observables\.loss_autocorr_time.*dynamics\.observe\.loss "
                                          r"is off"):
        build_sweep(cfg)
    cfg = config(tmp_path, precision={"observables": {"weight_var": {"rel_se": 0.05}},
                                      "fits": {"escape.slope": 0.1}}, fit={"escape": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"precision\.fits\.escape\.slope.*escape times"):
        build_sweep(cfg)
    # the quantities the model does measure are accepted
    ok = config(tmp_path, precision={"observables": {"test_loss": {"rel_se": 0.05},
                                                     "loss_autocorr_time": {"rel_se": 0.05}}})
    assert build_sweep(ok).rounds["kind"] == "precision"


# --- the lanes' disk ------------------------------------------------------------------------------


def test_the_lane_disk_estimate_is_the_bytes_of_the_lanes_a_round_stores(tmp_path):
    """One replica's lanes as estimated from the shapes (Footprint.lane_bytes) are exactly the
    bytes of the arrays a round stores per replica; the estimate is that times max_replicas per
    point."""
    cfg = config(tmp_path, precision={"budget": {"max_replicas": 1000}})
    sweep = build_sweep(cfg)
    simulate_points([p.spec() for p in sweep.points], str(sweep.directory / "points"))
    est = lane_disk(sweep)
    for p in sweep.points:
        arrays, rows = lanes_store.read_lanes(sweep.directory / "points", p.lanes, 8)
        assert rows == 8
        assert sum(a.nbytes for a in arrays.values()) == rows * sweep.footprints[p.data_set].lane_bytes
    assert est.per_replica == sweep.footprints[sweep.points[0].data_set].lane_bytes
    assert est.total == len(sweep.points) * 1000 * est.per_replica
    # the files hold those bytes and a few kB of headers per part
    stored = lanes_store.stored_bytes(sweep.directory / "points")
    assert 16 * est.per_replica < stored < 16 * est.per_replica + 2 * 16384


def test_sgdsweep_plan_prints_the_lane_disk_and_refuses_a_sweep_beyond_the_disk_budget(tmp_path):
    cfg = config(tmp_path, precision={"budget": {"disk": "20G"}})
    est = lane_disk(build_sweep(cfg))
    assert est.limit == 20 * 10**9
    proc = cli("plan", str(write_yaml(tmp_path / "ok.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(s for s in proc.stdout.splitlines() if s.strip().startswith("disk:"))
    assert "414 MiB of stored lanes (2 point(s) × max_replicas 65536 × 3.23 KiB per replica)" in line
    assert "0 B stored now; limit 18.6 GiB (precision.budget.disk)" in line
    # beyond it: refused with the numbers and the ways out, exit status 2, nothing written
    cfg["precision"]["budget"]["disk"] = "100MB"
    proc = cli("plan", str(write_yaml(tmp_path / "small.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "precision.budget.disk" in proc.stderr and "'100MB'" in proc.stderr
    assert "414 MiB against 95.4 MiB" in proc.stderr
    assert "lower precision.budget.max_replicas to 15096 or fewer" in proc.stderr
    assert not (tmp_path / "results" / "precise" / "points").exists()
    cfg["precision"]["budget"]["max_replicas"] = 15096  # the fix it names fits
    assert lane_disk(build_sweep(cfg)).total <= 100 * 10**6
    for bad in ("lots", "-5GB", 0):
        cfg["precision"]["budget"]["disk"] = bad
        with pytest.raises(ConfigError, match=r"precision\.budget\.disk"):
            build_sweep(cfg)


def test_the_default_disk_budget_holds_eight_d64_points_at_the_default_max_replicas(tmp_path):
    """About 2.4 GB of lanes per point at d = 64 (its 64 × 64 covariance sums) at the default
    max_replicas: eight points fit the default 20 GiB, nine are refused."""
    def cfg(points: int) -> dict[str, Any]:
        return config(tmp_path, model={"kind": "linear", "n_inputs": 64, "label_noise": 0.5},
                      dynamics={"steps": 1000, "replicas": 8, "burn_in": 10},
                      grid={"lr": [0.001 * k for k in range(1, points + 1)], "batch_size": 2,
                            "samples_per_param": 2})

    est = lane_disk(build_sweep(cfg(8)))
    assert est.points == 8 and est.dim == 64 and est.limit == 20 * 2**30
    assert 2.4e9 < est.total / 8 < 2.5e9
    with pytest.raises(ConfigError, match=r"precision\.budget\.disk': got '20GiB'.*9 point\(s\).*d = 64 model.*"
                                          r"20\.3 GiB against 20 GiB\. To fix it, lower precision\.budget\."
                                          r"max_replicas to 64642 or fewer"):
        build_sweep(cfg(9))


# --- leftovers ------------------------------------------------------------------------------------


def test_the_shard_job_removes_what_killed_writes_left_of_earlier_rounds_and_lanes(tmp_path):
    """A shard job (run_shard, here on a round whose points are all stored: no simulation) removes
    the stale temporaries of any point (an earlier round's too), of lane parts, and lane parts cut
    short; it keeps young ones (a write in progress), complete parts, and everything the sweep
    reads, which gives the same rounds afterwards."""
    cfg = config(tmp_path)
    sweep = run_rounds(cfg)
    assert sweep.rounds["round"] >= 1
    points_dir = sweep.directory / "points"
    info = next(iter(sweep.rounds["points"].values()))
    earlier = info["hashes"][0]  # the point's round-0 hash: not in the current round's shard specs
    key = sweep.points[0].lanes
    lanes_dir = points_dir / lanes_store.LANES_DIR
    _, stop, real = lanes_store.parts(points_dir, key)[0]
    data = real.read_bytes()

    def make(path: Path, content: bytes = b"PK partial", age: float | None = OLD) -> Path:
        path.write_bytes(content)
        return aged(path, age) if age is not None else path

    other_key = "0123456789abcdef"
    stale = [make(points_dir / f".{earlier}.npz.tmp-0badf00d"),  # an earlier round's point
             make(lanes_dir / f".{other_key}.0-8.npz.tmp-0badf00d"),  # another lanes' part
             make(lanes_dir / f"{key}.{stop}-{stop + 8}.npz", data[: len(data) // 2]),  # cut short by a kill
             make(lanes_dir / f"{other_key}.0-8.npz", data[:-3]),
             make(lanes_dir / f".{key}.{stop}-{stop + 4}.npz.tmp-live0001", age=None)]  # this shard's own
    kept = [make(points_dir / f".{earlier}.npz.tmp-live0002", age=None),  # young: a write in progress
            make(lanes_dir / f".{other_key}.8-16.npz.tmp-live0003", age=None),
            make(lanes_dir / f"{other_key}.8-16.npz", data[: len(data) // 2], age=None),
            make(lanes_dir / f"{other_key}.16-24.npz",  # damaged, not cut short: read, refused by name
                 data[:100] + bytes([data[100] ^ 1]) + data[101:])]
    before = {p.name: p.read_bytes() for p in lanes_dir.iterdir() if p not in stale + kept}
    files = write_plan(sweep)
    shard = next(s for s, pts in sweep.shards.items() if any(p.lanes == key for p in pts))
    receipt = run_shard(files.shard_spec(shard), tmp_path / "receipt.json", {"points_per_task": 2})
    assert receipt["simulated"] == []
    assert not any(p.exists() for p in stale), [p.name for p in stale if p.exists()]
    assert all(p.exists() for p in kept), [p.name for p in kept if not p.exists()]
    assert {p.name: p.read_bytes() for p in lanes_dir.iterdir() if p.name in before} == before
    again = build_sweep(cfg)
    assert [p.hash for p in again.points] == [p.hash for p in sweep.points]
    assert lanes_store.read_lanes(points_dir, key, stop)[1] == stop


def test_cut_short_reads_only_the_end_of_a_store(tmp_path):
    path = point_store.point_path(tmp_path, "a1")
    point_store.write_point(path, {"x": (("replica",), np.arange(1000.0))}, {})
    assert not leftovers.cut_short(path)
    data = path.read_bytes()
    for n in (len(data) - 1, len(data) // 2, 10, 0):
        path.write_bytes(data[:n])
        assert leftovers.cut_short(path)
    assert not leftovers.cut_short(tmp_path / "absent.npz")  # unreadable: nothing removed on a guess


def test_an_import_killed_midway_leaves_a_staging_directory_that_the_next_import_removes(tmp_path):
    """A killed `sgdsweep import` leaves <results>/.import-<hex>; the next import removes it once
    nothing in it changed for the stale age, and keeps one that changed since (an import in
    progress), and other directories."""
    from sgdsweep.share.archive import export_sweep

    sweep_dir = make_finished_sweep(tmp_path / "src")
    export = tmp_path / "tiny.zip"
    export_sweep(sweep_dir, str(export))
    results = tmp_path / "elsewhere" / "results"
    results.mkdir(parents=True)

    def staging(name: str, age: float | None, fresh_member: bool = False) -> Path:
        root = results / name
        (root / "ensemble.zarr").mkdir(parents=True)
        (root / "ensemble.zarr" / "zarr.json").write_text("{}")
        (root / "points").mkdir()
        if age is not None:
            aged(root, age)
        if fresh_member:  # a member being written now, deep inside an old directory
            (root / "ensemble.zarr" / "c0").write_bytes(b"partial")
        return root

    killed = staging(".import-0badf00d", OLD)
    live = staging(".import-1234abcd", None)
    writing = staging(".import-abcdef01", OLD, fresh_member=True)
    other = staging(".import-not-ours", OLD)
    proc = cli("import", str(export), "--results-dir", str(results), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (results / "tiny" / "config.yaml").is_file()
    assert not killed.exists()
    assert live.exists() and writing.exists() and other.exists()
    assert sorted(p.name for p in results.iterdir()) == [".import-1234abcd", ".import-abcdef01",
                                                         ".import-not-ours", "tiny"]
    assert json.loads((results / "tiny" / "fits.json").read_text())
