"""Power-law fits recover known exponents and say when the theory lies outside."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from scipy import stats

from sgdsweep.analysis.fit import fit_ensemble, fit_power_law


def _synthetic(a=1.0, b=-1.0, amp=0.3, rel_se=0.01, seed=0):
    rng = np.random.default_rng(seed)
    lr, s = np.meshgrid([0.05, 0.1, 0.2, 0.4], [2, 4, 8, 16], indexing="ij")
    lr, s = lr.ravel(), s.ravel().astype(float)
    truth = amp * lr**a * s**b
    se = rel_se * truth
    return lr, s, truth * (1 + rel_se * rng.standard_normal(lr.size)), se, truth


def test_recovers_known_exponents_with_calibrated_intervals():
    hits = {"a": 0, "b": 0}
    n_trials = 200
    for seed in range(n_trials):
        lr, s, y, se, truth = _synthetic(a=0.8, b=-1.2, seed=seed)
        res = fit_power_law(lr, s, y, se, theory=truth)
        for name, true in (("a", 0.8), ("b", -1.2)):
            p = res["params"][name]
            lo, hi = p["interval"]
            hits[name] += lo <= true <= hi
            assert abs(p["theory"] - true) < 1e-12  # the fit of exact data returns the exponent
    # 95% intervals: coverage within binomial noise (sd ≈ 1.5%) of 95%
    for count in hits.values():
        assert 0.89 <= count / n_trials <= 0.99, hits


def test_estimates_are_accurate():
    lr, s, y, se, _ = _synthetic(a=1.0, b=-1.0, rel_se=0.001, seed=1)
    res = fit_power_law(lr, s, y, se)
    assert abs(res["params"]["a"]["estimate"] - 1.0) < 0.005
    assert abs(res["params"]["b"]["estimate"] + 1.0) < 0.005
    assert abs(np.exp(res["params"]["log_A"]["estimate"]) - 0.3) < 0.005
    assert res["dof"] == 13 and res["n_points"] == 16


def test_theory_outside_interval_is_reported():
    lr, s, y, se, _ = _synthetic(a=1.0, b=-1.0, rel_se=0.002, seed=2)
    wrong_theory = 0.3 * lr**1.2 * s**-1.0  # a theory predicting a = 1.2
    res = fit_power_law(lr, s, y, se, theory=wrong_theory)
    assert res["params"]["a"]["theory_inside"] is False
    assert abs(res["params"]["a"]["theory"] - 1.2) < 1e-9
    assert res["params"]["b"]["theory_inside"] is True


def test_misspecified_model_widens_intervals():
    lr, s, y, se, _ = _synthetic(rel_se=0.001, seed=3)
    curved = y * (1 + 0.2 * lr)  # not a power law in lr
    tight = fit_power_law(lr, s, y, se)
    wide = fit_power_law(lr, s, curved, se)
    assert wide["chi2_reduced"] > 10
    assert wide["params"]["a"]["stderr"] > 3 * tight["params"]["a"]["stderr"]
    # the goodness of fit is the upper tail P(χ²_dof ≥ χ²): tiny for the wrong model
    assert wide["chi2_pvalue"] < 1e-100
    dof = tight["dof"]
    assert tight["chi2_pvalue"] == pytest.approx(stats.chi2.sf(tight["chi2_reduced"] * dof, dof), rel=1e-12)
    assert tight["chi2_pvalue"] > 1e-3


def test_single_valued_axis_and_too_few_points():
    lr = np.array([0.1, 0.2, 0.4])
    res = fit_power_law(lr, np.full(3, 4.0), 0.1 * lr, 0.001 * lr)
    assert res["params"]["b"] is None and abs(res["params"]["a"]["estimate"] - 1) < 1e-9
    res = fit_power_law(lr[:1], np.array([4.0]), np.array([0.1]), np.array([0.01]))
    assert "nothing to fit" in res["error"]


def test_fit_ensemble_excludes_diverged_points():
    lr, s, y, se, truth = _synthetic(seed=4)
    diverged = np.zeros(lr.size, bool)
    diverged[-1] = True
    y = y.copy()
    y[-1] = 1e6  # garbage that must not enter the fit
    ds = xr.Dataset({"weight_var": ("point", y), "weight_var_se": ("point", se),
                     "weight_var_theory": ("point", truth), "diverged": ("point", diverged)},
                    coords={"lr": ("point", lr), "batch_size": ("point", s)},
                    attrs={"swept_axes": '["lr", "batch_size"]'})
    (res,) = fit_ensemble(ds, {"power_law": {"enabled": True}, "confidence": 0.95})["power_law"]
    assert res["n_points"] == 15 and res["excluded_diverged"] == 1
    assert res["params"]["a"]["theory_inside"] and res["params"]["b"]["theory_inside"]
    assert "power_law" not in fit_ensemble(ds, {"power_law": {"enabled": False}})


def test_fit_ensemble_fits_each_group_of_the_other_axes():
    """Points at different momenta obey different amplitudes: they are fitted separately."""
    parts = []
    for mu, amp in ((0.0, 0.3), (0.5, 0.6)):
        lr, s, y, se, truth = _synthetic(amp=amp, seed=int(mu * 10))
        parts.append((lr, s, y, se, truth, np.full(lr.size, mu)))
    cat = [np.concatenate(x) for x in zip(*parts)]
    ds = xr.Dataset({"weight_var": ("point", cat[2]), "weight_var_se": ("point", cat[3]),
                     "weight_var_theory": ("point", cat[4]), "diverged": ("point", np.zeros(32, bool))},
                    coords={"lr": ("point", cat[0]), "batch_size": ("point", cat[1]), "momentum": ("point", cat[5])},
                    attrs={"swept_axes": '["lr", "batch_size", "momentum"]'})
    res = fit_ensemble(ds, {"power_law": {"enabled": True}, "confidence": 0.95})["power_law"]
    assert [r["group"] for r in res] == [{"momentum": 0.0}, {"momentum": 0.5}]
    for r, amp in zip(res, (0.3, 0.6)):
        q = r["params"]["log_A"]
        assert abs(q["estimate"] - np.log(amp)) < 4 * q["stderr"]
        for name in ("a", "b"):  # within 4 standard errors (a 95% interval misses 1 time in 20)
            q = r["params"][name]
            assert abs(q["estimate"] - q["theory"]) < 4 * q["stderr"]


def test_models_without_theory_are_still_fitted():
    """A model without a theory column (all NaN) fits the measurements; theory values are None."""
    lr, s, y, se, _ = _synthetic(a=1.0, b=-1.0, rel_se=0.001, seed=2)
    res = fit_power_law(lr, s, y, se, theory=np.full(lr.size, np.nan))
    assert res["n_points"] == lr.size and abs(res["params"]["a"]["estimate"] - 1.0) < 0.005
    assert res["params"]["a"]["theory"] is None and res["params"]["a"]["theory_inside"] is None


# --- bootstrap over replicas -------------------------------------------------------------------------------

def _replica_data(a=1.0, b=-1.0, amp=0.3, replicas=32, rel_sd=0.1, seed=0, lrs=(0.05, 0.1, 0.2, 0.4),
                  sizes=(2, 4, 8, 16)):
    """Per-replica values around amp·λ^a·S^b with relative scatter rel_sd (gamma, positive)."""
    rng = np.random.default_rng(seed)
    lr, s = np.meshgrid(lrs, sizes, indexing="ij")
    lr, s = lr.ravel(), s.ravel().astype(float)
    truth = amp * lr**a * s**b
    shape = 1 / rel_sd**2
    reps = truth[:, None] * rng.gamma(shape, 1 / shape, size=(lr.size, replicas))
    mean = reps.mean(axis=1)
    se = reps.std(axis=1, ddof=1) / np.sqrt(replicas)
    return lr, s, mean, se, truth, reps


def test_bootstrap_intervals_cover_the_true_exponents():
    """Bootstrap-over-replicas intervals have ≈ 95 % coverage (binomial sd ≈ 2.2 % at 100 trials)."""
    hits, widths = {"a": 0, "b": 0}, []
    for seed in range(100):
        lr, s, y, se, truth, reps = _replica_data(a=0.9, b=-1.1, seed=seed)
        res = fit_power_law(lr, s, y, se, theory=truth, replicas=reps, bootstrap=200,
                            rng=np.random.default_rng(seed))
        for name, true in (("a", 0.9), ("b", -1.1)):
            p = res["params"][name]
            assert p["interval_method"] == "bootstrap"
            hits[name] += p["interval"][0] <= true <= p["interval"][1]
            assert p["theory_inside"] == (p["interval"][0] <= true <= p["interval"][1])
        widths.append(res["params"]["a"]["stderr"] / (res["params"]["a"]["interval_analytic"][1]
                                                      - res["params"]["a"]["interval_analytic"][0]) * 4)
    for count in hits.values():
        assert 0.88 <= count / 100 <= 1.0, hits
    # bootstrap and analytic standard errors agree for a well-specified model (ratio ≈ 1)
    assert 0.7 < np.median(widths) < 1.3


# --- collapse ------------------------------------------------------------------------------------------------

def test_perfect_collapse_has_spread_consistent_with_zero_and_a_broken_one_does_not():
    from sgdsweep.analysis.fit import fit_collapse

    inside, estimates = 0, []
    for seed in range(40):
        lr, s, y, se, truth, _reps = _replica_data(a=1.0, b=-1.0, seed=seed)  # a function of λ/S only
        res = fit_collapse(lr / s, y, se, truth)
        p = res["params"]["spread2"]
        assert res["n_classes"] == 5 and abs(p["theory"]) < 1e-20 and p["leading_order"] == 0.0
        inside += p["theory_inside"]
        estimates.append(p["estimate"])
    assert inside >= 34  # ≈ 95 % of 40
    # the noise correction makes Δ² unbiased: its mean over 40 data sets is 0 within 3 SE (without
    # the correction it would sit at the noise variance (se/value)² ≈ 3e-4, > 10 SE away)
    estimates = np.array(estimates)
    assert abs(estimates.mean()) < 3 * estimates.std(ddof=1) / np.sqrt(40), estimates.mean()
    # a = 1.3, b = −1: points at equal λ/S differ by (λ ratio)^0.3 — a spread of several percent
    lr, s, y, se, truth, _reps = _replica_data(a=1.3, b=-1.0, seed=1)
    res = fit_collapse(lr / s, y, se, np.full(lr.size, 0.3) * lr / s)
    p = res["params"]["spread2"]
    true_spread2 = fit_collapse(lr / s, truth, truth * 1e-9, None)["params"]["spread2"]["estimate"]
    assert p["theory_inside"] is False and p["interval"][0] > 0
    assert abs(p["estimate"] - true_spread2) < 4 * p["stderr"]
    assert 0.1 < res["relative_spread"] < 0.4


def test_collapse_without_shared_values_is_an_error_not_a_number():
    from sgdsweep.analysis.fit import fit_collapse

    res = fit_collapse(np.array([0.1, 0.2, 0.3]), np.ones(3), np.full(3, 0.01))
    assert "no two usable points" in res["error"] and "params" not in res


# --- escape --------------------------------------------------------------------------------------------------

def _escape_data(slope=0.5, intercept=2.0, lrs=(0.05, 0.0625, 0.08, 0.1), replicas=400, cap_factor=4.0, seed=0):
    """Exponential escape times with ln(λτ) = intercept + slope/λ, censored at cap_factor·τ."""
    rng = np.random.default_rng(seed)
    lr = np.asarray(lrs)
    tau_true = np.exp(intercept + slope / lr) / lr
    raw = rng.exponential(tau_true[:, None], size=(lr.size, replicas))
    cap = cap_factor * tau_true[:, None]
    escaped = raw < cap
    times = np.where(escaped, raw, cap)
    tau = times.sum(axis=1) / escaped.sum(axis=1)
    return lr, tau, tau / np.sqrt(escaped.sum(axis=1)), tau_true, times, escaped


def test_escape_fit_recovers_slope_and_names_the_supported_law():
    from sgdsweep.analysis.fit import fit_escape

    lr, tau, se, tau_true, times, escaped = _escape_data()
    wrong = np.exp(0.8 / lr) / lr  # a power law with a different slope
    res = fit_escape(lr, tau, se, theory_arrhenius=tau_true, theory_powerlaw=wrong, times=times, escaped=escaped,
                     bootstrap=300, rng=np.random.default_rng(0))
    slope = res["params"]["slope"]
    assert slope["interval_method"] == "bootstrap"
    assert abs(slope["estimate"] - 0.5) < 4 * slope["stderr"]
    assert abs(slope["theory"] - 0.5) < 1e-9 and abs(slope["theory_powerlaw"] - 0.8) < 1e-9
    assert res["supported_laws"] == ["arrhenius"] and slope["theory_powerlaw_inside"] is False
    assert abs(res["params"]["intercept"]["estimate"] - 2.0) < 4 * res["params"]["intercept"]["stderr"]


def test_escape_fit_bootstrap_matches_analytic_errors_and_excludes_points_without_escapes():
    from sgdsweep.analysis.fit import fit_escape

    lr, tau, se, tau_true, times, escaped = _escape_data(seed=3)
    boot = fit_escape(lr, tau, se, times=times, escaped=escaped, bootstrap=400)
    analytic = fit_escape(lr, tau, se)
    ratio = boot["params"]["slope"]["stderr"] / analytic["params"]["slope"]["stderr"]
    assert 0.6 < ratio < 1.6, ratio
    tau2 = tau.copy()
    tau2[0] = np.inf  # nobody escaped at the smallest lr
    res = fit_escape(lr, tau2, se, theory_arrhenius=tau_true)
    assert res["n_points"] == 3 and res["excluded_points"] == 1


# --- wigner and flatness -------------------------------------------------------------------------------------

def _pair_ensemble(sigmas, replicas=3000, centre=4.0, seed=0):
    """Singular values whose squares are the eigenvalues of centre·I + σ·GOE(2) (β = 1 pair)."""
    rng = np.random.default_rng(seed)
    sv = []
    for sig in sigmas:
        a = rng.normal(0, sig, (replicas, 2))
        b = rng.normal(0, sig / np.sqrt(2), replicas)
        mats = np.zeros((replicas, 2, 2))
        mats[:, 0, 0], mats[:, 1, 1] = centre + a[:, 0], centre + a[:, 1]
        mats[:, 0, 1] = mats[:, 1, 0] = b
        x = np.sort(np.linalg.eigvalsh(mats), axis=1)[:, ::-1]
        sv.append(np.sqrt(x))
    return np.stack(sv)


def test_wigner_fit_accepts_a_pair_and_rejects_independent_eigenvalues():
    lr = np.array([0.1, 0.2, 0.1, 0.2])
    s = np.array([4.0, 4.0, 8.0, 8.0])
    sigma = 0.05 * np.sqrt(lr / s / 0.025)  # σ² ∝ λ/S
    sv = _pair_ensemble(sigma)
    ds = xr.Dataset({"singular_values_W": (("point", "replica", "sv_W"), sv),
                     "diverged": ("point", np.zeros(4, bool))},
                    coords={"point": ["p0", "p1", "p2", "p3"], "lr": ("point", lr), "batch_size": ("point", s)},
                    attrs={"swept_axes": '["lr", "batch_size"]'})
    fits = fit_ensemble(ds, {"confidence": 0.95, "bootstrap": 200, "wigner": {"pair": [0, 1]}})
    assert "power_law" not in fits and "power_law" in fits["skipped"]
    for res, sig in zip(fits["wigner"], sigma):
        b = res["params"]["binder"]
        assert b["theory_inside"], b
        assert abs(res["params"]["sigma"]["estimate"] - sig) < 4 * res["params"]["sigma"]["stderr"]
        assert res["wigner_consistent"]
    (width,) = fits["wigner_width"]
    for name, true in (("a", 1.0), ("b", -1.0)):
        p = width["params"][name]
        assert abs(p["estimate"] - true) < 4 * p["stderr"] and p["theory"] == true
    # two independent Gaussian eigenvalues: Binder ≈ 0, spacings Poisson-like — both rejected
    rng = np.random.default_rng(5)
    x = 4.0 + 0.1 * rng.standard_normal((1, 3000, 2))
    ds2 = ds.isel(point=[0]).assign(singular_values_W=(("point", "replica", "sv_W"), np.sqrt(x)))
    (res,) = fit_ensemble(ds2, {"confidence": 0.95, "bootstrap": 200})["wigner"]
    assert res["params"]["binder"]["theory_inside"] is False and not res["wigner_consistent"]


def test_flatness_exponent_recovers_psi_and_flags_a_wrong_theory():
    from sgdsweep.analysis.fit.spectra import flatness_exponent

    rng = np.random.default_rng(0)
    curv = np.geomspace(0.01, 1.0, 12)
    var = 3e-3 * curv * np.exp(0.05 * rng.standard_normal(12))  # variance ∝ curvature: ψ = 2
    res = flatness_exponent(var, curv, theory_variance=3e-3 * curv, leading_order=2.0)
    psi = res["params"]["psi"]
    assert abs(psi["estimate"] - 2.0) < 4 * psi["stderr"] and psi["theory_inside"] and abs(psi["theory"] - 2) < 1e-9
    flat = flatness_exponent(3e-3 * np.exp(0.05 * rng.standard_normal(12)), curv, theory_variance=3e-3 * curv)
    assert flat["params"]["psi"]["theory_inside"] is False and abs(flat["params"]["psi"]["estimate"]) < 0.2
    assert "need 3" in flatness_exponent(np.ones(2), np.ones(2))["error"]


def test_flatness_leaves_out_modes_below_the_numerical_floor_and_says_so():
    """Clean modes with variance ∝ curvature (ψ = 2) plus one round-off mode (variance 1e-18,
    curvature 1e-6, as a direction projected out of a covariance leaves): the mode is excluded
    and counted, ψ is the clean modes' ψ, and the verdict says so; when fewer than three modes
    remain the fit is not made and its verdict is not good."""
    from sgdsweep.analysis.fit.spectra import flatness_exponent
    from sgdsweep.analysis.fit.verdict import judge

    rng = np.random.default_rng(3)
    curv = np.geomspace(0.05, 1.0, 5)
    var = 2e-4 * curv * np.exp(0.05 * rng.standard_normal(5))
    clean = flatness_exponent(var, curv, leading_order=2.0)
    res = flatness_exponent(np.append(var, 1e-18), np.append(curv, 1e-6), leading_order=2.0)
    assert res["excluded_modes"] == 1 and res["n_modes"] == 5 and clean["excluded_modes"] == 0
    assert res["params"]["psi"] == clean["params"]["psi"]  # the round-off mode has no weight at all
    assert abs(res["params"]["psi"]["estimate"] - 2) < 4 * res["params"]["psi"]["stderr"]
    verdict = judge("flatness", {**res, "group": {}})
    assert "1 mode(s) below the numerical floor" in " ".join(verdict.sentences), verdict
    few = flatness_exponent(np.array([2e-4, 1e-4, 1e-18, 1e-19]), np.array([1.0, 0.5, 1e-6, 1e-7]))
    assert "params" not in few and "2 more below the numerical floor" in few["error"], few
    assert judge("flatness", {**few, "group": {}}).status == "neutral"


def test_two_layer_flatness_at_hidden_width_6_leaves_out_the_projected_mode(tmp_path):
    """config/models/two_layer.yaml at N_h = 6 (> its 4 inputs), λ = 0.04, shortened: W2's
    covariance, projected on the Hessian's range, has two modes at variance ±1e-19 (curvature
    ~1e-6; the theory's are 0), one of which alone pulled ψ to ~5.8; without them ψ is near the
    exact theory's. Both are left out and counted, whatever sign round-off gave them on this
    machine (on one CPU both came out negative, on another one positive)."""
    import json
    from pathlib import Path

    import yaml

    from sgdsweep.analysis.fit.spectra import fit_flatness
    from sgdsweep.run.execute import make_batches
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store.aggregate import build_ensemble
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    with open(Path(__file__).parents[2] / "config" / "models" / "two_layer.yaml") as fh:
        cfg = yaml.safe_load(fh)
    cfg["results_dir"] = str(tmp_path)
    cfg["grid"].update(hidden_width=6, lr=0.04)
    cfg["dynamics"].update(steps=12000, replicas=8)
    sweep = build_sweep(cfg)
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 4):
        simulate_points(batch, str(files.points_dir))
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    assert np.nanmin(np.abs(ds["layer_cov_eigenvalues_W2"].values)) < 1e-15  # the round-off mode is there
    (res,) = fit_flatness(ds, {}, np.zeros(1, bool), 0.95)
    psi = res["params"]["psi"]
    assert res["excluded_modes"] == 2 and res["n_modes"] == 4, res
    assert psi["estimate"] < 3 and abs(psi["estimate"] - psi["theory"]) < 4 * psi["stderr"], psi


def test_flatness_theory_uses_its_own_curvatures():
    """A single layer: the theory ψ is fitted along the theory's own modes (its curvatures), not at
    the measured modes' curvatures."""
    from sgdsweep.analysis.fit.spectra import flatness_exponent

    curv = np.geomspace(0.1, 1.0, 8)
    measured = 1e-3 * np.ones(8) * np.exp(0.01 * (np.arange(8) % 3))
    theory_var = 1e-3 * np.geomspace(1.0, 2.0, 8)
    res = flatness_exponent(measured, curv, theory_variance=theory_var, leading_order=0.0,
                            theory_curvature=np.full(8, 0.5) * np.geomspace(1.0, 4.0, 8))
    assert abs(res["params"]["psi"]["theory"] - 2 * np.log(2) / np.log(4)) < 1e-9  # ψ/2 = ln 2/ln 4
    assert res["curvature_spread"] == pytest.approx(10.0) and res["variance_spread"] < 1.03


