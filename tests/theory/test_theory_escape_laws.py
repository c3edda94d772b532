"""Where the escape laws hold (sgdsweep.models.escape.laws_absent, which each landscape's escape
theory asks): Kramers' law only for SGD without momentum under additive Gaussian noise of constant
covariance, Mori's power law only without momentum under the state-dependent minibatch noise;
elsewhere the column is absent, the ensemble's ``missing_because`` says why per point, and the
escape fit compares nothing with it."""

from __future__ import annotations

import json
import math

import numpy as np
import xarray as xr

from sgdsweep import models
from sgdsweep.analysis.fit.escape import fit_escape
from sgdsweep.analysis.fit.verdict import judge
from sgdsweep.models.predict import predict
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store.aggregate import build_ensemble, write_ensemble
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan

# the double well of the example: ΔL = 0.35, k_a = 2.6, k_b = 0.9, σ = 1.3, λ = 0.346, S = 3
WELL = {"kind": "landscape", "barrier": 0.35, "curvature_min": 2.6, "curvature_saddle": 0.9, "noise_std": 1.3}
NO_ESCAPE_SOLVE = {"observe": {"escape": False}}  # predict() without the exact chain's grid solves


def _predictions(model: dict, grid: dict, seed: int = 1) -> list[tuple[dict, object]]:
    sweep = build_sweep({"sweep": "s", "seed": seed, "model": model, "grid": grid, "dynamics": NO_ESCAPE_SOLVE})
    return [(p.params, predict(models.make_problem(p.params), p.params)) for p in sweep.points]


def test_kramers_on_the_double_well_only_without_momentum_and_with_gaussian_noise():
    """μ = 0, gaussian: Kramers' τ = 2π/√(k_a k_b) exp(ΔL/T)/λ, T = λσ²/(2S), written out here;
    μ = 0.3 or Student-t noise: absent, with the reason."""
    for params, pred in _predictions(WELL, {"lr": 0.346, "batch_size": 3, "momentum": [0.0, 0.3],
                                            "noise": ["gaussian", "student_t"]}):
        mu, noise = params["momentum"], params["noise"]
        why = pred.reasons.get("escape_time_arrhenius", "")
        if mu == 0 and noise == "gaussian":
            temp = 0.346 * 1.3**2 / (2 * 3)
            tau = 2 * math.pi / math.sqrt(2.6 * 0.9) * math.exp(0.35 / temp) / 0.346
            assert math.isclose(pred.escape_time_arrhenius, tau, rel_tol=1e-12) and not why
        else:
            assert pred.escape_time_arrhenius is None, params
            assert ("momentum 0.3" in why) if mu else ("student_t" in why and "heavy-tailed" in why), why
        assert pred.escape_time_powerlaw is None and "additive noise" in pred.reasons["escape_time_powerlaw"]


