"""Precision targets: points extended over rounds by replicas that continue the replica index,
decided from the stored data, within a budget (sgdsweep/sweep/precision.py, docs/precision.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import REPO, run_cli, run_rounds, write_yaml
from conftest import precise_config as config

from sgdsweep.core.identity import content_hash, points_digest, replica_stream_key
from sgdsweep.errors import ConfigError
from sgdsweep.run.simulate import simulate_points
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.store import lanes as lanes_store
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.precision import fit_archive_name, needs, replicas_needed


def store(sweep, point_hash: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    path = point_store.point_path(sweep.directory / "points", point_hash)
    with point_store.PointStore(path) as s:
        return s.attrs, s.read_many(list(s.arrays))


def test_extensible_replica_streams_do_not_depend_on_the_number_of_replicas_or_steps():
    params = {"seed": 1, "lr": 0.1, "replicas": 8, "steps": 100, "extensible": True}
    key = replica_stream_key(params)
    assert key == replica_stream_key({**params, "replicas": 80, "steps": 5})
    assert key != replica_stream_key({**params, "lr": 0.2})
    # a plain point keeps the streams it always had (its size is part of its key)
    plain = {k: v for k, v in params.items() if k != "extensible"}
    assert replica_stream_key(plain) != replica_stream_key({**plain, "replicas": 80})
    first = [g[1].standard_normal(3) for g in replica_streams(1, key, 8)]
    later = [g[1].standard_normal(3) for g in replica_streams(1, key, 20, start=5)]
    np.testing.assert_array_equal(first[5], later[0])


def test_an_extended_point_is_bitwise_equal_to_the_point_run_at_full_size(tmp_path):
    cfg = config(tmp_path)
    swept = run_rounds(cfg)
    info = swept.rounds["points"]
    extended = [h for h, p in info.items() if p["rounds"] >= 1]
    assert extended, "the target must need at least one extension for this test to mean anything"
    # the same point run at its final size from the start: a first round that meets the target
    plain = config(tmp_path / "plain", precision={"observables": {"weight_var": {"rel_se": 0.9}}})
    for h in extended:
        p = next(q for q in swept.points if q.hash == h)
        plain["grid"] = {"lr": p.params["lr"], "batch_size": 2, "samples_per_param": 10}
        plain["dynamics"] = {"steps": p.params["steps"], "replicas": p.params["replicas"]}
        reference = build_sweep(plain)
        (q,) = reference.points
        assert q.hash == h  # the same point: its identity does not say how it was computed
        simulate_points([q.spec()], str(reference.directory / "points"))
        attrs_a, arrays_a = store(swept, h)
        attrs_b, arrays_b = store(reference, h)
        assert attrs_a["summary"] == attrs_b["summary"]
        assert arrays_a.keys() == arrays_b.keys()
        for name in arrays_a:
            np.testing.assert_array_equal(arrays_a[name], arrays_b[name], err_msg=name)


def test_rounds_meet_every_target_and_reuse_every_stored_replica(tmp_path):
    cfg = config(tmp_path)
    sweep = run_rounds(cfg)
    for p in sweep.points:
        info = sweep.rounds["points"][p.hash]
        assert info["status"] == "met"
        s = point_store.read_attrs(point_store.point_path(sweep.directory / "points", p.hash))["summary"]
        assert s["weight_var_se"] / s["weight_var"] <= 0.02
        # the lanes' parts tile 0 … R without overlap: no replica was simulated twice
        parts = lanes_store.parts(sweep.directory / "points", lanes_store.lanes_key(p.params))
        assert [a for a, _, _ in parts] == [0, *[b for _, b, _ in parts[:-1]]]
        assert parts[-1][1] == p.params["replicas"] == info["replicas"]
        assert info["replica_steps"] == p.params["replicas"] * p.params["steps"]
        reasons = [r for h in info["history"] for r in h["reasons"]]
        assert all(r.startswith("weight_var rel SE ") and "replicas" in r for r in reasons)


def test_a_killed_round_resumes_from_its_stored_lanes(tmp_path):
    """A round killed after it stored the new replicas' lanes but before the point's store:
    the next run computes the point from the stored lanes and simulates nothing."""
    cfg = config(tmp_path)
    sweep = build_sweep(cfg)
    simulate_points([p.spec() for p in sweep.points], str(sweep.directory / "points"))
    sweep = build_sweep(cfg)
    p = next(q for q in sweep.points if sweep.rounds["points"][q.hash]["status"] == "pending")
    simulate_points([p.spec()], str(sweep.directory / "points"))
    point_store.point_path(sweep.directory / "points", p.hash).unlink()  # killed before the store
    parts_before = {path: path.stat().st_mtime_ns
                    for _, _, path in lanes_store.parts(sweep.directory / "points", p.lanes)}
    out = simulate_points([p.spec()], str(sweep.directory / "points"))
    assert out["replica_steps"] == 0
    assert point_store.is_complete(point_store.point_path(sweep.directory / "points", p.hash))
    assert {path: path.stat().st_mtime_ns
            for _, _, path in lanes_store.parts(sweep.directory / "points", p.lanes)} == parts_before


def test_an_unreachable_target_ends_at_the_budget_and_names_it(tmp_path):
    cfg = config(tmp_path, precision={"observables": {"weight_var": {"rel_se": 0.001}},
                                      "budget": {"max_replicas": 40}})
    sweep = run_rounds(cfg)
    for p in sweep.points:
        info = sweep.rounds["points"][p.hash]
        assert info["status"] == "budget: max_replicas = 40"
        assert p.params["replicas"] == 40
        assert info["history"][-1]["reasons"][-1] == "held to 40 replicas × 3000 steps by max_replicas = 40"
    cfg = config(tmp_path / "total", precision={"observables": {"weight_var": {"rel_se": 0.001}},
                                                "budget": {"max_replica_steps": 1e5}})
    sweep = run_rounds(cfg)
    statuses = {v["status"] for v in sweep.rounds["points"].values()}
    assert statuses == {"budget: max_replica_steps = 1e+05"}
    assert sweep.rounds["replica_steps"] <= 1e5


def test_needs_asks_for_replicas_from_the_spread_and_steps_from_censoring():
    r, t, reasons = needs({"weight_var": 1.0, "weight_var_se": 0.02}, 100, 1000, 100,
                          {"weight_var": {"rel_se": 0.01}})
    assert (r, t) == (351, 1000)  # 100 · (2 %/1 %)² / (1 + √(2/99)): the estimate's own error held back
    assert reasons == ["weight_var rel SE 2 % > 1 %: +251 replicas"]
    assert replicas_needed(8, 0.5, 0.01) == 32  # at most fourfold in one round
    assert replicas_needed(100, 0.0101, 0.01) == 110  # at least a tenth more
    r, t, reasons = needs({"escape_time": 500.0, "escape_time_se": 10.0, "escape_censored": 50,
                           "diverged_replicas": 0}, 200, 1000, 0,
                          {"escape_time": {"rel_se": 0.05, "censored_fraction": 0.01}})
    # a quarter censored: T' = T ln(100)/ln(4) · 1.1
    assert r == 200 and t == int(np.ceil(1000 * np.log(100) / np.log(4) * 1.1))
    assert reasons[0].startswith("escape_time censored 25 % > 1 %")
    # τ's SE is τ/√k: 5 % needs 400 escapes — at most fourfold a round, then exactly what is left
    escape = {"escape_time": {"rel_se": 0.05}}
    assert needs({"escape_time": 100.0, "escape_time_se": 12.5, "escape_censored": 0}, 64, 1000, 0, escape)[0] == 256
    assert needs({"escape_time": 100.0, "escape_time_se": 6.25, "escape_censored": 0}, 256, 1000, 0, escape)[0] == 400
    assert needs({"escape_time": 100.0, "escape_time_se": 6.25, "escape_censored": 56}, 256, 1000, 0,
                 escape)[0] == 512  # 200 of 256 escaped: 400 escapes need 512 replicas
    assert needs({"weight_var": None, "weight_var_se": None}, 8, 100, 0,
                 {"weight_var": {"rel_se": 0.01}}).startswith("weight_var has no standard error")


def test_precision_and_search_in_one_sweep_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="search"):
        build_sweep(config(tmp_path, search={"edge": "lr"}))


@pytest.mark.workflow
def test_sgdsweep_run_extends_over_rounds_and_resumes_after_kill_9(tmp_path):
    cfg = config(tmp_path)
    cfg["results_dir"] = "results"
    cfg["grid"]["batch_size"] = [2, 4]
    # three rounds: one point extended twice, so the killed run's resume still extends it
    cfg["precision"]["observables"]["weight_var"]["rel_se"] = 0.03
    cfg["precision"]["fits"] = {"power_law.a": 0.5}  # met at once, but only once the workflow has fitted
    path = write_yaml(tmp_path / "precise.yaml", cfg)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(path), "--cores", "2"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lanes = tmp_path / "results" / "precise" / "points" / "lanes"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # kill once a round has extended a point
        if lanes.is_dir() and any(n.endswith(".npz") and ".0-" not in n for n in os.listdir(lanes)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0].decode()  # still running: killed mid-way
    os.killpg(proc.pid, signal.SIGKILL)
    first = proc.communicate()[0].decode()
    before = {n: (lanes / n).read_bytes() for n in os.listdir(lanes) if n.endswith(".npz")}
    done = run_cli("run", str(path), "--cores", "2", "-v", cwd=tmp_path)  # -v: Snakemake's job lines too
    assert done.returncode == 0, done.stdout + done.stderr
    # the rounds build ensemble and fits; the report once, after the last round
    jobs = re.findall(r"localrule (\w+):", done.stdout + done.stderr)
    assert jobs.count("fit") >= 1 and jobs.count("report") == 1 and jobs[-2:] == ["report", "all"], jobs
    assert "extended (round 1: weight_var rel SE" in first + done.stderr  # `sgdsweep run` says why
    for name, data in before.items():  # stored replicas are never recomputed
        assert (lanes / name).read_bytes() == data
    assert any(n.endswith(".npz") and n not in before for n in os.listdir(lanes))  # the resumed run extended
    report = json.loads((tmp_path / "results" / "precise" / "plan" / "report.json").read_text())
    statuses = {p["status"] for p in report["rounds"]["points"].values()}
    assert statuses == {"met"}
    assert (tmp_path / "results" / "precise" / "report.html").exists()
    assert len(os.listdir(tmp_path / "results" / "precise" / "rounds" / "fits")) >= 1  # the fit job kept them
    again = run_cli("run", str(path), "--cores", "2", cwd=tmp_path)
    assert again.returncode == 0 and "0 to simulate" in again.stderr


def search_rounds(cfg: dict[str, Any], limit: int = 40):
    """Run an edge search's rounds in this process."""
    for _ in range(limit):
        sweep = build_sweep(cfg)
        done = point_store.complete_points(sweep.directory / "points", (p.hash for p in sweep.points))
        todo = [p for p in sweep.points if p.hash not in done]
        if not todo:
            return sweep
        simulate_points([p.spec() for p in todo], str(sweep.directory / "points"))
    raise AssertionError("the search did not end")