def test_flatness_line_is_scipy_linregress():
    """The per-point line fit of ψ gives what scipy.stats.linregress gives (slope, its standard
    error, r), including an exact line (r = ±1)."""
    from scipy import stats

    from sgdsweep.analysis.fit.spectra import _line

    rng = np.random.default_rng(7)
    for x, y in [(rng.standard_normal(n), rng.standard_normal(n)) for n in (3, 8, 40)] + [
            (np.arange(5.0), 2.0 - 3.0 * np.arange(5.0))]:
        ref = stats.linregress(x, y)
        np.testing.assert_allclose(_line(x, y), (ref.slope, ref.stderr, ref.rvalue), rtol=1e-12, atol=1e-15)


# --- verdicts: the goodness of fit in words --------------------------------------------------------------

def test_verdict_says_whether_the_deviations_from_a_power_law_are_those_of_the_exact_theory():
    """A curved law (not a power law): with the exact theory the measurements follow, the rejected
    power law is explained (good); with a pure power law as the theory it is not (bad); without a
    theory it is a note, never a pass."""
    from sgdsweep.analysis.fit import verdicts
    from sgdsweep.analysis.fit.verdict import judge

    lr, s, _, se, truth = _synthetic(rel_se=0.002, seed=5)
    exact = truth * (1 + 2 * lr)
    y = exact * (1 + 0.002 * np.random.default_rng(6).standard_normal(lr.size))
    explained = fit_power_law(lr, s, y, 0.002 * exact, theory=exact)
    assert explained["chi2_pvalue"] < 1e-6 and explained["agreement_pvalue"] > 0.01
    v = judge("power_law", explained)
    assert v.status == "good" and "the deviations are those of the exact theory" in v.text()
    assert "a pure power law is rejected" in v.text()
    wrong = judge("power_law", fit_power_law(lr, s, y, 0.002 * exact, theory=truth))
    assert wrong.status == "bad" and "the measurements deviate from the exact theory" in wrong.text()
    alone = judge("power_law", fit_power_law(lr, s, y, 0.002 * exact))
    assert alone.status == "neutral" and "not of an exact law" in alone.text()
    fits_ok = judge("power_law", fit_power_law(lr, s, truth * (1 + 0.002 * np.random.default_rng(7).standard_normal(
        lr.size)), se, theory=truth))
    assert fits_ok.status == "good" and "a pure power law fits" in fits_ok.text()
    lines = verdicts({"power_law": [{**explained, "group": {}}], "skipped": {"escape": "no escape times"}})
    assert lines[0].startswith("[ok] Power law") and lines[-1] == "[not run] Escape time: ln(λτ) against 1/λ: " \
        "no escape times"


