"""What ``sgdsweep`` writes to the terminal: Snakemake's output under ``sgdsweep run`` (its logger
plugin, NO_COLOR), Ctrl-C in a job, a reader that closes the output early, numbers in logs, the
-q/-v help, and progress reported from inside a running task."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, tiny_config, write_yaml

from sgdsweep.run import cli, execute, progress, runner
from sgdsweep.sweep.config import build_sweep

PLUGINS = REPO / "sgdsweep" / "run" / "snakemake_plugins"


def _args(tmp_path: Path, dry_run: bool = False, extra: tuple[str, ...] = ()) -> argparse.Namespace:
    return argparse.Namespace(config=str(tmp_path / "c.yaml"), cores=2, dry_run=dry_run, snakemake_args=list(extra))


# --- the Snakemake command and its logger plugin --------------------------------------------------


def test_a_run_shows_snakemake_through_the_plugin_and_extra_arguments_come_last(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    cmd = runner.snakemake_command(_args(tmp_path, extra=("results/tiny/fits.json",)), [], 0)
    assert cmd[cmd.index("--logger") + 1] == runner.LOGGER_PLUGIN == "sgdsweep"
    assert "--quiet" not in cmd and "--nocolor" not in cmd
    # a target after the extra arguments' `--` is not read as a value of --logger
    assert cmd[-5:] == ["--cores", "2", "--nolock", "--rerun-incomplete", "results/tiny/fits.json"]
    own = runner.snakemake_command(_args(tmp_path, extra=("--logger", "other")), [], 0)
    assert own.count("--logger") == 1 and own[-2:] == ["--logger", "other"]
    dry = runner.snakemake_command(_args(tmp_path, dry_run=True), [], 0)
    assert "--logger" not in dry and dry[dry.index("--quiet") + 1:dry.index("--quiet") + 2] == ["host"]
    assert "--printshellcmds" in runner.snakemake_command(_args(tmp_path), [], 1)


@pytest.mark.parametrize("extra, local", [((), True), (("ensemble",), True), (("fits", "report"), True),
                                          (("--profile", "p"), False), (("-n",), False),
                                          (("ensemble", "-e", "slurm"), False)])
def test_only_targets_after_the_double_dash_keep_the_runs_own_cluster(extra, local):
    assert runner.only_targets(extra) is local


def test_a_profile_snakemake_loads_unasked_is_seen(tmp_path, monkeypatch):
    """$SNAKEMAKE_PROFILE (but `none`) and a workflow profile where Snakemake looks for one: the
    run then starts no Dask cluster of its own (the profile may put the jobs elsewhere)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SNAKEMAKE_PROFILE", raising=False)
    snakefile = tmp_path / "workflow" / "Snakefile"
    assert runner.profile_in_use(snakefile) is None
    monkeypatch.setenv("SNAKEMAKE_PROFILE", "none")
    assert runner.profile_in_use(snakefile) is None
    monkeypatch.setenv("SNAKEMAKE_PROFILE", "slurm")
    assert "slurm" in runner.profile_in_use(snakefile)
    monkeypatch.delenv("SNAKEMAKE_PROFILE")
    for where in (tmp_path / "profiles" / "default", tmp_path / "default", snakefile.parent / "profiles" / "default"):
        where.mkdir(parents=True)
        assert "workflow profile" in runner.profile_in_use(snakefile)
        where.rmdir()
    assert runner.profile_in_use(runner._snakefile()) is None  # the project ships none where Snakemake looks


@pytest.mark.parametrize("value, passed", [("1", True), ("true", True), ("", False), (None, False)])
def test_no_color_is_passed_on_to_snakemake(tmp_path, monkeypatch, value, passed):
    """https://no-color.org: any non-empty NO_COLOR."""
    if value is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", value)
    for dry in (False, True):
        assert ("--nocolor" in runner.snakemake_command(_args(tmp_path, dry_run=dry), [], 0)) is passed


def test_snakemake_finds_the_logger_plugin_on_the_jobs_path():
    """The directory ``sgdsweep run`` puts on the PYTHONPATH holds a plugin Snakemake accepts."""
    code = ("from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry\n"
            "print(LoggerPluginRegistry().get_plugin('sgdsweep').log_handler.__module__)\n")
    env = {**os.environ, "PYTHONPATH": runner._job_environment()["PYTHONPATH"]}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "snakemake_logger_plugin_sgdsweep"
    assert str(PLUGINS) in env["PYTHONPATH"].split(os.pathsep)


