"""`sgdsweep plan` and the dry run say which points would run and why; reruns count right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli, make_finished_sweep, run_snakemake, tiny_config, write_yaml

from sgdsweep.store.points import failed_marker
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.explain import explain
from sgdsweep.sweep.plan import PlanFiles


def _reasons(root: Path, **sections) -> dict[str, str]:
    cfg = tiny_config(results_dir=str(root / "results"), dynamics={"steps": 1500, "replicas": 4}, **sections)
    return explain(build_sweep(cfg))


def test_reasons_new_changed_failed_corrupt(tmp_path):
    sweep_dir = make_finished_sweep(tmp_path)
    assert _reasons(tmp_path) == {}
    # a new lr value: two new points
    reasons = _reasons(tmp_path, grid={"lr": [0.2, 0.4, 0.3]})
    assert sorted(reasons.values()) == ["new", "new"]
    # a changed non-axis parameter: every point "changed", naming the parameter
    reasons = _reasons(tmp_path, model={"label_noise": 0.7})
    assert len(reasons) == 4 and all(r == "changed: label_noise 0.5 → 0.7" for r in reasons.values())
    # a corrupt store and a previously failed point
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1500, "replicas": 4}))
    points_dir = PlanFiles(sweep_dir).points_dir
    a, b = sweep.points[0].hash, sweep.points[1].hash
    (points_dir / f"{a}.npz").write_bytes(b"PK\x03\x04{")
    (points_dir / f"{b}.npz").unlink()
    failed_marker(points_dir, b).write_text(json.dumps({"error": "MemoryError: out of memory"}))
    reasons = explain(sweep)
    assert reasons == {a: "corrupt (incomplete or unreadable store)",
                       b: "previously failed (MemoryError: out of memory)"}


def test_plan_command_and_dry_run_print_reasons(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    proc = cli("plan", str(cfg), cwd=tmp_path)
    assert proc.returncode == 0
    assert "4 points, 0 stored, 4 to simulate (4 new)" in proc.stdout
    assert proc.stdout.count(": new") == 4 and "lr=0.2, batch_size=2" in proc.stdout
    dry = run_snakemake(tmp_path, cfg, "--dry-run")
    assert dry.returncode == 0 and "4 to simulate (4 new)" in dry.stdout + dry.stderr
    assert not list((tmp_path / "results" / "tiny").glob("points/*.zarr*"))  # a dry run simulates nothing


def test_changing_a_model_parameter_reruns_only_affected_points(tmp_path):
    cfg_path = tmp_path / "t.yaml"
    cfg = tiny_config(grid={"label_noise": [0.1, 0.5]})
    del cfg["model"]["label_noise"]
    write_yaml(cfg_path, cfg)
    assert run_snakemake(tmp_path, cfg_path, targets=("ensemble",)).returncode == 0
    points = tmp_path / "results" / "tiny" / "points"
    before = {p.name for p in points.glob("*.npz")}
    assert len(before) == 8
    cfg["grid"]["label_noise"] = [0.1, 0.6]
    write_yaml(cfg_path, cfg)
    plan = cli("plan", str(cfg_path), cwd=tmp_path)
    assert "8 points, 4 stored, 4 to simulate (4 changed)" in plan.stdout, plan.stdout
    assert plan.stdout.count("changed: label_noise 0.5 → 0.6") == 4
    summary = cli("plan", str(cfg_path), "--summary", cwd=tmp_path)
    assert summary.stdout.strip().count("\n") == 0
    proc = run_snakemake(tmp_path, cfg_path, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = {p.name for p in points.glob("*.npz")} - before
    assert len(new) == 4  # only the label_noise = 0.6 points; the 0.1 shard did not run
    assert (proc.stdout + proc.stderr).count("localrule simulate:") == 1


MEASURED_CASES = {  # (config, replicas): the full covariance, the diagonal and sketch, a 1-parameter model
    "linear_d30": ({"model": {"kind": "linear", "n_inputs": 30}, "grid": {"lr": 0.1, "batch_size": 4,
                                                                         "samples_per_param": 4}}, 1024),
    "linear_d100": ({"model": {"kind": "linear", "n_inputs": 100}, "grid": {"lr": 0.1, "batch_size": 4,
                                                                           "samples_per_param": 4}}, 512),
    "quadratic": ({"model": {"kind": "quadratic"}, "grid": {"lr": 0.1, "batch_size": 4, "noise": "gaussian"}}, 2048),
}


@pytest.mark.parametrize("case", sorted(MEASURED_CASES))
def test_memory_estimate_is_within_a_factor_2_of_the_measured_peak(tmp_path, case):
    """The estimate of one task (sgdsweep.sweep.cost) against the peak that tracemalloc measures while
    simulate_points runs that task (after a warm-up that compiles and imports): 10–60 MB here."""
    import tracemalloc

    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.sweep.cost import tasks

    cfg, replicas = MEASURED_CASES[case]
    sweep = build_sweep({"sweep": "m", **cfg, "dynamics": {"steps": 200, "replicas": replicas, "burn_in": 50}})
    (task,) = tasks(sweep)
    warm = build_sweep({"sweep": "m", **cfg, "dynamics": {"steps": 60, "replicas": 2, "burn_in": 10}})
    simulate_points([p.spec() for p in warm.points], str(tmp_path / "warm"))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        simulate_points([p.spec() for p in sweep.points], str(tmp_path / "points"))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert 0.5 <= peak / task.memory <= 2.0, (case, peak, task.memory)


def test_plan_prints_the_estimated_cost(tmp_path):
    """Replica-steps, memory per task and at once against the limit, and a time at a kernel rate
    (the cost model's or one cached for this machine, labelled as such; not checked against a
    clock). --summary stays one line."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(execution={"workers": 2, "points_per_task": 2,
                                                                 "max_memory": "4GiB"}))
    out = cli("plan", str(cfg), cwd=tmp_path).stdout
    # 4 points × 8 replicas × 3000 steps, as 2 tasks (one per batch size) of 2 points
    assert "cost (estimates): 2 task(s) of up to 2 points, 9.6e4 replica-steps" in out, out
    assert "for the largest task (2 point(s), 16 replicas)" in out
    assert "with 2 task(s) at once (2 local worker(s))" in out and "limit 4 GiB (execution.max_memory)" in out
    assert "time: about" in out and ("replica-steps/s per worker: the cost model's rate" in out
                                      or "replica-steps/s per worker: measured on this machine" in out)


def test_time_and_memory_follow_the_work(tmp_path):
    """The estimates scale as the work does: twice the replicas, twice the replica-steps and
    (beyond the fixed part) twice the memory per task; only the points to simulate count."""
    from sgdsweep.sweep.cost import tasks

    base = tiny_config(results_dir=str(tmp_path / "results"))
    small = tasks(build_sweep(base))
    double = tasks(build_sweep(tiny_config(results_dir=str(tmp_path / "results"),
                                           dynamics={"steps": 3000, "replicas": 16})))
    assert [t.replica_steps for t in double] == [2 * t.replica_steps for t in small] == [2 * 48000] * 2
    sweep = build_sweep(base)
    fp = sweep.footprints[small[0].data_set]
    assert [t.memory for t in double] == [t.memory + 16 * fp.per_lane for t in small]
    assert [t.points for t in tasks(sweep, [sweep.points[0].hash])] == [1]