def _single_layer(n_points: int = 3, modes: int = 6) -> xr.Dataset:
    """A single-layer ensemble with per-mode variances and curvatures (what flatness fits)."""
    rng = np.random.default_rng(0)
    curv = np.geomspace(0.1, 10, modes)[None, :] * (1 + 0.05 * rng.random((n_points, modes)))
    var = 1e-3 * np.ones((n_points, modes)) * (1 + 0.05 * rng.random((n_points, modes)))
    return xr.Dataset({"weight_cov_eigenvalues": (("point", "mode"), var), "mode_curvature": (("point", "mode"), curv),
                       "diverged": ("point", np.zeros(n_points, bool))},
                      coords={"point": [f"p{i}" for i in range(n_points)], "lr": ("point", [0.1, 0.2, 0.4][:n_points]),
                              "batch_size": ("point", np.full(n_points, 4))},
                      attrs={"swept_axes": '["lr"]'})


def test_flatness_runs_on_a_single_layer_model_only_when_asked_for():
    from sgdsweep.analysis.fit import SINGLE_LAYER_FLATNESS

    off = {"power_law": {"enabled": False}, "linear_scaling": {"enabled": False}, "wigner": {"enabled": False}}
    default = fit_ensemble(_single_layer(), {**off, "flatness": {"enabled": True, "layer": None}})
    assert "flatness" not in default and default["skipped"]["flatness"] == SINGLE_LAYER_FLATNESS
    asked = fit_ensemble(_single_layer(), {**off, "flatness": {"enabled": True, "layer": "all"}})
    assert len(asked["flatness"]) == 3 and all("params" in r for r in asked["flatness"])


