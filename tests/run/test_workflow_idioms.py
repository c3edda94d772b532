"""The workflow's rules follow Snakemake's idioms: a shard job declares the cores it takes
(``threads``) and its own Dask cluster takes no more; every rule path comes from PlanFiles; the
default sweep is read only when the command line names none."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, run_snakemake, tiny_config, write_yaml

from sgdsweep.run import cli


def _shard_threads(workdir: Path, workers: int, *extra: str, env: dict[str, str] | None = None) -> set[str]:
    """The ``--threads`` of every shard job of a dry run of the tiny sweep with ``workers``."""
    cfg = tiny_config()
    cfg["execution"]["workers"] = workers
    proc = run_snakemake(workdir, write_yaml(workdir / f"w{workers}.yaml", cfg), "-n", "-p", *extra, env=env,
                         cluster="own")  # a job's own cluster, unless env names the run's
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    found = re.findall(r"simulate-shard .* --threads (\d+) ", text)
    assert found, text[-3000:]
    assert not (workdir / "results").exists()  # a dry run writes nothing
    return set(found)


def test_a_shard_job_declares_the_cores_of_its_cluster(tmp_path):
    """Plain `snakemake --cores 2`: a shard job takes execution.workers cores, lowered to
    --cores, so N shards never start N clusters of every core; under a run's shared cluster
    (the scheduler file `sgdsweep run` names) a job takes one core."""
    assert _shard_threads(tmp_path, 3) == {"2"}
    assert _shard_threads(tmp_path, 1) == {"1"}
    assert _shard_threads(tmp_path, 3, env={"SGDSWEEP_SCHEDULER_FILE": str(tmp_path / "scheduler.json")}) == {"1"}


def test_the_shard_jobs_cluster_has_at_most_its_threads(tmp_path, monkeypatch):
    """`simulate-shard --threads N` caps the workers of the cluster the job starts at N
    (execution.workers or auto); a bad N is a usage error naming the option."""
    from sgdsweep.run import execute

    seen = []
    monkeypatch.setattr(execute, "run_shard", lambda spec, receipt, execution: seen.append(execution))
    execution = tmp_path / "execution.json"
    for workers, threads, expect in ((3, "2", 2), (1, "4", 1), ("auto", "1", 1)):
        execution.write_text(json.dumps({"workers": workers, "points_per_task": 2}))
        args = ["simulate-shard", str(tmp_path / "spec.json"), "--receipt", str(tmp_path / "r.json"),
                "--execution", str(execution), "--threads", threads]
        assert cli.main(args) == 0
        assert seen.pop()["workers"] == expect
    execution.write_text(json.dumps({"workers": 3}))
    assert cli.main(["simulate-shard", "s.json", "--receipt", "r.json", "--execution", str(execution)]) == 0
    assert seen.pop()["workers"] == 3  # without --threads: the settings as they are
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate-shard", "s.json", "--receipt", "r.json", "--execution", str(execution), "--threads", "0"])
    assert exc.value.code == 2


def test_the_default_sweep_is_read_only_without_a_config_on_the_command_line(tmp_path):
    """Plain `snakemake` runs config/config.yaml (of its working directory); `--configfile X`
    runs X alone: a key X leaves out takes the schema's default, not the default sweep's value,
    so a sweep without grid.batch_size is refused although config/config.yaml sets it."""
    (tmp_path / "config").mkdir()
    write_yaml(tmp_path / "config" / "config.yaml", tiny_config(sweep="from_default"))
    proc = run_snakemake(tmp_path, None, "-n", cluster="own")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "results/from_default/" in text
    partial = tiny_config(sweep="given")
    del partial["grid"]["batch_size"]
    proc = run_snakemake(tmp_path, write_yaml(tmp_path / "given.yaml", partial), "-n", cluster="own")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config key 'grid.batch_size': got None" in text, text[-3000:]
    assert not (tmp_path / "results").exists()


def test_rule_paths_come_from_planfiles():
    """No rule spells a path under the sweep's directory itself: PlanFiles names them all."""
    rules = sorted((REPO / "workflow" / "rules").glob("*.smk")) + [REPO / "Snakefile"]
    spelt = [f"{p.name}:{i}" for p in rules for i, line in enumerate(p.read_text().splitlines(), 1)
             if "PLAN.root" in line or re.search(r"/\s*[\"']", line)]  # no `path / "name"` joins
    assert spelt == []


def test_the_workflow_is_formatted():
    """`snakefmt --check` (as .ci/run runs it) finds nothing to change in the Snakefile and rules."""
    import subprocess
    import sys

    proc = subprocess.run([str(Path(sys.executable).with_name("snakefmt")), "--check", "Snakefile", "workflow/"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