def test_lr_edge_search_on_linear_regression_brackets_the_exact_edge(tmp_path):
    """With Gaussian gradient noise the linearised dynamics is not random: the almost-sure edge is
    the second moment's (sgdsweep.theory.edge), and the bisection's final bracket holds it, and is
    narrower than the tolerance."""
    from sgdsweep.models import get_model
    from sgdsweep.models.edge import stability_edge

    cfg = config(tmp_path, dynamics={"steps": 2000, "replicas": 16, "burn_in": 0},
                 grid={"lr": [0.05, 3.0], "batch_size": 4, "samples_per_param": 10, "noise": "gaussian"},
                 search={"edge": "lr", "tolerance": 0.01})
    del cfg["precision"]
    sweep = search_rounds(cfg)
    (group,) = sweep.rounds["groups"]
    assert group["status"] == "found" and group["stable_side"] == "below"
    s, d = group["stable"], group["unstable"]
    assert group["bracket"] == [s, d] and 0 < d - s <= 0.01 * d
    model = get_model("linear")
    edge = stability_edge(model.make_problem(model.data_params(group["params"])), group["params"], "lr")["value"]
    assert s <= edge <= d
    assert group["rounds"] >= 5  # 3.0 was stable: the search looked beyond the grid, then bisected


def test_momentum_edge_search_on_the_quadratic_finds_liu_corollary_1(tmp_path):
    """At λk = 2.75 plain SGD diverges; momentum restores stability above μ = λk/2 − 1 = 0.375
    (Liu et al. 2021, Cor. 1): the search finds the edge from the stable side above it."""
    cfg = config(tmp_path, model={"kind": "quadratic", "curvatures": [1.0], "noise_cov": [1.0]},
                 dynamics={"steps": 3000, "replicas": 16, "burn_in": 0},
                 grid={"lr": 2.75, "batch_size": 1, "momentum": [0.1, 0.6], "noise": "gaussian"},
                 search={"edge": "momentum", "tolerance": 0.02})
    del cfg["precision"]
    sweep = search_rounds(cfg)
    (group,) = sweep.rounds["groups"]
    assert group["status"] == "found" and group["stable_side"] == "above"
    lo, hi = group["bracket"]
    assert hi - lo <= 0.02 * hi
    assert lo <= 2.75 / 2 - 1 <= hi