def test_escape_verdict_is_decided_by_the_exact_chain_not_by_the_approximate_laws():
    """Kramers' slope outside the interval is a statement about an approximation (neutral wording,
    no "disagrees"); the exact discrete chain's slope decides good or bad."""
    from sgdsweep.analysis.fit.common import parameter
    from sgdsweep.analysis.fit.verdict import judge

    def result(exact_theory):
        slope = parameter(2.0, 0.05, 0.95, "bootstrap", theory=2.5)  # Kramers 10 SE away
        slope.update(theory_powerlaw=None, theory_powerlaw_inside=None)
        params = {"slope": slope, "intercept": parameter(1.0, 0.1, 0.95, "bootstrap")}
        if exact_theory is not None:
            params["slope_exact"] = parameter(2.0, 0.05, 0.95, "bootstrap", theory=exact_theory)
        return {"group": {}, "params": params, "supported_laws": [], "laws_absent": {"powerlaw": "no power law"}}

    agree = judge("escape", result(2.03))
    assert agree.status == "good" and "exact discrete chain 2.03 (inside)" in agree.text()
    assert "Kramers slope 2.5 (outside)" in agree.text() and "DISAGREES" not in agree.text()
    assert judge("escape", result(2.5)).status == "bad"
    assert judge("escape", result(None)).status == "neutral"  # only approximations to compare with