def _hessian(problem, w: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """Central second differences of the loss, written out here."""
    e = np.eye(2) * h
    f = lambda v: float(problem.loss(np.asarray(v, float)[None])[0])
    return np.array([[(f(w + e[i] + e[j]) - f(w + e[i] - e[j]) - f(w - e[i] + e[j]) + f(w - e[i] - e[j]))
                      / (4 * h * h) for j in range(2)] for i in range(2)])


def test_thesis_landscape_laws_by_noise_type_and_momentum():
    """gaussian (isotropic, constant): Eyring–Kramers with T = λ·tr(C)/(2d), halved (the escape
    criterion is the saddle's separatrix); minibatch and gaussian_matched (state-dependent C(w)):
    the power law only; student_t: neither; any momentum: neither."""
    preds = _predictions({"kind": "landscape", "landscape": "thesis"},
                         {"lr": 3.2e-3, "batch_size": 2, "momentum": [0.0, 0.5],
                          "noise": ["gaussian", "student_t", "minibatch", "gaussian_matched"]}, seed=5)
    for params, pred in preds:
        mu, noise = params["momentum"], params["noise"]
        why_k = pred.reasons.get("escape_time_arrhenius", "")
        why_p = pred.reasons.get("escape_time_powerlaw", "")
        if mu:
            assert pred.escape_time_arrhenius is None and pred.escape_time_powerlaw is None
            assert "momentum 0.5" in why_k and "momentum 0.5" in why_p
            continue
        if noise == "gaussian":
            problem = models.make_problem(params)
            h_a = np.linalg.eigvalsh(_hessian(problem, problem.w_min))
            h_b = np.linalg.eigvalsh(_hessian(problem, problem.saddle_point))
            temp = 3.2e-3 * problem.gaussian_noise_var(2) / 2
            tau = (2 * math.pi / -h_b[0] * math.sqrt(-h_b[0] * h_b[1] / (h_a[0] * h_a[1]))
                   * math.exp(problem.barrier / temp))
            kramers = pred.escape_time_arrhenius
            assert math.isclose(kramers, 0.5 * tau / 3.2e-3, rel_tol=1e-4), kramers
            assert pred.escape_time_powerlaw is None and "gaussian is not" in why_p
        else:
            assert pred.escape_time_arrhenius is None and noise in why_k, why_k
            assert (pred.escape_time_powerlaw is not None) == (noise != "student_t"), (noise, why_p)


def test_missing_because_is_per_point_and_the_fit_compares_only_where_a_law_holds(tmp_path):
    """A short double-well sweep over momentum and noise: ``missing_because`` holds each point's
    reason (empty where the column has a value); the escape fit of a group where Kramers does not
    hold compares nothing with it and its verdict is not a failure."""
    sweep = build_sweep({"sweep": "w", "results_dir": str(tmp_path), "model": WELL,
                         "dynamics": {"steps": 400, "replicas": 4, "burn_in": 0},
                         "grid": {"lr": 0.346, "batch_size": 3, "momentum": [0.0, 0.3],
                                  "noise": ["gaussian", "student_t"]}})
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 4):
        simulate_points(batch, str(files.points_dir))
    write_ensemble(build_ensemble(json.loads(files.sweep_spec.read_text())), files.ensemble)
    ds = xr.open_zarr(files.ensemble).load()
    why = ds["missing_because"].sel(theory_column="escape_time_theory_arrhenius").values
    kramers = ds["escape_time_theory_arrhenius"].values
    for i, (mu, noise) in enumerate(zip(ds["momentum"].values, ds["noise"].values)):
        if mu == 0 and noise == "gaussian":
            assert why[i] == "" and np.isfinite(kramers[i])
        else:
            assert np.isnan(kramers[i]) and ("momentum 0.3" in why[i] if mu else "student_t" in why[i]), why[i]
    exact = ds["missing_because"].sel(theory_column="escape_time_theory_exact").values
    assert all(("momentum" in w) == bool(mu) for w, mu in zip(exact, ds["momentum"].values))  # μ = 0 only

    lr, tau = np.array([0.3, 0.35, 0.4]), np.array([400.0, 200.0, 120.0])
    absent = "Kramers' law is for SGD without momentum"
    res = fit_escape(lr, tau, tau / 10, theory_arrhenius=np.full(3, np.nan), theory_powerlaw=None,
                     theory_missing={"arrhenius": absent})
    slope = res["params"]["slope"]
    assert slope["theory"] is None and slope["theory_inside"] is None and res["supported_laws"] == []
    assert res["laws_absent"]["arrhenius"] == absent and "powerlaw" in res["laws_absent"]
    verdict = judge("escape", {**res, "group": {"momentum": 0.3}})
    assert verdict.status == "neutral" and "not compared" in " ".join(verdict.sentences), verdict


def test_eyring_kramers_reduces_to_kramers_and_refuses_a_saddle_without_one_unstable_direction():
    """d = 1: Kramers' 2π/√(k_a k_b)·e^(ΔL/T); a second, stable direction with the same curvature
    at the minimum and the saddle changes nothing; the saddle needs exactly one negative curvature."""
    import pytest

    from sgdsweep.theory.escape import eyring_kramers_time, kramers_time

    assert eyring_kramers_time(1.0, [2.0], [-0.5], 0.2) == pytest.approx(kramers_time(1.0, 2.0, -0.5, 0.2))
    assert eyring_kramers_time(1.0, [2.0, 7.0], [-0.5, 7.0], 0.2) == pytest.approx(kramers_time(1.0, 2.0, -0.5, 0.2))
    # a softer stable direction at the saddle: a wider channel, faster escape by √(k_s/k_m)
    assert eyring_kramers_time(1.0, [2.0, 4.0], [-0.5, 1.0], 0.2) == pytest.approx(
        kramers_time(1.0, 2.0, -0.5, 0.2) * math.sqrt(1.0 / 4.0))
    for saddle in ([0.5, 1.0], [-0.5, -1.0]):
        with pytest.raises(ValueError, match="exactly one negative"):
            eyring_kramers_time(1.0, [2.0, 4.0], saddle, 0.2)