def test_an_edge_search_needs_two_values_of_its_axis(tmp_path):
    cfg = config(tmp_path, search={"edge": "lr"})
    del cfg["precision"]
    cfg["grid"]["lr"] = 0.2
    with pytest.raises(ConfigError, match=r"grid\.lr.*at least two values of lr"):
        build_sweep(cfg)


def fit_rounds(cfg: dict[str, Any], limit: int = 30):
    """Rounds with fit targets in this process: simulate, then aggregate and fit each settled round
    and keep its fits as the workflow's fit job does (``rounds/fits/<points digest>.json``)."""
    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.run.execute import make_batches
    from sgdsweep.store.aggregate import build_ensemble
    from sgdsweep.sweep.plan import PlanFiles, plan_texts

    for _ in range(limit):
        sweep = build_sweep(cfg)
        statuses = {v["status"] for v in sweep.rounds["points"].values()}
        todo = [p for p in sweep.points if sweep.rounds["points"][p.hash]["status"] == "pending"]
        for batch in make_batches([p.spec() for p in todo], 8):
            simulate_points(batch, str(sweep.directory / "points"))
        if todo:
            continue
        if "pending fit" not in statuses:
            return sweep
        files = PlanFiles(sweep.directory)
        fits = fit_ensemble(build_ensemble(json.loads(plan_texts(sweep)[files.sweep_spec])), sweep.config["fit"])
        fits["settings"]["spec_hash"] = content_hash(sweep.config["fit"])  # as `sgdsweep fit` records it
        files.fit_archive.mkdir(parents=True, exist_ok=True)
        (files.fit_archive / fit_archive_name(fits["settings"])).write_text(json.dumps(fits))
        files.fits.write_text(json.dumps({"settings": {}}))  # a later round's fits.json: not this round's
    raise AssertionError("the rounds did not end")


