"""The config's limits: sizes refused from the lists' lengths before anything is expanded or built,
values the file system or Python cannot hold, local workers bounded by the cores, and a memory
estimate that counts every worker process (``sgdsweep/sweep/limits.py``, ``docs/bad-inputs.md``)."""

from __future__ import annotations

import pytest
from conftest import cli, tiny_config

from sgdsweep.errors import ConfigError
from sgdsweep.sweep import limits
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.cost import PROCESS_BYTES, RUN_BYTES, RUN_BYTES_PER_POINT, estimate_memory, memory_limit, tasks
from sgdsweep.sweep.schema import read_yaml


def _refused(tmp_path, text: str, *parts: str, command: str = "validate") -> str:
    """Run ``sgdsweep COMMAND`` on a config file of ``text``: exit status 2, one message holding
    ``parts``, no traceback, nothing written."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    proc = cli(command, str(path), cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for part in parts:
        assert part in proc.stderr, (part, proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]
    return proc.stderr


GRID = "grid: {lr: 0.1, batch_size: 2, samples_per_param: 10}\n"


def test_a_deeply_nested_value_in_a_file_is_refused_naming_its_key(tmp_path):
    _refused(tmp_path, GRID + "report:\n  title: " + "[" * 100_000 + "]" * 100_000 + "\n",
             "report.title[…]", f"at most {limits.MAX_DEPTH} levels", "Line 3")


def test_a_deeply_nested_value_from_python_is_refused_before_any_recursive_walk():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ConfigError, match=r"report\.title\[…\].*nested at most"):
        build_sweep(tiny_config(report={"title": deep}))


@pytest.mark.parametrize("results_dir, parts", [
    ("res\\0ults", ["results_dir", "without NUL"]),
    ("a" * 5000, ["results_dir", "(5000 characters)", "at most 255 bytes"]),
    ("x/" * 2100, ["results_dir", "a path of at most"]),
])
def test_a_results_dir_no_file_system_holds_is_refused(tmp_path, results_dir, parts):
    _refused(tmp_path, GRID + f'results_dir: "{results_dir}"\n', *parts, command="plan")


def test_a_grid_beyond_a_million_points_is_refused_from_its_lengths_with_its_cost(tmp_path):
    values = ", ".join(str(i / 1001) for i in range(1000))
    _refused(tmp_path, f"grid: {{lr: 0.1, samples_per_param: 10, batch_size: [{', '.join(map(str, range(1, 1002)))}],"
             f" momentum: [{values}]}}\n", "config key 'grid'", "1001000 points (batch_size 1001 × momentum 1000)",
             f"at most {limits.MAX_POINTS} points", "1.3e+12 replica-steps")


def test_a_million_value_axis_is_refused_before_validation():
    with pytest.raises(ConfigError, match=r"'grid'.*2000000 points \(lr 1000000 × batch_size 2\)"):
        build_sweep(tiny_config(grid={"lr": [1e-6 * (i + 1) for i in range(10**6)]}))


def test_a_list_beyond_the_limit_is_refused_from_a_mapping_too():
    """A sweep given as a mapping (the Python API, an imported export's config) has the YAML file's
    limit of items per list: a sweep of more points than one list holds is a product of lists."""
    with pytest.raises(ConfigError, match=r"'grid\.lr'.*more than 100000 items"):
        build_sweep(tiny_config(grid={"lr": [1e-6 * (i + 1) for i in range(100_001)], "batch_size": 2}))
    points = [{"lr": 1e-6 * (i + 1), "batch_size": 2} for i in range(100_001)]
    with pytest.raises(ConfigError, match=r"'points'.*more than 100000 items"):
        build_sweep(tiny_config(grid={"samples_per_param": 10}, points=points))


def test_a_sweep_too_large_for_the_runs_own_memory_names_its_points(monkeypatch):
    """The run's own processes hold every point: a sweep that fits but for them is refused by its
    size, not by its replicas."""
    from sgdsweep.sweep import cost

    sweep = build_sweep(tiny_config(execution={"workers": 1, "points_per_task": 1}))
    need = estimate_memory(sweep, tasks(sweep)).total
    monkeypatch.setattr(cost, "RUN_BYTES_PER_POINT", 2**30)
    with pytest.raises(ConfigError, match=r"'grid'.*4 points.*of which 4 GiB is the 4 points.*Split the sweep"):
        cost.check_memory(build_sweep(tiny_config(execution={"workers": 1, "points_per_task": 1,
                                                             "max_memory": need + 2**30})))


def test_zip_groups_and_explicit_points_count_once():
    n, how = limits.count_points({"lr": [1, 2, 3], "batch_size": [1, 2, 3], "momentum": [0, 0.5],
                                  "zip": [["lr", "batch_size"]]}, [{"lr": 1}] * 4)
    assert (n, how) == (10, "momentum 2 × zip(lr, batch_size) 3 + 4 explicit points")


def test_a_list_beyond_the_limit_is_refused_while_the_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_LIST_ITEMS", 100)
    path = tmp_path / "c.yaml"
    path.write_text("grid:\n  lr: [" + ", ".join(str(i + 1) for i in range(10_000)) + "]\n")
    with pytest.raises(ConfigError, match=r"'grid\.lr'.*more than 100 items.*Line 2"):
        read_yaml(path)


def test_a_file_beyond_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "c.yaml"
    path.write_text(GRID + "# " + "x" * 2000 + "\n")
    with pytest.raises(ConfigError, match=r"at most 0 MiB.*It has \d+ bytes"):
        read_yaml(path)


def test_a_model_too_large_to_build_is_refused_before_building_it(tmp_path):
    _refused(tmp_path, GRID + "model: {kind: linear, n_inputs: 5000}\n", "model.n_inputs", "got 5000",
             f"at most {limits.MAX_MODEL_SIZE}")
    with pytest.raises(ConfigError, match=r"grid\.hidden_width.*at most 1000"):
        build_sweep(tiny_config(model={"kind": "two_layer", "n_inputs": 4}, grid={"hidden_width": [2, 5000]}))


def test_local_workers_beyond_twice_the_cores_are_refused_but_a_schedulers_are_not():
    cores = limits.local_cores()
    with pytest.raises(ConfigError, match=rf"execution\.workers.*got 100000.*from 1 to {2 * cores}"):
        build_sweep(tiny_config(execution={"workers": 100000}))
    build_sweep(tiny_config(execution={"workers": 2 * cores}))
    build_sweep(tiny_config(execution={"workers": 100000, "scheduler": "tcp://127.0.0.1:8786"}))


def test_slurm_memory_in_slurms_own_syntax_is_the_limit():
    sweep = build_sweep(tiny_config(execution={"cluster": "slurm", "slurm": {"memory": "4G", "cores": 2}}))
    assert memory_limit(sweep.config["execution"]) == (4 * 10**9, "auto: slurm.memory 4G of one job")
    with pytest.raises(ConfigError, match=r"execution\.slurm\.memory.*'lots'.*4G"):
        build_sweep(tiny_config(execution={"cluster": "slurm", "slurm": {"memory": "lots"}}))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_memory_estimate_counts_every_worker_and_the_runs_own_processes(workers):
    """Four points in two tasks: every worker's process counts, busy or not, and the run's own,
    which hold the sweep's points."""
    sweep = build_sweep(tiny_config(execution={"workers": workers, "points_per_task": 1}))
    task_list = tasks(sweep)
    est = estimate_memory(sweep, task_list)
    biggest = sorted((t.memory for t in task_list), reverse=True)[:workers]
    assert est.processes == workers
    assert est.total == sum(biggest) + workers * PROCESS_BYTES + RUN_BYTES + len(sweep.points) * RUN_BYTES_PER_POINT
    slurm = build_sweep(tiny_config(execution={"cluster": "slurm", "slurm": {"cores": 3, "memory": "8G"}}))
    est = estimate_memory(slurm, tasks(slurm))
    assert (est.processes, est.run_bytes) == (3, 0)  # a job's workers; the run's processes stay home


def test_more_local_workers_than_tasks_still_count(monkeypatch):
    monkeypatch.setattr(limits, "local_cores", lambda: 16)
    sweep = build_sweep(tiny_config(execution={"workers": 24, "points_per_task": 8}))
    est = estimate_memory(sweep, tasks(sweep))
    assert est.at_once == 2 and est.processes == 24  # two tasks (batch sizes 2 and 4), 24 processes
    assert est.total >= 24 * PROCESS_BYTES + RUN_BYTES
