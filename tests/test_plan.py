"""`sgdsweep plan` and the dry run say which points would run and why; reruns count right."""

from __future__ import annotations

import json
from pathlib import Path

from sgdsweep.config import build_sweep
from sgdsweep.plan import PlanFiles, explain, failed_marker

from conftest import make_finished_sweep, run_cli, run_snakemake, tiny_config, write_yaml


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
    (points_dir / f"{a}.zarr.zip").write_bytes(b"PK\x03\x04{")
    (points_dir / f"{b}.zarr.zip").unlink()
    failed_marker(points_dir, b).write_text(json.dumps({"error": "MemoryError: out of memory"}))
    reasons = explain(sweep)
    assert reasons == {a: "corrupt (incomplete or unreadable store)",
                       b: "previously failed (MemoryError: out of memory)"}


def test_plan_command_and_dry_run_print_reasons(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    proc = run_cli("plan", str(cfg), cwd=tmp_path)
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
    assert run_snakemake(tmp_path, cfg_path).returncode == 0
    points = tmp_path / "results" / "tiny" / "points"
    before = {p.name for p in points.glob("*.zarr.zip")}
    assert len(before) == 8
    cfg["grid"]["label_noise"] = [0.1, 0.6]
    write_yaml(cfg_path, cfg)
    plan = run_cli("plan", str(cfg_path), cwd=tmp_path)
    assert "8 points, 4 stored, 4 to simulate (4 changed)" in plan.stdout, plan.stdout
    assert plan.stdout.count("changed: label_noise 0.5 → 0.6") == 4
    summary = run_cli("plan", str(cfg_path), "--summary", cwd=tmp_path)
    assert summary.stdout.strip().count("\n") == 0
    proc = run_snakemake(tmp_path, cfg_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = {p.name for p in points.glob("*.zarr.zip")} - before
    assert len(new) == 4  # only the label_noise = 0.6 points; the 0.1 shard did not run
    assert (proc.stdout + proc.stderr).count("localrule simulate:") == 1
