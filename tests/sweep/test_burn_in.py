"""Burn-ins too short for the stationary state are found when a sweep is read: the count matches
what the simulated points store, ``auto`` and escape sweeps are not warned of, and ``validate``
and ``plan`` print the warning."""

from __future__ import annotations

import math

import pytest
from conftest import write_yaml

from sgdsweep.models.base import SHORT_BURN_IN
from sgdsweep.run import cli
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import points as point_store
from sgdsweep.sweep.burn_in import burn_in_relaxations, short_burn_in_warning
from sgdsweep.sweep.config import build_sweep


def _config(tmp_path, burn_in, **grid) -> dict:
    return {"sweep": "b", "seed": 5, "results_dir": str(tmp_path / "results"),
            "model": {"kind": "linear", "n_inputs": 5, "label_noise": 0.6},
            "dynamics": {"steps": 400, "replicas": 2, "burn_in": burn_in},
            "grid": {"lr": [0.05, 0.3, 20.0], "momentum": [0.0, 0.5], "batch_size": 4, "samples_per_param": 4.0,
                     "noise": "minibatch", **grid}}


def test_the_plan_counts_what_the_simulated_points_store(tmp_path):
    """Each point's burn-in in relaxation times, found when the sweep is read (all points of a data
    set at once), is the number its simulation stores; an unstable point (λ = 20) has none."""
    sweep = build_sweep(_config(tmp_path, 20))
    planned = burn_in_relaxations(sweep)
    assert set(planned) == {p.hash for p in sweep.points}
    simulate_points([p.spec() for p in sweep.points], str(tmp_path / "points"))
    for p in sweep.points:
        stored = point_store.read_attrs(point_store.point_path(tmp_path / "points", p.hash))["summary"]
        if p.params["lr"] == 20.0:
            assert math.isnan(planned[p.hash]) and stored["burn_in_relaxations"] is None
        else:
            assert planned[p.hash] == pytest.approx(stored["burn_in_relaxations"], rel=1e-12), p.params
    warning = short_burn_in_warning(sweep)
    short = sum(r < SHORT_BURN_IN for r in planned.values())
    assert short == 4 and warning.startswith(f"warning: {short} of 6 points have a burn-in under 4 slowest")
    fewest = min(r for r in planned.values() if not math.isnan(r))
    assert f"the fewest {fewest:.2g}, 20 steps at lr=0.05" in warning


def test_auto_burn_in_and_escape_sweeps_are_not_warned_of(tmp_path):
    assert short_burn_in_warning(build_sweep(_config(tmp_path, "auto", lr=[0.05, 0.3]) | {
        "dynamics": {"steps": 20000, "replicas": 2, "burn_in": "auto"}})) is None
    escape = build_sweep({"sweep": "e", "results_dir": str(tmp_path / "results"),
                          "model": {"kind": "landscape", "landscape": "double_well"},
                          "dynamics": {"steps": 1000, "replicas": 2, "burn_in": 0, "observe": {"escape": True}},
                          "grid": {"lr": [0.1, 0.2], "batch_size": 1, "noise": "gaussian"}})
    assert burn_in_relaxations(escape) == {} and short_burn_in_warning(escape) is None


def test_an_auto_burn_in_of_too_few_relaxation_times_is_told_to_raise_them(tmp_path):
    """With ``burn_in: auto`` a point is short only when ``burn_in_relaxations`` is set under
    4: the warning names that key (telling the user to set ``auto``, already set, would not help)."""
    config = _config(tmp_path, "auto", lr=[0.05, 0.3])
    config["dynamics"] |= {"steps": 20000, "burn_in_relaxations": 2}
    warning = short_burn_in_warning(build_sweep(config))
    assert warning.startswith("warning: 4 of 4 points have a burn-in under 4 slowest"), warning
    assert "the fewest 2, " in warning and "dynamics.burn_in_relaxations, where set, at least 4" in warning


@pytest.mark.parametrize("verb", ["validate", "plan"])
def test_validate_and_plan_print_the_warning(tmp_path, capsys, verb):
    path = write_yaml(tmp_path / "c.yaml", _config(tmp_path, 20))
    assert cli.main([verb, str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: 4 of 6 points have a burn-in under 4 slowest relaxation times" in out
    assert "set dynamics.burn_in: auto" in out


def test_the_plan_counts_the_sde_in_the_relaxation_times_of_its_own_step(tmp_path):
    """``method: sde`` relaxes by its Euler step dt = dt_over_lr·λ: the plan counts what the point
    stores (:func:`sgdsweep.sim.results.burn_in_relaxations`), finite at λk = 2.5 where the SGD map
    is unstable, and warns of λk = 1.9 only as the SDE's burn-in there is short (19 relaxation
    times of the SDE, 1 of the SGD map)."""
    from sgdsweep.models import get_model
    from sgdsweep.sim import results

    sweep = build_sweep({"sweep": "s", "seed": 1, "results_dir": str(tmp_path / "results"),
                         "model": {"kind": "quadratic", "curvatures": [1.0], "noise_cov": [1.0]},
                         "dynamics": {"steps": 400, "replicas": 2, "burn_in": 10, "method": "sde",
                                      "dt_over_lr": 0.1},
                         "grid": {"lr": [0.5, 1.9, 2.5], "batch_size": 1, "noise": "gaussian"}})
    planned = burn_in_relaxations(sweep)
    model = get_model("quadratic")
    for p in sweep.points:
        problem = model.make_problem(model.data_params(p.params))
        assert planned[p.hash] == pytest.approx(results.burn_in_relaxations(problem, p.params, p.burn_in),
                                                rel=1e-12), p.params
    assert sorted(planned.values()) == pytest.approx([5.0, 19.0, 25.0])
    assert short_burn_in_warning(sweep) is None