@pytest.fixture
def plugin(monkeypatch):
    """The plugin module, with Python's SIGINT handler in place; the handler it installs is undone
    afterwards."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    import snakemake_logger_plugin_sgdsweep as module

    before = signal.getsignal(signal.SIGINT)
    # Python's own handler, as in a fresh process, whatever an earlier test of this worker left
    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(module, "_interrupted", False)
    yield module
    signal.signal(signal.SIGINT, before)


def _record(level: int, text: str) -> logging.LogRecord:
    return logging.LogRecord("snakemake", level, __file__, 0, text, None, None)


def test_the_plugin_shows_warnings_and_errors_and_everything_with_v(plugin, monkeypatch, capsys):
    monkeypatch.setenv("SGDSWEEP_VERBOSITY", "0")
    handler = plugin.LogHandler(None, None)
    for level, text in ((logging.INFO, "Building DAG of jobs..."), (logging.WARNING, "a warning"),
                        (logging.ERROR, "Error in rule fit:")):
        handler.handle(_record(level, text))
    assert capsys.readouterr().err == "a warning\nError in rule fit:\n"
    monkeypatch.setenv("SGDSWEEP_VERBOSITY", "1")
    plugin.LogHandler(None, None).handle(_record(logging.INFO, "Building DAG of jobs..."))
    assert capsys.readouterr().err == "Building DAG of jobs...\n"


def test_the_plugin_is_silent_after_ctrl_c(plugin, monkeypatch, capsys):
    """SIGINT is noted, then handled as before (a KeyboardInterrupt for Snakemake); the errors of
    the jobs Snakemake then cancels are not shown."""
    monkeypatch.setenv("SGDSWEEP_VERBOSITY", "1")
    handler = plugin.LogHandler(None, None)
    with pytest.raises(KeyboardInterrupt):
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    assert plugin._interrupted
    handler.handle(_record(logging.ERROR, "RuleException: CalledProcessError"))
    assert capsys.readouterr().err == ""


@pytest.mark.workflow
def test_no_color_on_a_terminal(tmp_path):
    """A dry run on a terminal (Snakemake's own output, coloured there by default) has no escape
    sequence with NO_COLOR set."""
    import pty

    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    parent, child = pty.openpty()
    subprocess.run(["stty", "cols", "120", "rows", "40"], stdin=child, check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(cfg), "-n", "--cores", "2"], cwd=tmp_path,
                            stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(parent)
    assert proc.wait(timeout=300) == 0, out.decode(errors="replace")[-3000:]
    assert b"rule simulate" in out and b"This was a dry-run" in out  # Snakemake's plan is there
    assert b"\x1b[" not in out


# --- Ctrl-C in a job, and a reader that goes away ---------------------------------------------------


@pytest.mark.parametrize("under_run, said", [(True, False), (False, True)])
def test_a_job_of_sgdsweep_run_exits_130_silently_on_ctrl_c(monkeypatch, capsys, under_run, said):
    """``sgdsweep run`` says once that the run was interrupted; its jobs do not say it again."""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_aggregate", interrupted)
    if under_run:
        monkeypatch.setenv(progress.VERBOSITY_ENV, "0")
    else:
        monkeypatch.delenv(progress.VERBOSITY_ENV, raising=False)
    assert cli.main(["aggregate", "plan/sweep.json", "--out", "ensemble.zarr"]) == 130
    assert ("interrupted" in capsys.readouterr().err) is said


def test_a_reader_that_closes_the_output_early_ends_the_command_quietly(tmp_path):
    """``sgdsweep plan CONFIG | head -1``: no BrokenPipeError traceback, exit status 141 as for a
    Unix tool ended by SIGPIPE."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(results_dir=str(tmp_path / "results")))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "plan", "-s", str(cfg)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == cli.EXIT_BROKEN_PIPE == 141, err
    assert err == "", err


# --- numbers in logs, help ------------------------------------------------------------------------


def test_fit_lines_print_numbers_to_five_digits_and_no_python_reprs():
    q = {"estimate": 1.0985999999999998, "interval": [1.0500000000000003, None], "interval_method": "bootstrap",
         "theory": 1.0895875847930518, "theory_inside": True}
    line = cli.fit_line("power_law", "a", {"hidden_width": 2, "lr": 0.30000000000000004}, q)
    assert line == ("fit power_law a at hidden_width = 2, lr = 0.3 = 1.0986 [1.05, —] "
                    "(bootstrap; theory 1.0896, inside)")
    bare = cli.fit_line("escape", "c", {}, {**q, "theory": None, "theory_inside": None})
    assert bare.endswith("(bootstrap; no theory)") and "None" not in bare and " at " not in bare


def test_the_plan_prints_parameters_to_five_digits(tmp_path):
    from sgdsweep.sweep.explain import explain, format_explanation, show_value, show_values

    sweep = build_sweep(tiny_config(results_dir=str(tmp_path), grid={"lr": [0.1 + 0.2], "batch_size": 2}))
    text = format_explanation(sweep, explain(sweep))
    assert "lr=0.3, batch_size=2, momentum=0, samples_per_param=10" in text, text
    assert not re.search(r"\d{7}", text), text
    assert show_value({"hidden_width": 2, "scale": None, "on": True}) == "{hidden_width: 2, scale: none, on: true}"
    assert show_values(0.5, 0.7) == ("0.5", "0.7")
    assert show_values(0.1, 0.1000001) == ("0.1", "0.1000001")  # more digits only where 5 look alike


def _help(capsys, verb: str) -> str:
    with pytest.raises(SystemExit):
        cli.main([verb, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("verb", ["validate", "plan", "export", "verify", "import", "merge"])
def test_quiet_and_verbose_help_speaks_of_the_verb_itself(capsys, verb):
    text = _help(capsys, verb)
    output = " ".join(text.split("\noutput:\n")[1].split("\nexit status:")[0].split())
    assert output == ("-q, --quiet print only errors, warnings and the result "
                      "-v, --verbose also print debugging detail"), output


def test_quiet_and_verbose_help_of_run(capsys):
    text = " ".join(_help(capsys, "run").split())
    assert "print only errors, warnings and the closing summary" in text
    assert "Snakemake's own output and its shell commands" in text


# --- progress ---------------------------------------------------------------------------------------


def test_the_jobs_draw_a_bar_only_when_one_shard_job_runs_at_a_time(tmp_path):
    two = build_sweep(tiny_config(results_dir=str(tmp_path), grid={"samples_per_param": [10, 20]}))
    assert len(two.shards) == 2
    first = [p.hash for p in next(iter(two.shards.values()))]
    assert runner.progress_style(two, set(), cores=2) == "lines"
    assert runner.progress_style(two, set(), cores=1) == "bar"
    assert runner.progress_style(two, set(first), cores=2) == "bar"  # one shard left to simulate


def test_the_engine_reports_its_steps_block_by_block(tmp_path):
    import numpy as np

    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.sim import engine

    sweep = build_sweep(tiny_config(results_dir=str(tmp_path), grid={"lr": [0.2], "batch_size": [2]},
                                    dynamics={"steps": 3000, "replicas": 2}))
    seen: list[float] = []
    simulate_points([sweep.points[0].spec()], str(tmp_path), progress=seen.append)
    assert len(seen) >= 3000 // engine.BLOCK_STEPS and seen[-1] == 1.0
    assert np.all(np.diff(seen) > 0) and 0 < seen[0] < 1


def test_progress_comes_from_inside_a_running_task(tmp_path, monkeypatch, caplog):
    """One task of one long point: before it finishes, the shard's progress already counts the
    steps its task reported (a Dask event on the shard's topic)."""
    from distributed import LocalCluster

    from sgdsweep.sweep.plan import write_plan

    monkeypatch.setattr(execute, "TASK_REPORT_S", 0.0)
    monkeypatch.setattr(execute, "REDRAW_S", 0.02)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    monkeypatch.delenv(progress.VERBOSITY_ENV, raising=False)
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results"), grid={"lr": [0.2], "batch_size": [2]},
                                    dynamics={"steps": 150000, "replicas": 8}))
    files = write_plan(sweep)
    (shard,) = sweep.shards
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as local, \
            caplog.at_level("INFO", logger="sgdsweep.run.execute"):
        execute.run_shard(files.root / "plan" / "shards" / f"{shard}.json", tmp_path / "receipt.json",
                          {"scheduler": local.scheduler_address})
    partial = [int(m.group(1)) for r in caplog.records
               if (m := re.search(r": 0/1 points done .* replica-steps \((\d+)%\)", r.getMessage()))]
    assert any(0 < pct < 100 for pct in partial), [r.getMessage() for r in caplog.records]
    assert partial == sorted(partial)


def test_the_summary_counts_only_stores_it_or_the_run_s_start_checked(tmp_path):
    """A store under a point's name that holds another point's results is not stored, also when
    nothing ran to replace it (a profile's dry run exits 0): the summary opens every store the
    run's start did not find complete, and counts neither it nor a simulation of it."""
    import shutil

    from conftest import make_finished_sweep

    from sgdsweep.run.summary import run_summary
    from sgdsweep.store.points import complete_points, point_path

    root = make_finished_sweep(tmp_path)
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1500, "replicas": 4}))
    points = root / "points"
    first, second = (p.hash for p in sweep.points[:2])
    shutil.copyfile(point_path(points, first), point_path(points, second))
    before = complete_points(points, [p.hash for p in sweep.points])
    assert second not in before and first in before
    n = len(sweep.points)
    assert f"points: {n - 1} of {n} stored, 0 simulated in this run" in run_summary(sweep, before, 1.0)
