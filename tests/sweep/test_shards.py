"""Shards by work: many data sets share one workflow job, the grouping is stable as a sweep grows,
and a rerun of a shard of several data sets simulates only the points that changed."""

from __future__ import annotations

import json

import xarray as xr
from conftest import cli, run_cli, run_snakemake, tiny_config, write_yaml

from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.shards import DEFAULT_SHARD_WORK, point_work, shard_count_exponent


def _sweep(tmp_path, spps, shard_work=DEFAULT_SHARD_WORK, lrs=(0.2, 0.4)):
    return build_sweep(tiny_config(results_dir=str(tmp_path / "results"),
                                   grid={"lr": list(lrs), "batch_size": 2, "samples_per_param": list(spps)},
                                   execution={"shard_work": shard_work}))


def test_data_sets_share_shards_by_work(tmp_path):
    spps = [10 + i for i in range(40)]
    one = _sweep(tmp_path, spps)
    assert len({p.data_set for p in one.points}) == 40 and len(one.shards) == 1  # 40 small data sets, one job
    per_point = point_work(one.points[0])
    target = 5 * 2 * per_point  # five data sets' work per shard: 40/5 = 8 shards
    eight = _sweep(tmp_path, spps, target)
    assert len(eight.shards) <= 8 and shard_count_exponent({d: 1 for d in range(40)}, 5) == 3
    assert all(len({p.data_set for p in points}) >= 1 for points in eight.shards.values())
    each = _sweep(tmp_path, spps, 0)
    assert len(each.shards) == 40 and all(p.shard == p.data_set for p in each.points)
    # never more shards than data sets (rounded up to a power of two)
    assert shard_count_exponent({"a": 10**12, "b": 10**12}, 1) == 1


def test_the_grouping_is_stable_as_the_sweep_grows(tmp_path):
    spps = [10 + i for i in range(40)]
    per_point = point_work(_sweep(tmp_path, spps[:1]).points[0])
    target = 6 * 2 * per_point
    before = {p.hash: p.shard for p in _sweep(tmp_path, spps, target).points}
    grown = _sweep(tmp_path, [*spps, 60], target)  # one data set more, same number of shards
    assert {p.hash: p.shard for p in grown.points if p.hash in before} == before
    assert len({p.shard for p in grown.points}) <= 8
    doubled = _sweep(tmp_path, spps, target, lrs=(0.2, 0.4, 0.3, 0.35))  # twice the work: twice the shards
    work = {p.data_set: 0 for p in doubled.points}
    for p in doubled.points:
        work[p.data_set] += point_work(p)
    assert shard_count_exponent(work, target) == 4


def test_a_shard_of_several_data_sets_reruns_only_what_changed(tmp_path):
    """Two data sets in one shard job; a value added to one data set and a third data set
    simulate only their own points, once each, and the ensemble holds every point."""
    grid = {"lr": [0.2, 0.4], "batch_size": 2, "samples_per_param": [10, 12]}
    cfg = tiny_config(results_dir=str(tmp_path / "results"), grid=grid, execution={"shard_work": DEFAULT_SHARD_WORK})
    path = write_yaml(tmp_path / "t.yaml", cfg)
    assert len(build_sweep(cfg).shards) == 1
    # the point stores and the ensemble only (the workflow's `ensemble` target), no fit or report
    run = run_cli("run", str(path), "--cores", "2", "--", "ensemble", cwd=tmp_path, cluster="own")
    assert run.returncode == 0, run.stderr[-3000:]
    sweep = tmp_path / "results" / "tiny"
    assert (sweep / "ensemble.zarr").is_dir() and not (sweep / "fits.json").exists()
    assert not (sweep / "report.html").exists()
    # a target alone keeps the run's own Dask cluster: the shard job connects to it
    (job_log,) = (sweep / "logs" / "simulate").glob("*.log")
    assert "starting a local Dask cluster" in run.stderr and "this job's cluster" not in job_log.read_text()

    def simulated() -> list[str]:
        (receipt,) = (sweep / "shards").glob("*.json")
        return json.loads(receipt.read_text())["simulated"]

    assert len(simulated()) == 4
    # a data set more, everything built; then a value more, the ensemble only: the fits, report
    # and figures of the earlier ensemble are removed, none left looking current
    for new_grid, new, targets in (({**grid, "samples_per_param": [10, 12, 14]}, 2, ()),
                                   ({**grid, "lr": [0.2, 0.4, 0.3], "samples_per_param": [10, 12, 14]}, 3,
                                    ("ensemble",))):
        cfg["grid"] = new_grid
        write_yaml(path, cfg)
        points = {p.hash for p in build_sweep(cfg).points}
        proc = run_snakemake(tmp_path, path, targets=targets)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(simulated()) == new and set(simulated()) <= points, simulated()
        assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == len(points)
        built = [p.exists() for p in (sweep / "fits.json", sweep / "report.html", sweep / "figures")]
        assert built == [not targets] * 3, built
    refused = cli("export", str(sweep), str(tmp_path / "e.zip"))  # no fits of this ensemble: nothing to share
    assert refused.returncode == 2 and "fits.json is missing" in refused.stderr
