"""Planning stays light: building, validating and planning a sweep of any model family imports no
Numba, no SciPy sparse matrices and no theory module, and the time estimate compiles nothing
(a cached kernel rate or the cost model of :mod:`sgdsweep.sweep.rates`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, run_cli, tiny_config, write_yaml

#: One config per model family (the repository's examples; results_dir set by the test).
FAMILY_CONFIGS = ["linear_noise_types", "quadratic", "two_layer", "matrix", "escape", "thesis_sde", "digits"]
#: Module prefixes planning must not import.
HEAVY = ("numba", "scipy.sparse", "sgdsweep.theory", "sklearn", "sgdsweep.sim.engine", "sgdsweep.sim.kernels")

PROBE = """
import json, sys
from sgdsweep.sweep.config import load_sweep
from sgdsweep.sweep.explain import explain, format_explanation
from sgdsweep.sweep.plan import write_plan
out = []
for path in sys.argv[1:]:
    sweep = load_sweep(path)
    text = format_explanation(sweep, explain(sweep), cost=True)
    write_plan(sweep)
    out.append(text.splitlines()[-1])
heavy = sorted(m for m in sys.modules if m.startswith({heavy!r}))
print(json.dumps({{"heavy": heavy, "time_lines": out}}))
"""


def _configs(tmp_path: Path) -> list[Path]:
    out = []
    for name in FAMILY_CONFIGS:
        raw = yaml.safe_load((REPO / "config" / "models" / f"{name}.yaml").read_text())
        raw["results_dir"] = str(tmp_path / "results")
        out.append(write_yaml(tmp_path / f"{name}.yaml", raw))
    return out


def test_planning_every_family_imports_nothing_heavy(tmp_path):
    configs = _configs(tmp_path)
    env_cache = tmp_path / "no-cache.json"
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *map(str, configs)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
                          env={**_env(), "SGDSWEEP_RATE_CACHE": str(env_cache)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["heavy"] == []
    assert len(result["time_lines"]) == len(FAMILY_CONFIGS)
    assert all("the cost model's rate" in line for line in result["time_lines"]), result["time_lines"]


@pytest.mark.parametrize("verb", ["validate", "plan"])
def test_cli_validate_and_plan_import_nothing_heavy(tmp_path, verb):
    """``sgdsweep validate`` and ``sgdsweep plan`` (with the cost) in a subprocess: the modules
    loaded when the command returns, recorded at exit."""
    config = write_yaml(tmp_path / "c.yaml", tiny_config(results_dir=str(tmp_path / "results")))
    record = tmp_path / "modules.json"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(record)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n")
    env = {**_env(), "SGDSWEEP_RATE_CACHE": str(tmp_path / "none.json")}
    env["PYTHONPATH"] = str(hook) + ":" + env.get("PYTHONPATH", "")
    proc = run_cli(verb, str(config), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(record.read_text())
    assert "sgdsweep.sweep.config" in loaded
    assert [m for m in loaded if m.startswith(HEAVY)] == []
    if verb == "plan":
        assert "replica-steps/s per worker: the cost model's rate" in proc.stdout


def test_plan_reads_a_cached_rate(tmp_path):
    """A rate cached for the sweep's task kinds is the one the plan's time uses; a broken cache
    file falls back to the cost model."""
    from sgdsweep.sweep import cost, rates
    from sgdsweep.sweep.config import build_sweep

    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    cache = tmp_path / "rates.json"
    import os

    old = os.environ.get(rates.CACHE_ENV)
    os.environ[rates.CACHE_ENV] = str(cache)
    try:
        cache.write_text("{not json")
        assert "the cost model's rate" in cost.describe(sweep)[-1]
        kinds = cost.task_kinds(cost.tasks(sweep))
        rates.write_cache({rates.kind_key(ts[0].first.params): 1234.0 for ts in kinds.values()})
        line = cost.describe(sweep)[-1]
        assert "at 1.2e3 replica-steps/s per worker: measured on this machine" in line
        total = sum(t.replica_steps for t in cost.tasks(sweep))
        assert cost.format_duration(total / 1234.0 / 2) in line or cost.format_duration(total / 1234.0) in line
    finally:
        if old is None:
            os.environ.pop(rates.CACHE_ENV, None)
        else:
            os.environ[rates.CACHE_ENV] = old


def test_footprint_shapes_match_the_engine():
    """The planner's accumulator layout (:mod:`sgdsweep.sim.shapes`) is what the engine allocates,
    for every family's problem, and the theory's direct-solve bound is restated exactly."""
    from sgdsweep.models import get_model
    from sgdsweep.sim.observables import Accumulators
    from sgdsweep.sim.shapes import lane_accumulator_bytes, observe_spec
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.cost import THEORY_DIRECT_MAX_UNKNOWNS
    from sgdsweep.theory.linear import DIRECT_MAX_UNKNOWNS

    assert THEORY_DIRECT_MAX_UNKNOWNS == DIRECT_MAX_UNKNOWNS
    for name in FAMILY_CONFIGS:
        raw = yaml.safe_load((REPO / "config" / "models" / f"{name}.yaml").read_text())
        raw["results_dir"] = "/nonexistent-results"
        point = build_sweep(raw).points[0]
        model = get_model(point.params["model"])
        problem = model.make_problem(model.data_params(point.params))
        spec = observe_spec(point.params)
        acc = Accumulators.create(3, problem, spec, problem.w_min is None)
        nbytes = sum(a.nbytes for a in acc.arrays.values())
        assert nbytes == 3 * lane_accumulator_bytes(problem, spec, problem.w_min is None), name
        assert all(a.shape[0] == 3 for a in acc.arrays.values())
        assert np.all(acc.arrays["diverged_step"] == -1)


def test_digit_images_without_scikit_learn_are_load_digits():
    from sklearn.datasets import load_digits

    from sgdsweep.models.digits import load_digit_images

    images, labels = load_digit_images()
    bunch = load_digits()
    assert np.array_equal(images, bunch.data) and np.array_equal(labels, bunch.target)


def test_thesis_landscape_minima_are_stationary():
    """Without SciPy's optimisers the thesis landscape's minima and saddle are still found to
    rounding: a vanishing gradient, positive curvatures at the minima, one negative at the saddle."""
    from sgdsweep.models import landscape

    for seed in (0, 3):
        p = landscape.make_problem({"model": "landscape", "landscape": "thesis", "start": "spurious", "seed": seed})
        for w in (p.minima["real"], p.minima["spurious"], p.saddle_point):
            assert np.max(np.abs(p.grad(w[None])[0])) < 1e-12
        assert np.all(np.linalg.eigvalsh(p.hessian(p.minima["real"])) > 0)
        assert np.all(np.linalg.eigvalsh(p.hessian(p.minima["spurious"])) > 0)
        assert np.linalg.eigvalsh(p.hessian(p.saddle_point))[0] < 0 < p.barrier
        assert p.minima["real"][0] > 0 > p.minima["spurious"][0]


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("shard_work", [0, 10**8])
def test_tasks_group_as_the_shard_jobs_do(tmp_path, shard_work):
    """The plan's tasks (grouped by shard and batch size without encoding each point) are the
    batches that the shard jobs make (:func:`sgdsweep.run.execute.make_batches`)."""
    from sgdsweep.run.execute import make_batches
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.cost import tasks

    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results"),
                                    grid={"lr": [0.1, 0.2, 0.3], "batch_size": [2, 4], "samples_per_param": [10, 12],
                                          "momentum": [0.0, 0.5]},
                                    execution={"workers": 2, "points_per_task": 4, "shard_work": shard_work}))
    assert len(sweep.shards) == (2 if shard_work == 0 else 1)  # two data sets: two jobs, or one by work
    expected = sorted(tuple(s["hash"] for s in batch)
                      for points in sweep.shards.values() for batch in make_batches([p.spec() for p in points], 4))
    got = tasks(sweep)
    assert sorted(tuple(p.hash for p in _members(sweep, t)) for t in got) == expected


def _members(sweep, task):
    """The points of ``task``: ``task.points`` points of its data set and batch size from its first."""
    group = [p for p in sweep.shards[task.first.shard]
             if p.data_set == task.data_set and p.params["batch_size"] == task.first.params["batch_size"]]
    start = group.index(task.first)
    return group[start : start + task.points]


def test_a_sweep_builds_each_data_set_once(tmp_path, monkeypatch):
    """More data sets than the models' own caches hold (20 samples_per_param values, crossed with
    lr and batch_size) are built once each, not once per point: no step that grows with
    points × data sets."""
    from sgdsweep.models import linear
    from sgdsweep.sweep.config import build_sweep

    calls = []
    real = linear.make_problem
    monkeypatch.setattr(linear, "make_problem", lambda d: calls.append(d["n_samples"]) or real(d))
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results"), dynamics={"burn_in": 100},
                                    grid={"lr": [0.1, 0.2, 0.3], "batch_size": [1, 2],
                                          "samples_per_param": [10 + i for i in range(20)]}))
    assert len(sweep.points) == 120
    assert sorted(calls) == sorted(set(calls)) and len(calls) == 20
