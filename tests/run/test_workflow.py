"""The real workflow: snakemake → shard jobs → Dask workers → Zarr → ensemble → fit → report.

Runs the real ``snakemake`` in a temporary directory on a tiny sweep, then re-runs it to check
that reruns are incremental (nothing / only new points / only the fit).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import SHARED_CLUSTER, cluster_daemons, run_cli, run_snakemake, tiny_config, write_yaml

pytestmark = pytest.mark.workflow


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs: list[str] = []
        self.tags: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for key in ("src", "href"):
            if key in a and a[key] and not a[key].startswith(("data:", "#")):
                self.external.append(a[key])


def _stores(sweep_dir: Path) -> set[str]:
    return {p.name[: -len(".npz")] for p in (sweep_dir / "points").glob("*.npz")}


def _simulated(sweep_dir: Path) -> list[str]:
    out = []
    for receipt in (sweep_dir / "shards").glob("*.json"):
        out += json.loads(receipt.read_text())["simulated"]
    return out


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    cfg = write_yaml(work / "tiny.yaml", tiny_config())
    t0 = time.perf_counter()
    proc = run_snakemake(work, cfg, cluster="own")  # plain snakemake as a user runs it: a cluster per job
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work, cfg, proc, time.perf_counter() - t0


def test_first_run_produces_ensemble_fit_and_report(first_run):
    work, _, proc, _ = first_run
    sweep = work / "results" / "tiny"
    ds = xr.open_zarr(sweep / "ensemble.zarr")
    assert ds.sizes["point"] == 4 and ds.sizes["replica"] == 8
    assert sorted(set(ds["lr"].values)) == [0.2, 0.4] and sorted(set(ds["batch_size"].values)) == [2, 4]
    z = (ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]
    assert np.all(np.abs(z.values) < 5), z.values  # 8 replicas only: statistics are tested elsewhere
    assert not ds["diverged"].values.any()
    assert json.loads(ds.attrs["config"])["seed"] == 3
    (fits,) = json.loads((sweep / "fits.json").read_text())["power_law"]
    assert fits["params"]["a"]["interval"][0] < fits["params"]["a"]["estimate"] < fits["params"]["a"]["interval"][1]
    parser = _Html()
    text = (sweep / "report.html").read_text()
    parser.feed(text)
    assert {"html", "table", "img"} <= set(parser.tags)
    assert len(parser.imgs) >= 2 and all(src.startswith("data:image/png;base64,") for src in parser.imgs)
    assert parser.external == []  # self-contained
    assert "exact theory" in text and "Provenance" in text
    # one job per shard, never one per point
    assert len(re.findall(r"localrule simulate:", proc.stdout + proc.stderr)) == 1
    log = (sweep / "logs" / "simulate").glob("*.log").__next__().read_text()
    assert "4 to simulate" in log and "replica-steps/s" in log and "left" in log
    assert (proc.stdout + proc.stderr).count("Dask dashboard: http://127.0.0.1:") == 1
    # plain snakemake: the shard job ran a cluster of its own, gone with the job
    assert "this job's cluster" in log
    assert not (sweep / ".cluster").exists()
    assert cluster_daemons(work) == 0


def test_snakemake_report_holds_the_report_figures_and_fits(first_run):
    """`snakemake --report` (Snakemake's own report) carries our report, every figure and fits.json."""
    import zipfile

    work, cfg, _, _ = first_run
    sweep = work / "results" / "tiny"
    figures = sorted(p.name for p in (sweep / "figures").glob("*.png"))
    assert "weight_var.png" in figures and "power_law_0.png" in figures  # no coverage map: a full grid, all done
    # every figure file is embedded in report.html
    assert len(figures) == (sweep / "report.html").read_text().count("<img ")
    proc = run_snakemake(work, cfg, "--report", str(work / "snakemake-report.zip"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = zipfile.ZipFile(work / "snakemake-report.zip").namelist()
    for wanted in ["report.html", "fits.json"] + figures:
        assert any(n.endswith("/" + wanted) for n in names), (wanted, names)


def test_reruns_are_incremental(first_run):
    work, cfg_path, _, _ = first_run
    sweep = work / "results" / "tiny"
    before = _stores(sweep)
    ensemble_mtime = (sweep / "ensemble.zarr" / "zarr.json").stat().st_mtime

    # unchanged config: nothing to do (its time is benchmarked: benchmarks/scale.py, no-op)
    proc = run_snakemake(work, cfg_path)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr

    # key order and float spelling: still nothing
    def reverse_keys(node):
        return {k: reverse_keys(node[k]) for k in reversed(list(node))} if isinstance(node, dict) else node

    reordered = work / "reordered.yaml"
    write_yaml(reordered, reverse_keys(tiny_config()))
    text = reordered.read_text()
    assert "- 0.2\n" in text
    reordered.write_text(text.replace("- 0.2\n", "- 2.0e-1\n").replace("- 0.4\n", "- 0.40\n"))
    proc = run_snakemake(work, reordered)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-2000:]

    # add one lr value: only the two new points are simulated
    cfg = tiny_config(grid={"lr": [0.2, 0.4, 0.3]})
    write_yaml(cfg_path, cfg)
    proc = run_snakemake(work, cfg_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = _stores(sweep) - before
    assert len(new) == 2
    assert sorted(_simulated(sweep)) == sorted(new)
    assert "2 to simulate" in (sweep / "logs" / "simulate").glob("*.log").__next__().read_text()
    assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == 6

    # change only the fit: no simulation, the fit and report rerun
    receipts = {p: p.stat().st_mtime for p in (sweep / "shards").glob("*.json")}
    fits_mtime = (sweep / "fits.json").stat().st_mtime
    cfg["fit"] = {"confidence": 0.9}
    write_yaml(cfg_path, cfg)
    proc = run_snakemake(work, cfg_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "localrule simulate:" not in proc.stdout + proc.stderr
    assert "localrule aggregate:" not in proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime for p in (sweep / "shards").glob("*.json")} == receipts
    assert (sweep / "fits.json").stat().st_mtime > fits_mtime
    assert json.loads((sweep / "fits.json").read_text())["power_law"][0]["confidence"] == 0.9
    made = re.findall(r"fit: (\d+) group fit\(s\) made, (\d+) unchanged", (sweep / "logs" / "fit.log").read_text())
    assert made and int(made[-1][0]) > 0 and made[-1][1] == "0", made  # new settings: every group fitted
    assert (sweep / "ensemble.zarr" / "zarr.json").stat().st_mtime > ensemble_mtime  # from the lr step
    # the report draws the fits' figures anew and takes the ensemble's from the previous report's
    drawn = re.findall(r"report: (\d+) figure\(s\) drawn, (\d+) unchanged", (sweep / "logs" / "report.log").read_text())
    assert drawn and int(drawn[-1][0]) > 0 and int(drawn[-1][1]) > 0, drawn

    # change only the report: only the report reruns, and draws no figure
    cfg["report"] = {"title": "Another title"}
    write_yaml(cfg_path, cfg)
    proc = run_snakemake(work, cfg_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    jobs = re.findall(r"localrule (\w+):", text)
    assert sorted(jobs) == ["all", "plan_file", "report"], jobs  # the plan job writes the report's spec
    assert re.search(r"plan/by-content/report\.[0-9a-f]{16}\.json$",
                     re.findall(r"output: (\S+)", text.split("localrule plan_file:")[1])[0])
    assert "Another title" in (sweep / "report.html").read_text()
    drawn = re.findall(r"report: (\d+) figure\(s\) drawn, (\d+) unchanged", (sweep / "logs" / "report.log").read_text())
    assert drawn[-1][0] == "0" and int(drawn[-1][1]) > 0, drawn


def _tree(*roots: Path) -> dict[str, tuple[float, int]]:
    """Every file and directory under ``roots`` → (mtime, size)."""
    out = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            st = path.lstat()
            out[str(path)] = (st.st_mtime_ns, st.st_size)
    return out


def _snakemake_state(work: Path) -> dict[str, tuple[float, int]]:
    """The files of ``.snakemake`` that say what ran and what is running (metadata, locks,
    incomplete markers, backups), leaving out the two that Snakemake itself writes on every
    invocation of any workflow: its log and its I/O cache."""
    return {path: stat for path, stat in _tree(work / ".snakemake").items()
            if Path(path).is_file() and Path(path).relative_to(work / ".snakemake").parts[0] not in ("log", "iocache")}


@pytest.mark.parametrize("flags", [("-n",), ("--lint",), ("--summary",)], ids=lambda f: f[0])
def test_parsing_the_workflow_writes_nothing(first_run, tmp_path, flags):
    """`snakemake -n`, `--lint` and `--summary` on a sweep with stored results change nothing in
    the results directory (not even a plan file's mtime, although the config now adds points)
    nor in Snakemake's records of what ran; in a fresh directory they create no results, and
    `--lint` finds nothing to say about the workflow."""
    work, _, _, _ = first_run
    changed = write_yaml(tmp_path / "more.yaml", tiny_config(grid={"lr": [0.2, 0.4, 0.7]}))
    results, state = _tree(work / "results"), _snakemake_state(work)
    for cfg in (changed, work / "tiny.yaml"):
        proc = run_snakemake(work, cfg, *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _tree(work / "results") == results
    assert _snakemake_state(work) == state
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc = run_snakemake(fresh, changed, *flags)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert not (fresh / "results").exists() and not (tmp_path / "results").exists()
    assert _snakemake_state(fresh) == {}
    if flags == ("--lint",):
        assert "Congratulations, your workflow is in a good condition!" in text and "Lints for" not in text, text


def test_the_workflow_takes_the_stored_points_sgdsweep_run_hands_it(first_run, tmp_path, monkeypatch):
    """`sgdsweep run` checks the point stores under the sweep's lock and hands the set to its
    Snakemake (sgdsweep.sweep.stored), whose Snakefile then opens none of them again: told that a
    point has no store, a dry run plans its shard. A file for another sweep directory is ignored,
    and the stores, all complete, are opened: nothing to do."""
    from sgdsweep.sweep.config import load_sweep
    from sgdsweep.sweep.stored import hand_over

    work, cfg, _, _ = first_run
    monkeypatch.chdir(work)
    sweep = load_sweep(cfg)
    hashes = [p.hash for p in sweep.points]
    env: dict[str, str] = {}
    with tempfile.TemporaryFile() as handed:
        hand_over(env, handed, sweep.directory, hashes, hashes[1:])
        proc = run_snakemake(work, cfg, "-n", env=env, pass_fds=(handed.fileno(),))
        assert proc.returncode == 0 and re.search(r"^simulate\s+1$", proc.stdout, re.MULTILINE), proc.stdout[-2000:]
        hand_over(env, handed, tmp_path, hashes, hashes[1:])
        proc = run_snakemake(work, cfg, "-n", env=env, pass_fds=(handed.fileno(),))
        assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_every_entry_point_sees_every_change_the_other_made(tmp_path):
    """`sgdsweep run` and plain `snakemake`, in one working directory or two, each see what the
    other changed: an added value, a deleted store and a config taken back to an earlier version
    each give the ensemble of the config at hand, simulating only what is missing. (The jobs read
    each spec under a name made from its content, so Snakemake's records decide nothing.)"""
    results = tmp_path / "results"
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    small = tiny_config(results_dir=str(results))
    larger = tiny_config(results_dir=str(results), grid={"lr": [0.2, 0.4, 0.3]})
    cfg = write_yaml(tmp_path / "t.yaml", small)
    sweep = results / "tiny"

    def lrs() -> list[float]:
        return sorted(set(xr.open_zarr(sweep / "ensemble.zarr")["lr"].values.tolist()))

    # the point stores and the ensemble only (the workflow's `ensemble` target); the fits and the
    # report: the last step (that an ensemble-only run removes an earlier one's: tests/sweep/test_shards.py)
    assert run_cli("run", str(cfg), "--cores", "2", "--", "ensemble", cwd=first).returncode == 0
    before = _stores(sweep)
    write_yaml(cfg, larger)  # an added value, then plain snakemake where sgdsweep run ran
    proc = run_snakemake(first, cfg, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_stores(sweep) - before) == 2 and sorted(_simulated(sweep)) == sorted(_stores(sweep) - before)
    assert lrs() == [0.2, 0.3, 0.4]
    gone = min(_stores(sweep))  # a deleted store, then plain snakemake from another directory
    (sweep / "points" / f"{gone}.npz").unlink()
    proc = run_snakemake(second, cfg, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert gone in _stores(sweep) and _simulated(sweep) == [gone]
    write_yaml(cfg, small)  # back to the first config: the ensemble follows, nothing is simulated
    proc = run_snakemake(first, cfg, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lrs() == [0.2, 0.4] and _simulated(sweep) == []
    write_yaml(cfg, larger | {"report": {"title": "Another"}})  # and forth again, with sgdsweep run
    proc = run_cli("run", str(cfg), "--cores", "2", cwd=second)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lrs() == [0.2, 0.3, 0.4] and _simulated(sweep) == []
    assert "Another" in (sweep / "report.html").read_text()
    assert sorted(p.name.split(".")[0] for p in (sweep / "plan" / "by-content").glob("*.json")) == [
        "fit", "report", "sweep"]  # one version of each spec is kept


def test_receipts_of_another_copy_of_the_sweep_do_not_break_a_run(first_run, tmp_path):
    """Shard receipts copied from another copy of the same sweep (other results, no stores) make
    the first run recompute, not fail: every job that parses the workflow computes the same plan
    (a shard's records of other versions are pruned by its own job, not when the run starts).
    The run is given an existing scheduler (``SGDSWEEP_SCHEDULER``): its simulate tasks run there
    and no local cluster is started."""
    from distributed import Client, get_task_stream

    work, _, _, _ = first_run
    results = tmp_path / "results"
    (results / "tiny" / "shards").mkdir(parents=True)
    for receipt in (work / "results" / "tiny" / "shards").glob("*.json"):
        shutil.copyfile(receipt, results / "tiny" / "shards" / receipt.name)
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(results_dir=str(results)))
    with Client(SHARED_CLUSTER.start(), timeout="30s") as client, get_task_stream(client) as stream:
        proc = run_cli("run", str(cfg), "--cores", "2", "--", "ensemble", cwd=tmp_path)  # stores, ensemble
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_stores(results / "tiny")) == 4 and len(_simulated(results / "tiny")) == 4
    assert xr.open_zarr(results / "tiny" / "ensemble.zarr").sizes["point"] == 4
    receipts = list((results / "tiny" / "shards").glob("*.json"))
    assert len(receipts) == 1  # the copied one pruned
    assert not (results / "tiny" / ".cluster" / "daemon.log").exists()  # no local cluster was started
    shard = json.loads(receipts[0].read_text())["shard"]
    ran = [task["key"] for task in stream.data if str(task["key"]).startswith("simulate-")]
    assert ran and all(key.startswith(f"simulate-{shard}-") for key in ran), ran  # on the given scheduler


def test_invalid_config_fails_before_any_job(tmp_path):
    cfg = tiny_config(grid={"lr": [0.1, -0.2]})
    path = write_yaml(tmp_path / "bad.yaml", cfg)
    proc = run_snakemake(tmp_path, path)
    assert proc.returncode != 0
    assert "grid.lr[1]" in proc.stderr + proc.stdout and "-0.2" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()
    cli = run_cli("run", str(path), "--cores", "1", cwd=tmp_path)
    assert cli.returncode == 2 and "grid.lr[1]" in cli.stderr
    repeated = tmp_path / "repeated.yaml"  # Snakemake's own YAML loader keeps the last of two keys
    repeated.write_text(path.read_text() + "sweep: other\n")
    proc = run_snakemake(tmp_path, repeated)
    assert proc.returncode != 0 and "found the key 'sweep' twice" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


def test_bad_scheduler_environment_variable(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", tiny_config(sweep="envbad"))
    proc = run_snakemake(tmp_path, path, env={"SGDSWEEP_SCHEDULER": "not-an-address"})
    assert proc.returncode != 0
    assert "SGDSWEEP_SCHEDULER" in proc.stdout + proc.stderr and "tcp://" in proc.stdout + proc.stderr
