"""The stability-edge search measures the almost-sure edge: where the top Lyapunov exponent of SGD
linearised about the minimum crosses zero, decided at a stated level from the replicas' exponents
(sgdsweep/sim/tangent.py, sgdsweep/sweep/search.py, docs/precision.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sgdsweep.errors import ConfigError
from sgdsweep.models import get_model
from sgdsweep.models.edge import stability_edge
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.sim.engine import Dynamics, run_lanes
from sgdsweep.sim.observables import ObserveSpec
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.sim.tangent import lyapunov_exponents, tangent_streams
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import Sweep, build_sweep
from sgdsweep.sweep.search import CRITERION, _targets, decide, half_width, write_edge_summary

LINEAR = {"kind": "linear", "n_inputs": 4, "label_noise": 0.5}
EDGE: dict[str, Any] = {
    "sweep": "edge",
    "seed": 3,
    "model": LINEAR,
    "dynamics": {"steps": 2000, "replicas": 16, "burn_in": 0},
    "grid": {"lr": [1.5, 3.0], "batch_size": 1, "samples_per_param": 10, "noise": "minibatch"},
    "search": {"edge": "lr", "tolerance": 0.02},
    "execution": {"workers": 1},
}
NOTHING = ObserveSpec(cov_max_dim=0, n_eigenpairs=0, loss=False, test_loss=False, autocorr_lags=0, noise_lags=(),
                      escape=False)


def problem_of(noise: str, n_inputs: int = 4):
    model = get_model("linear")
    params = {"seed": 3, "n_inputs": n_inputs, "n_outputs": 1, "samples_per_param": 10, "label_noise": 0.5,
              "inputs": "isotropic", "wishart_ratio": 2.0, "labels": "teacher", "noise": noise}
    return model.make_problem(model.data_params(params))


def search(tmp_path: Path, limit: int = 60, **sections: Any) -> Sweep:
    """Run an edge search's rounds in this process, as `sgdsweep run` does through Snakemake."""
    cfg = copy.deepcopy(EDGE)
    cfg["results_dir"] = str(tmp_path / "results")
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key in cfg else value
    for _ in range(limit):
        sweep = build_sweep(cfg)
        done = point_store.complete_points(sweep.directory / "points", (p.hash for p in sweep.points))
        todo = [p.spec() for p in sweep.points if p.hash not in done]
        if not todo:
            return sweep
        for batch in make_batches(todo, 8):
            simulate_points(batch, str(sweep.directory / "points"))
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("noise", ["minibatch", "epoch", "label", "gaussian_matched", "student_t"])
def test_the_tangent_is_the_linearisation_of_each_replicas_own_run(noise):
    """For linear regression the deviation of two runs on the same random numbers evolves by the
    linearised dynamics exactly: its log-growth is the tangent's summed log-growth, replica by
    replica (the tangent sees each replica's own batches and matched-noise normals)."""
    problem = problem_of(noise, n_inputs=6)  # 6 parameters: matched noise in the engine's sum form
    replicas, steps, lr, shift = 5, 60, 2.0, 1e-3
    key = "0123456789abcdef"
    streams = tangent_streams(1, key, replicas)
    start = np.array([s[2].standard_normal(problem.dim) for s in tangent_streams(1, key, replicas)])
    start /= np.linalg.norm(start, axis=1, keepdims=True)
    gamma = lyapunov_exponents(problem, noise=noise, batch_size=3, steps=steps, lr=np.full(replicas, lr),
                               momentum=np.zeros(replicas), burn_in=np.zeros(replicas, int), streams=streams)
    ends = []
    for offset in (0.0, shift):
        w0 = problem.w_min + 0.3 + offset * start
        out = run_lanes(problem, noise=noise, batch_size=3, steps=steps, lr=np.full(replicas, lr),
                        momentum=np.zeros(replicas), burn_in=np.zeros(replicas, int), bound=np.full(replicas, 1e300),
                        w0=w0, streams=[g[:2] for g in replica_streams(1, key, replicas)], observe=NOTHING)
        ends.append(out["w_final"])
    growth = np.log(np.linalg.norm(ends[1] - ends[0], axis=1) / shift) / steps
    np.testing.assert_allclose(gamma, growth, rtol=0, atol=1e-6)
    assert np.ptp(gamma) > 1e-3  # the replicas' batches differ, and so do their exponents