def test_a_verdict_not_agreeing_names_the_points_whose_burn_in_is_short():
    """Each group of a stationary fit counts its points with a burn-in under SHORT_BURN_IN
    relaxation times; a verdict that does not agree says so (one group, and the summary of many),
    one that agrees does not; the report's headline notes them with the shortest and where it is.
    An ensemble without ``burn_in_relaxations`` (written before it was stored) counts none."""
    from sgdsweep.analysis.fit import assess
    from sgdsweep.analysis.headline import headline
    from sgdsweep.models.base import SHORT_BURN_IN

    lr, s, y, se, truth = _synthetic(seed=4)
    relaxations = np.full(lr.size, 10.0)
    relaxations[:3] = [0.2, 3.9, SHORT_BURN_IN]  # two short (strictly under the bound)

    def ensemble(values: np.ndarray, mu: np.ndarray | None = None) -> xr.Dataset:
        coords = {"point": [f"p{i}" for i in range(values.size)], "lr": ("point", lr), "batch_size": ("point", s)}
        axes = ["lr", "batch_size"]
        if mu is not None:
            coords["momentum"], axes = ("point", mu), [*axes, "momentum"]
        return xr.Dataset({"weight_var": ("point", values), "weight_var_se": ("point", se),
                           "weight_var_theory": ("point", truth), "diverged": ("point", np.zeros(lr.size, bool)),
                           "burn_in_relaxations": ("point", relaxations)},
                          coords=coords, attrs={"swept_axes": json.dumps(axes)})

    conf = {"power_law": {"enabled": True}, "confidence": 0.95}
    agreeing = fit_ensemble(ensemble(y), conf)
    (res,) = agreeing["power_law"]
    assert res["short_burn_in"] == 2
    (good,) = [v for v in assess(agreeing) if v.fit == "power_law"]
    assert good.status == "good" and "burn-in" not in good.text()
    lifted = y * np.where(np.arange(lr.size) < 3, 3.0, 1.0)  # the short points far above the theory
    (bad,) = [v for v in assess(fit_ensemble(ensemble(lifted), conf)) if v.fit == "power_law"]
    assert bad.status == "bad" and f"2 of its points have a burn-in under {SHORT_BURN_IN:g} slowest relaxation " \
        "times" in bad.text()
    many = fit_ensemble(ensemble(lifted, mu=np.arange(lr.size) % 4 * 0.1), conf)
    assert len(many["power_law"]) == 4
    (summary,) = [v for v in assess(many) if v.fit == "power_law"]
    assert summary.status == "bad"
    assert "2 of the points of the groups that do not agree have a burn-in" in summary.text()
    head = headline("weight_var", ensemble(lifted), fit_ensemble(ensemble(lifted), conf), {})
    (note,) = [n for n in head.notes if "burn-in" in n]
    assert note.startswith(f"2 of {lr.size} points have a burn-in under 4 slowest relaxation times") and \
        f"the fewest 0.2 at λ = {lr[0]:g}" in note, note
    older = ensemble(lifted).drop_vars("burn_in_relaxations")
    assert "short_burn_in" not in fit_ensemble(older, conf)["power_law"][0]
    assert not [n for n in headline("weight_var", older, fit_ensemble(older, conf), {}).notes if "burn-in" in n]
