"""Crafted inputs on real processes and real files: sizes beyond what a float holds, odd
environment variables, planted files and links at written paths. Each refused with exit status 2
and a message naming what was given, or kept from doing harm (docs/bad-inputs.md,
docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli, tiny_config, write_yaml


def _config(tmp_path: Path, **sections) -> Path:
    cfg = tiny_config(results_dir=str(tmp_path / "results"), **sections)
    return write_yaml(tmp_path / "config.yaml", cfg)


@pytest.mark.parametrize(("sections", "key"), [
    ({"precision": {"observables": {"weight_var": {"rel_se": 0.05}}, "budget": {"disk": "1e400GB"}}},
     "precision.budget.disk"),
    ({"execution": {"cluster": "slurm", "slurm": {"memory": "9" * 400 + "G"}}}, "execution.slurm.memory"),
])
def test_a_size_beyond_a_float_is_refused_naming_its_key(tmp_path, sections, key):
    proc = run_cli("validate", str(_config(tmp_path, **sections)), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"config key '{key}'" in proc.stderr


@pytest.mark.parametrize("threads", ["abc", "0"])
def test_a_bad_threads_variable_is_refused_before_any_job_or_cluster(tmp_path, threads):
    cfg = _config(tmp_path)
    proc = run_cli("run", str(cfg), "--cores", "1", cwd=tmp_path, env={"SGDSWEEP_THREADS": threads}, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"SGDSWEEP_THREADS={threads!r}" in proc.stderr and "positive integer" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results" / "tiny" / ".cluster").exists()  # no cluster was started for it


def test_an_import_racing_another_to_the_same_place_is_refused_and_keeps_the_first(tmp_path, monkeypatch):
    """Two imports of one export into one results directory: the one that finishes second finds
    the sweep's directory placed by the other after its own check, and is refused (exit status
    2, naming it), leaving the first's sweep whole and no staging directory behind."""
    from conftest import make_finished_sweep

    from sgdsweep.errors import UsageError
    from sgdsweep.store import share

    export = tmp_path / "tiny.zip"
    share.export_sweep(make_finished_sweep(tmp_path / "made"), str(export))
    results = tmp_path / "results"
    extract = share._extract

    def racing(zf, manifest, staging, src):  # the other import lands while this one extracts
        monkeypatch.setattr(share, "_extract", extract)
        share.import_sweep(export, results)
        extract(zf, manifest, staging, src)

    monkeypatch.setattr(share, "_extract", racing)
    with pytest.raises(UsageError, match=r"tiny appeared while this import ran.*never overwrites") as info:
        share.import_sweep(export, results)
    assert info.value.exit_code == 2
    assert sorted(p.name for p in results.iterdir()) == ["tiny"]  # no .import-* staging left
    assert (results / "tiny" / "config.yaml").is_file() and (results / "tiny" / "fits.json").is_file()


def test_a_linked_cluster_directory_is_replaced_not_written_through(tmp_path):
    """``<sweep>/.cluster`` planted as a link to another directory (another sweep's cluster
    directory, say): starting the run's cluster removes the link and writes its files in a new
    directory; the other directory's scheduler file, status record and log stay as they were."""
    from sgdsweep.run.cluster import start_run_cluster, stop_run_cluster

    victim = tmp_path / "other"
    victim.mkdir()
    for name in ("scheduler.json", "status.json", "daemon.log"):
        (victim / name).write_text("another run's\n")
    cluster_dir = tmp_path / "sweep" / ".cluster"
    cluster_dir.parent.mkdir()
    cluster_dir.symlink_to(victim, target_is_directory=True)
    proc = start_run_cluster(cluster_dir, 1)
    try:
        assert cluster_dir.is_dir() and not cluster_dir.is_symlink()
        assert (cluster_dir / "status.json").is_file()
    finally:
        stop_run_cluster(proc, cluster_dir)
    assert {p.name: p.read_text() for p in victim.iterdir()} == dict.fromkeys(
        ("scheduler.json", "status.json", "daemon.log"), "another run's\n")


def test_a_value_of_megabytes_is_named_in_a_short_message(tmp_path):
    """A 5 MB string where a noise type belongs: refused (exit 2) naming its key, what is allowed
    and its length, in a message of a few hundred characters, not megabytes."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    cfg["grid"]["noise"] = ["B" * 5_000_000]
    proc = run_cli("validate", str(write_yaml(tmp_path / "config.yaml", cfg)), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "config key 'grid.noise[0]'" in proc.stderr and "'minibatch'" in proc.stderr
    assert "(a value of 5000002 characters)" in proc.stderr
    assert len(proc.stderr) < 2000