def test_a_fit_target_extends_every_point_until_the_interval_is_narrow_enough(tmp_path):
    from sgdsweep.sweep.precision import fit_half_widths

    grid = {"lr": [0.1, 0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10}
    cfg = config(tmp_path, grid=grid, fit={"bootstrap": 0},
                 precision={"observables": {"weight_var": {"rel_se": 0.05}}, "fits": {"power_law.a": 0.08}})
    sweep = fit_rounds(cfg)
    info = sweep.rounds["points"]
    assert {p["status"] for p in info.values()} == {"met"}
    reasons = [r for p in info.values() for h in p["history"] for r in h["reasons"]]
    assert any(r.startswith("power_law.a half-width ") and r.endswith("replicas") for r in reasons)
    made_from = {"points_digest": points_digest(p.hash for p in sweep.points),
                 "spec_hash": content_hash(sweep.config["fit"])}
    kept = sweep.directory / "rounds" / "fits" / fit_archive_name(made_from)
    assert fit_half_widths(json.loads(kept.read_text()), {"power_law.a": 0.08})["power_law.a"] <= 0.08


def test_a_fit_interval_that_does_not_narrow_with_replicas_stops_the_rounds(tmp_path):
    """The power law is not exact here: its interval soon stops falling as 1/√R, and the rounds
    stop saying so instead of spending the budget."""
    grid = {"lr": [0.1, 0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10}
    cfg = config(tmp_path, grid=grid, fit={"bootstrap": 0},
                 precision={"observables": {"weight_var": {"rel_se": 0.05}}, "fits": {"power_law.a": 0.005}})
    sweep = fit_rounds(cfg)
    (status,) = {p["status"] for p in sweep.rounds["points"].values()}
    assert status.startswith("stopped: power_law.a half-width ") and "set by the fit's model" in status
    assert max(p.params["replicas"] for p in sweep.points) < 1000


def test_a_lane_part_that_is_not_what_its_name_says_is_refused_naming_it(tmp_path):
    """Another point's part renamed into this point's key, or a part with fewer rows than its
    name says, would silently give wrong numbers: both are refused, naming the file."""
    from sgdsweep.errors import StoreError

    cfg = config(tmp_path)
    sweep = build_sweep(cfg)
    simulate_points([p.spec() for p in sweep.points], str(sweep.directory / "points"))
    a, b = sweep.points
    part_a = lanes_store.part_path(sweep.directory / "points", a.lanes, 0, 8)
    part_b = lanes_store.part_path(sweep.directory / "points", b.lanes, 0, 8)
    part_a.write_bytes(part_b.read_bytes())  # b's lanes under a's name
    with pytest.raises(StoreError, match=rf"{part_a.name}.*not what their name says.*Delete the file"):
        lanes_store.read_lanes(sweep.directory / "points", a.lanes, 16)
    part_a.unlink()
    with point_store.PointStore(part_b) as s:
        arrays = s.read_many(list(s.arrays))
    short = {k: (("replica", *(f"{k}_{i}" for i in range(1, v.ndim))), v[:4]) for k, v in arrays.items()}
    point_store.write_point(part_a, short, {"lanes_key": a.lanes, "start": 0, "stop": 8})  # 4 rows named 0-8
    with pytest.raises(StoreError, match="not 8 rows"):
        lanes_store.read_lanes(sweep.directory / "points", a.lanes, 16)


def test_large_lanes_are_written_in_parts_that_each_stay_readable(tmp_path, monkeypatch):
    monkeypatch.setattr(lanes_store, "PART_BYTES", 200)  # 5 rows of 40 bytes
    lanes = {"n": np.arange(10, dtype=np.int64), "sum_d": np.arange(40.0).reshape(10, 4)}
    paths = lanes_store.write_part(tmp_path, "0123456789abcdef", 5, lanes)
    assert [p.name for p in paths][:2] == ["0123456789abcdef.5-10.npz", "0123456789abcdef.10-15.npz"]
    back, n = lanes_store.read_lanes(tmp_path, "0123456789abcdef", 15)
    assert n == 0 and back == {}  # replicas 0 … 4 are not stored: nothing from 0 on
    paths = lanes_store.write_part(tmp_path, "0123456789abcdef", 0, {k: v[:5] for k, v in lanes.items()})
    back, n = lanes_store.read_lanes(tmp_path, "0123456789abcdef", 15)
    assert n == 15
    np.testing.assert_array_equal(back["sum_d"], np.concatenate([lanes["sum_d"][:5], lanes["sum_d"]]))


def test_fits_of_other_fit_settings_are_not_reused(tmp_path):
    grid = {"lr": [0.1, 0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10}
    cfg = config(tmp_path, grid=grid, fit={"bootstrap": 0, "confidence": 0.5},
                 precision={"observables": {"weight_var": {"rel_se": 0.05}}, "fits": {"power_law.a": 0.08}})
    fit_rounds(cfg)
    cfg["fit"]["confidence"] = 0.99
    sweep = build_sweep(cfg)  # the rounds replay: the first fit decision waits for a fit at 0.99
    assert {p["status"] for p in sweep.rounds["points"].values()} == {"pending fit"}
    assert all(p["rounds"] == 0 for p in sweep.rounds["points"].values())


def test_a_fit_target_stops_at_max_rounds_and_a_fit_not_made_stops_the_points(tmp_path):
    grid = {"lr": [0.1, 0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10}
    cfg = config(tmp_path, grid=grid, fit={"bootstrap": 0},
                 precision={"observables": {"weight_var": {"rel_se": 0.05}}, "fits": {"power_law.a": 0.001},
                            "budget": {"max_rounds": 1}})
    sweep = fit_rounds(cfg)
    assert {p["status"] for p in sweep.rounds["points"].values()} == {"budget: max_rounds = 1"}
    assert max(p["rounds"] for p in sweep.rounds["points"].values()) <= 1
    cfg = config(tmp_path / "b", grid={**grid, "batch_size": 2, "lr": 0.2}, fit={"bootstrap": 0},
                 precision={"observables": {"weight_var": {"rel_se": 0.05}}, "fits": {"power_law.a": 0.01}})
    sweep = fit_rounds(cfg)  # one point: no power law to fit
    (status,) = {p["status"] for p in sweep.rounds["points"].values()}
    assert status.startswith("stopped: no interval of power_law.a (")


def test_a_search_whose_every_value_diverges_looks_below_the_smallest(tmp_path):
    cfg = config(tmp_path, dynamics={"steps": 500, "replicas": 4, "burn_in": 0},
                 grid={"lr": [20.0, 40.0, 80.0], "batch_size": 4, "samples_per_param": 10, "noise": "gaussian"},
                 search={"edge": "lr", "tolerance": 0.05})
    del cfg["precision"]
    sweep = search_rounds(cfg)
    (group,) = sweep.rounds["groups"]
    assert group["status"] == "found" and group["unstable"] < 20.0
    assert min(r["value"] for r in group["evaluated"]) < 20.0


def test_a_later_round_beyond_max_memory_names_the_budget(tmp_path):
    from sgdsweep.sweep.cost import check_memory, estimate_memory, tasks

    cfg = config(tmp_path, precision={"observables": {"weight_var": {"rel_se": 0.005}}})
    first = build_sweep(cfg)
    simulate_points([p.spec() for p in first.points], str(first.directory / "points"))
    later = build_sweep(cfg)
    assert later.rounds["round"] == 1
    sizes = [estimate_memory(s, tasks(s, [p.hash for p in s.points])).total for s in (first, later)]
    cfg["execution"] = {**cfg["execution"], "max_memory": (sizes[0] + sizes[1]) // 2}  # round 0 fits, 1 not
    sweep = build_sweep(cfg)
    with pytest.raises(ConfigError, match=r"precision\.budget\.max_replicas.*Round 1 extends points to \d+ replicas"):
        check_memory(sweep, [p.hash for p in sweep.points])


def test_a_precision_sweep_exported_and_imported_replays_its_rounds_without_simulating(tmp_path):
    """The export holds every round's points, so the imported config reaches the same last round
    from the stores it brings, and simulates nothing; merging such exports is refused."""
    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.core.paths import atomic_write_text
    from sgdsweep.share.archive import ShareError, export_sweep, import_sweep, merge_exports
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble
    from sgdsweep.sweep.plan import write_plan

    finished = run_rounds(config(tmp_path / "here"))
    assert any(p["rounds"] for p in finished.rounds["points"].values())
    files = write_plan(finished)
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    atomic_write_text(files.fits, json.dumps(fit_ensemble(ds, finished.config["fit"])))
    dest = tmp_path / "precise.zip"
    manifest = export_sweep(files.root, str(dest))
    assert len(manifest["points"]) > len(finished.points)  # the earlier rounds' stores travel too
    target = import_sweep(dest, tmp_path / "there")
    imported = build_sweep(yaml.safe_load((target / "config.yaml").read_text()))
    assert {p.hash for p in imported.points} == {p.hash for p in finished.points}
    assert {p["status"] for p in imported.rounds["points"].values()} == {"met"}
    with pytest.raises(ShareError, match="a sweep with precision"):
        merge_exports([str(dest), str(dest)], str(tmp_path / "merged.zip"))
