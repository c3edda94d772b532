"""Crafted inputs on real processes and real files: sizes beyond what a float holds, odd
environment variables, planted files and links at written paths. Each refused with exit status 2
and a message naming what was given, or kept from doing harm (docs/bad-inputs.md,
docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli, run_snakemake, tiny_config, write_yaml


def _config(tmp_path: Path, **sections) -> Path:
    cfg = tiny_config(results_dir=str(tmp_path / "results"), **sections)
    return write_yaml(tmp_path / "config.yaml", cfg)


@pytest.mark.parametrize(("sections", "key"), [
    ({"precision": {"observables": {"weight_var": {"rel_se": 0.05}}, "budget": {"disk": "1e400GB"}}},
     "precision.budget.disk"),
    ({"execution": {"cluster": "slurm", "slurm": {"memory": "9" * 400 + "G"}}}, "execution.slurm.memory"),
])
def test_a_size_beyond_a_float_is_refused_naming_its_key(tmp_path, sections, key):
    proc = cli("validate", str(_config(tmp_path, **sections)), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"config key '{key}'" in proc.stderr


@pytest.mark.parametrize("threads", ["abc", "0"])
def test_a_bad_threads_variable_is_refused_before_any_job_or_cluster(tmp_path, threads):
    cfg = _config(tmp_path)
    proc = cli("run", str(cfg), "--cores", "1", cwd=tmp_path, env={"SGDSWEEP_THREADS": threads})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"SGDSWEEP_THREADS={threads!r}" in proc.stderr and "positive integer" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results" / "tiny" / ".cluster").exists()  # no cluster was started for it


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """An export of a finished tiny sweep."""
    from conftest import make_finished_sweep

    from sgdsweep.share.archive import export_sweep

    root = tmp_path_factory.mktemp("adversary")
    dest = root / "tiny.zip"
    export_sweep(make_finished_sweep(root), str(dest))
    return dest


def test_an_import_racing_another_to_the_same_place_is_refused_and_keeps_the_first(tmp_path, monkeypatch, export):
    """Two imports of one export into one results directory: the one that finishes second finds
    the sweep's directory placed by the other after its own check, and is refused (exit status
    2, naming it), leaving the first's sweep whole and no staging directory behind."""
    from sgdsweep.errors import UsageError
    from sgdsweep.share import archive as share

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
        assert (cluster_dir / "daemon.log").is_file()
    finally:
        stop_run_cluster(proc, cluster_dir)
    assert {p.name: p.read_text() for p in victim.iterdir()} == dict.fromkeys(
        ("scheduler.json", "status.json", "daemon.log"), "another run's\n")


def test_a_long_value_is_named_in_a_short_message(tmp_path):
    """A string of 50,000 characters where a noise type belongs: refused (exit 2) naming its key,
    what is allowed and its length, in a message of a few hundred characters."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    cfg["grid"]["noise"] = ["B" * 50_000]
    proc = cli("validate", str(write_yaml(tmp_path / "config.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 2
    assert "config key 'grid.noise[0]'" in proc.stderr and "'minibatch'" in proc.stderr
    assert "(a value of 50002 characters)" in proc.stderr
    assert len(proc.stderr) < 2000


def _recrafted(src: Path, dest: Path, change_config) -> Path:
    """``src`` rewritten as a forger would: its manifest's config changed by ``change_config``,
    the manifest's checksum in the zip comment made anew (it proves integrity, not origin)."""
    import json
    import zipfile

    from sgdsweep.share.archive import _write_zip
    from sgdsweep.share.verify import MANIFEST

    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read(MANIFEST))
        members = {n: zf.read(n) for n in zf.namelist() if n not in (MANIFEST, "README.txt")}
    change_config(manifest["config"])
    _write_zip(dest, members.items(), {k: v for k, v in manifest.items() if k not in ("schema_version", "members")})
    return dest


def test_an_export_whose_config_holds_a_string_of_megabytes_is_refused(tmp_path, export):
    """A forged export whose config is valid but for a report title of 20 MB: its import would
    write a config.yaml that no run reads (a config file holds at most 8 MiB) and a title of 20 MB
    into every report. verify and import refuse it (exit 2) naming the key; nothing is written.
    A config file with such a title is refused the same way."""
    forged = _recrafted(export, tmp_path / "forged.zip", lambda c: c["report"].update(title="T" * 20_000_000))
    for verb in (["verify"], ["import", "--results-dir", str(tmp_path / "results")]):
        proc = cli(*verb, str(forged), cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "report.title" in proc.stderr and "a string of 20000000 characters" in proc.stderr
        assert len(proc.stderr) < 3000
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    cfg = tiny_config(results_dir=str(tmp_path / "results"), report={"title": "T" * 200_000})
    proc = cli("validate", str(write_yaml(tmp_path / "config.yaml", cfg)), cwd=tmp_path)
    assert proc.returncode == 2 and "config key 'report.title': got 'a string of 200000 characters'" in proc.stderr


@pytest.mark.workflow
def test_a_results_dir_with_shell_syntax_runs_as_a_plain_path_and_runs_nothing(tmp_path):
    """A ``results_dir`` holding a space, a quote and a command substitution is a directory name
    to every job (the workflow quotes every path in its shell commands): the sweep runs there,
    end to end, and the command in its name never runs."""
    results = tmp_path / "r $(touch PWNED) it's"
    cfg = write_yaml(tmp_path / "config.yaml", tiny_config(results_dir=str(results)))
    proc = run_snakemake(tmp_path, cfg)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()
    sweep = results / "tiny"
    assert (sweep / "ensemble.zarr").is_dir() and (sweep / "fits.json").is_file() and (sweep / "report.html").is_file()