def test_with_momentum_and_additive_noise_the_exponent_is_the_mean_dynamics_radius():
    """On the quadratic with Gaussian noise the linearised heavy-ball step is the companion
    [[1 + μ − λk, −μ], [1, 0]]: γ = log of its spectral radius, for every replica."""
    model = get_model("quadratic")
    problem = model.make_problem(model.data_params({"curvatures": [1.0, 0.3], "noise_cov": [1.0, 1.0]}))
    lr, steps = np.array([2.75, 2.75, 1.2]), 4000
    mu = np.array([0.3, 0.6, 0.0])
    streams = tangent_streams(2, "0123456789abcdef", 3)
    gamma = lyapunov_exponents(problem, noise="gaussian", batch_size=1, steps=steps, lr=lr, momentum=mu,
                               burn_in=np.full(3, steps // 10), streams=streams)
    exact = [max(np.log(np.max(np.abs(np.roots([1.0, -(1.0 + m - a * k), m])))) for k in (1.0, 0.3))
             for a, m in zip(lr, mu)]
    np.testing.assert_allclose(gamma, exact, atol=2e-3)
    assert gamma[0] > 0 > gamma[1]  # Liu et al. Cor. 1: stable iff μ > λk/2 − 1 = 0.375


def test_the_sde_integrator_is_linearised_per_sgd_step():
    """The SDE's Euler step dt = λ·dt_over_lr: with additive noise γ = k log|1 − dt h| per SGD
    step of k integrator steps (the slowest mode after the burn-in)."""
    model = get_model("quadratic")
    problem = model.make_problem(model.data_params({"curvatures": [2.0], "noise_cov": [1.0]}))
    gamma = lyapunov_exponents(problem, noise="gaussian", batch_size=1, steps=400, lr=np.array([0.5]),
                               momentum=np.zeros(1), burn_in=np.array([40]), streams=tangent_streams(1, "ab", 1),
                               dynamics=Dynamics("sde", 0.25))
    assert gamma[0] == pytest.approx(4 * np.log(1 - 0.25 * 0.5 * 2.0), rel=1e-9)


def test_a_value_is_decided_when_the_99_percent_t_interval_excludes_zero():
    t15 = 2.946712883  # Student t, 15 degrees of freedom, 99.5 % quantile
    assert half_width(0.01, 16) == pytest.approx(t15 * 0.01, rel=1e-8)
    assert decide({"lyapunov": -0.0295, "lyapunov_se": 0.01}, 16)["decision"] == "stable"
    assert decide({"lyapunov": -0.0294, "lyapunov_se": 0.01}, 16)["decision"] == "undecided"
    assert decide({"lyapunov": 0.0295, "lyapunov_se": 0.01}, 16)["decision"] == "unstable"
    assert decide({"lyapunov": 0.5, "lyapunov_se": None}, 1)["decision"] == "undecided"  # one replica: no interval
    assert decide({"diverged_replicas": 16}, 16)["decision"] == "undecided"  # divergence alone decides nothing
    assert "99 % t-interval" in CRITERION and "Lyapunov" in CRITERION


def test_undecided_values_are_closed_in_on_and_then_evaluated_with_more_replicas():
    def at(decisions: dict[float, str]) -> dict[float, dict[str, str]]:
        return {v: {"decision": d} for v, d in decisions.items()}

    # the midpoint of a bracket with nothing undecided inside
    assert _targets(at({1.0: "stable", 2.0: "unstable"}), 1.0, 2.0, "lr", 0.01) == [1.5]
    # undecided at 1.5: bisect the gaps on either side of it
    assert _targets(at({1.0: "stable", 1.5: "undecided", 2.0: "unstable"}), 1.0, 2.0, "lr", 0.01) == [1.25, 1.75]
    # the gaps are narrower than a quarter of the tolerance: more replicas at the undecided values
    close = at({1.497: "stable", 1.499: "undecided", 1.5: "undecided", 1.502: "unstable"})
    assert _targets(close, 1.497, 1.502, "lr", 0.01) == [1.499, 1.5]
    assert _targets(at({1.0: "undecided", 2.0: "undecided"}), None, None, "lr", 0.01) == [1.0, 2.0]
    assert _targets(at({1.0: "stable", 2.0: "stable"}), 2.0, None, "lr", 0.01) == [4.0]
    assert _targets(at({0.2: "stable"}), 0.2, None, "momentum", 0.01) == [0.6]


def almost_sure_edge(problem, lo: float, hi: float) -> tuple[float, float]:
    """The almost-sure edge of single-sample SGD on ``problem``, independently of the package:
    products of I − λ x xᵀ (x a uniformly drawn sample) on 2000 chains, their top exponent by the
    growth of a renormalised vector, on common random numbers at every λ; its zero by two secant
    steps from [lo, hi]. Returns the edge and its standard error."""
    x = problem.x

    def gamma(lr: float) -> tuple[float, float]:
        rng = np.random.default_rng(12345)
        v = rng.standard_normal((2000, x.shape[1]))
        total = np.zeros(len(v))
        for t in range(1000):
            xb = x[rng.integers(0, len(x), len(v))]
            v -= lr * xb * np.einsum("ci,ci->c", xb, v)[:, None]
            norm = np.linalg.norm(v, axis=1)
            v /= norm[:, None]
            if t >= 100:
                total += np.log(norm)
        g = total / 900
        return float(g.mean()), float(g.std(ddof=1) / np.sqrt(len(g)))

    (g_lo, _), (g_hi, _) = gamma(lo), gamma(hi)
    slope = (g_hi - g_lo) / (hi - lo)
    root = lo - g_lo / slope
    g_root, se = gamma(root)
    return root - g_root / slope, se / slope


def test_the_minibatch_edge_at_16_and_64_replicas_brackets_the_almost_sure_edge(tmp_path):
    """Single-sample SGD on linear regression: the almost-sure edge lies 23 % above the
    mean-square one. Brackets measured at 16 and at 64 replicas overlap, and each holds the edge
    computed independently (within its own error); whether replicas crossed the divergence bound
    — which puts the edge between the two — plays no part."""
    edge, edge_se = almost_sure_edge(problem_of("minibatch"), 2.05, 2.25)
    brackets = []
    for replicas in (16, 64):
        sweep = search(tmp_path / str(replicas), dynamics={"replicas": replicas})
        (group,) = sweep.rounds["groups"]
        assert group["status"] == "found", group["status"]
        lo, hi = group["bracket"]
        assert hi - lo <= 0.02 * hi
        assert lo - 3 * edge_se <= edge <= hi + 3 * edge_se, (group["bracket"], edge, edge_se)
        mean_square = stability_edge(problem_of("minibatch"), group["params"], "lr")["value"]
        assert lo > 1.15 * mean_square  # the mean-square edge (1.74) is far below
        brackets.append((lo, hi))
    assert max(b[0] for b in brackets) <= min(b[1] for b in brackets)  # they overlap


def test_the_gaussian_edge_at_16_and_64_replicas_holds_the_exact_edge(tmp_path):
    """Additive Gaussian noise leaves the linearised dynamics I − λH: the almost-sure and the
    mean-square edge are both 2/h_max, and the brackets at 16 and 64 replicas hold it."""
    problem = problem_of("gaussian")
    exact = 2.0 / np.linalg.eigvalsh(problem.sxx).max()
    for replicas in (16, 64):
        sweep = search(tmp_path / str(replicas), dynamics={"replicas": replicas},
                       grid={**EDGE["grid"], "lr": [3.0, 9.0], "noise": "gaussian"})
        (group,) = sweep.rounds["groups"]
        assert group["status"] == "found"
        lo, hi = group["bracket"]
        assert lo <= exact <= hi and hi - lo <= 0.02 * hi
        assert stability_edge(problem, group["params"], "lr")["value"] == pytest.approx(exact, rel=1e-9)


def test_edge_json_gives_each_bracket_its_criterion_and_the_mean_square_edge(tmp_path):
    from sgdsweep.sweep.plan import write_plan

    sweep = search(tmp_path, grid={**EDGE["grid"], "lr": [3.0, 9.0], "noise": "gaussian",
                                   "batch_size": [1, 4]})
    files = write_plan(sweep)
    summary = write_edge_summary(files.report_spec, files.edge)
    assert json.loads(files.edge.read_text()) == summary
    assert summary["axis"] == "lr" and summary["criterion"] == CRITERION and summary["confidence"] == 0.99
    assert [g["axes"]["batch_size"] for g in summary["groups"]] == [1, 4]
    for g, info in zip(summary["groups"], sweep.rounds["groups"]):
        assert g["status"] == "found" and g["bracket"] == info["bracket"] and g["criterion"] == CRITERION
        theory = stability_edge(problem_of("gaussian"), info["params"], "lr")["value"]
        assert g["mean_square_edge"] == pytest.approx(theory, rel=1e-12)
        assert g["bracket"][0] <= g["mean_square_edge"] <= g["bracket"][1]
        assert {e["decision"] for e in g["evaluated"]} <= {"stable", "unstable", "undecided"}
    with pytest.raises(ValueError, match="not the report spec of an edge search"):
        write_edge_summary(files.fit_spec.with_name("sweep.json"), tmp_path / "x.json")


def test_an_edge_search_needs_a_model_with_a_unique_minimum(tmp_path):
    cfg = {"sweep": "edge", "results_dir": str(tmp_path), "model": {"kind": "two_layer"},
           "grid": {"lr": [0.1, 0.2], "batch_size": 2, "samples_per_param": 10, "hidden_width": 4},
           "search": {"edge": "lr"}}
    with pytest.raises(ConfigError, match=r"search\.edge.*a model with a unique minimum.*manifold of minima"):
        build_sweep(cfg)


def test_every_point_of_a_search_stores_its_replicas_exponents(tmp_path):
    sweep = search(tmp_path, grid={**EDGE["grid"], "lr": [1.0, 3.0]}, search={"edge": "lr", "max_rounds": 1})
    for p in sweep.points:
        assert p.params["lyapunov"] is True
        with point_store.PointStore(point_store.point_path(sweep.directory / "points", p.hash)) as s:
            gammas, summary = s.read("lyapunov_replica"), s.attrs["summary"]
        assert gammas.shape == (16,)
        assert summary["lyapunov"] == pytest.approx(gammas.mean(), rel=1e-12)
        assert summary["lyapunov_se"] == pytest.approx(gammas.std(ddof=1) / 4, rel=1e-12)
    (group,) = sweep.rounds["groups"]
    assert len(sweep.points) == 3 and group["status"] == "budget: max_rounds = 1"
    assert group["bracket"] == [2.0, 3.0]  # 1.0 and 2.0 stable, 3.0 unstable
