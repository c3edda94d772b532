"""Power-law fits recover known exponents and say when the theory lies outside."""

from __future__ import annotations

import numpy as np
import xarray as xr

from sgdsweep.fit import fit_ensemble, fit_power_law


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
    for name in hits:
        assert 0.89 <= hits[name] / n_trials <= 0.99, hits


def test_estimates_are_accurate():
    lr, s, y, se, _ = _synthetic(a=1.0, b=-1.0, rel_se=0.001, seed=1)
    res = fit_power_law(lr, s, y, se)
    assert abs(res["params"]["a"]["estimate"] - 1.0) < 0.005
    assert abs(res["params"]["b"]["estimate"] + 1.0) < 0.005
    assert abs(np.exp(res["params"]["log_A"]["estimate"]) - 0.3) < 0.005
    assert res["dof"] == 13 and res["n_points"] == 16


def test_theory_outside_interval_is_reported():
    lr, s, y, se, truth = _synthetic(a=1.0, b=-1.0, rel_se=0.002, seed=2)
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
    (res,) = fit_ensemble(ds, {"power_law": {"enabled": True, "confidence": 0.95}})["power_law"]
    assert res["n_points"] == 15 and res["excluded_diverged"] == 1
    assert res["params"]["a"]["theory_inside"] and res["params"]["b"]["theory_inside"]
    assert fit_ensemble(ds, {"power_law": {"enabled": False}}) == {}


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
    res = fit_ensemble(ds, {"power_law": {"enabled": True, "confidence": 0.95}})["power_law"]
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
