"""Edge cases of the report's family-wise decisions: every comparison the verdicts and the headline
call a disagreement is one the family decided, and each verdict reads as its numbers say."""

from __future__ import annotations

import json
import math

import numpy as np
import xarray as xr

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.verdict import judge

FIT = {"confidence": 0.95, "bootstrap": 200}


def _ensemble(scale: float = 1.0, replicas: int = 16, seed: int = 0) -> xr.Dataset:
    """Six points on λ ∈ {0.1, 0.2, 0.4} × S ∈ {2, 4} with exact theory λ/S and measurements
    ``scale`` times it (5 % SE per point)."""
    rng = np.random.default_rng(seed)
    lr = np.repeat([0.1, 0.2, 0.4], 2)
    bs = np.tile([2.0, 4.0], 3)
    theory = lr / bs
    reps = scale * theory[:, None] * (1 + 0.05 * math.sqrt(replicas) * rng.standard_normal((6, replicas)))
    return xr.Dataset({"weight_var": ("point", reps.mean(1)),
                       "weight_var_se": ("point", reps.std(1, ddof=1) / math.sqrt(replicas)),
                       "weight_var_theory": ("point", theory),
                       "weight_var_replica": (("point", "replica"), reps),
                       "diverged": ("point", np.zeros(6, bool))},
                      coords={"point": [f"p{i}" for i in range(6)], "lr": ("point", lr), "batch_size": ("point", bs)},
                      attrs={"swept_axes": json.dumps(["lr", "batch_size"])})


def test_a_power_law_that_fits_but_sits_off_the_exact_theory_disagrees_in_its_verdict():
    """Measurements 1.5 × the exact theory: exponents right, the power law fits, but the family
    rejects the point-by-point agreement: the verdict must say so, not "ok"."""
    fits = fit_ensemble(_ensemble(scale=1.5), dict(FIT))
    (res,) = fits["power_law"]
    assert res["chi2_pvalue"] > 0.05 and res["agreement_disagrees"]
    v = judge("power_law", res)
    assert v.status == "bad", v.text()
    assert "a pure power law fits" in v.text() and "deviate from the exact theory point by point" in v.text()
    assert "Holm-adjusted" in v.text()
    good = judge("power_law", fit_ensemble(_ensemble(), dict(FIT))["power_law"][0])
    assert good.status == "good" and "deviate" not in good.text()


def _pairs(lr: np.ndarray, s: np.ndarray, power: float, replicas: int = 1000) -> xr.Dataset:
    """Singular values of a degenerate pair (centre 4 + σ·GOE(2)) with σ² ∝ (λ/S)^power."""
    rng = np.random.default_rng(1)
    sigma = 0.05 * (lr / s / 0.025) ** (power / 2)
    sv = []
    for sig in sigma:
        mats = np.zeros((replicas, 2, 2))
        mats[:, 0, 0], mats[:, 1, 1] = 4.0 + rng.normal(0, sig, (2, replicas))
        mats[:, 0, 1] = mats[:, 1, 0] = rng.normal(0, sig / np.sqrt(2), replicas)
        sv.append(np.sqrt(np.sort(np.linalg.eigvalsh(mats), axis=1)[:, ::-1]))
    return xr.Dataset({"singular_values_W": (("point", "replica", "sv_W"), np.stack(sv)),
                       "diverged": ("point", np.zeros(lr.size, bool))},
                      coords={"point": [f"p{i}" for i in range(lr.size)], "lr": ("point", lr),
                              "batch_size": ("point", s)}, attrs={"swept_axes": '["lr", "batch_size"]'})


def test_the_pair_width_exponents_are_decided_by_the_family():
    """The pair width's a and b are compared with the linear scaling rule (1, −1): each carries
    the p-value of its interval and joins the family, so a wrong scaling is a decided disagreement
    and a right one is not (before, the theory was set without a p-value: "OUTSIDE", undecided)."""
    lr, s = np.array([0.1, 0.2, 0.1, 0.2, 0.4]), np.array([4.0, 4.0, 8.0, 8.0, 4.0])
    off = {"power_law": {"enabled": False}, "linear_scaling": {"enabled": False}, "flatness": {"enabled": False}}
    for power, wrong in ((1.0, False), (2.0, True)):
        fits = fit_ensemble(_pairs(lr, s, power), {**FIT, **off})
        (width,) = fits["wigner_width"]
        for name in ("a", "b"):
            q = width["params"][name]
            assert q["pvalue"] is not None and q["disagrees"] is wrong and "pvalue_holm" in q
            assert (q["pvalue"] >= 0.05) == q["theory_inside"]
        assert fits["family"]["comparisons"] == 2 * lr.size + 2
        v = judge("wigner_width", width)
        assert (v.status == "bad") is wrong and ("DISAGREES" in v.text()) is wrong, v.text()


def test_the_headline_leaves_out_diverged_points_as_the_fits_do():
    """A point with a diverged replica (its survivors biased 30 % high) is left out of the fits'
    point-by-point check; the headline must compare the same points and so state the family's
    decision, not judge the biased point by its own bound."""
    from sgdsweep.analysis.headline import headline

    ds = _ensemble()
    ds["diverged"].values[5] = True
    ds["weight_var"].values[5] *= 1.3
    fits = fit_ensemble(ds, dict(FIT))
    (check,) = fits["points"]
    assert check["n_points"] == 5 and not check["disagrees"]
    head = headline("weight_var", ds, fits, {}, 0.95)
    assert head.status == "good", head.sentences
    assert "of 5 points" in head.sentences[0] and "Holm-adjusted over the report" in head.sentences[0]


def test_a_theory_inside_its_interval_that_the_family_rejects_reads_as_a_disagreement():
    """The collapse's p-value (exact null draws) and its score interval are different tests: a
    collapse at seed 39 has the theory inside the interval and p < 0.001. Its verdict is bad, and
    its words must say why, not "(inside)"."""
    from sgdsweep.analysis.fit import fit_collapse
    from sgdsweep.analysis.fit.family import control

    rng = np.random.default_rng(39)
    reps = 1 + 0.05 * math.sqrt(32) * rng.standard_normal((8, 32))
    res = fit_collapse(np.repeat(np.arange(4.0), 2), reps.mean(1), reps.std(1, ddof=1) / math.sqrt(32), np.ones(8),
                       0.95, replicas=np.full(8, 32))
    q = res["params"]["spread2"]
    assert q["theory_inside"] and q["pvalue"] < 0.001
    control({"linear_scaling": [res]}, 0.95)
    v = judge("linear_scaling", {**res, "group": {}})
    assert v.status == "bad" and "exact theory 0 (inside)" not in v.text()
    assert f"exact theory 0 (inside the interval, but DISAGREES: p = {q['pvalue']:.2g}" in v.text(), v.text()


def test_a_broken_collapse_is_rejected_in_a_large_family():
    """A spread of 30 % between points at equal λ/S with 1 % noise lies beyond every null draw:
    its p-value must resolve below the first batch's 2/20000 = 1e-4, or a report of 600
    comparisons (a sweep of a few hundred Wigner points) could never reject it (Holm needs
    p ≤ 0.05/600 = 8e-5 for its smallest p-value)."""
    from sgdsweep.analysis.fit import fit_collapse
    from sgdsweep.analysis.fit.collapse import NULL_DRAWS_MAX
    from sgdsweep.analysis.fit.family import control

    value = np.tile([1.0, 1.3], 4)
    res = fit_collapse(np.repeat(np.arange(4.0), 2), value, 0.01 * value, np.ones(8), 0.95,
                       replicas=np.full(8, 32))
    q = res["params"]["spread2"]
    assert q["pvalue"] == 2 / NULL_DRAWS_MAX and q["pvalue_tail"] == "upper"
    others = [{"params": {"psi": {"pvalue": 0.5}}} for _ in range(599)]
    family = control({"linear_scaling": [res], "flatness": others}, 0.95)
    assert family["comparisons"] == 600 and q["disagrees"]


def test_a_collapse_rejected_in_its_lower_tail_says_the_points_agree_too_closely():
    """The seed-39 collapse is rejected because its spread is far below the noise's (its lower
    tail): the verdict names that, since it speaks of the standard errors, not of the theory."""
    from sgdsweep.analysis.fit import fit_collapse
    from sgdsweep.analysis.fit.family import control

    rng = np.random.default_rng(39)
    reps = 1 + 0.05 * math.sqrt(32) * rng.standard_normal((8, 32))
    x, se = np.repeat(np.arange(4.0), 2), reps.std(1, ddof=1) / math.sqrt(32)
    low = fit_collapse(x, reps.mean(1), se, np.ones(8), 0.95, replicas=np.full(8, 32))
    high = fit_collapse(x, np.tile([1.0, 1.3], 4), 0.01 * np.ones(8), np.ones(8), 0.95, replicas=np.full(8, 32))
    control({"linear_scaling": [low, high]}, 0.95)
    assert [r["params"]["spread2"]["pvalue_tail"] for r in (low, high)] == ["lower", "upper"]
    assert all(r["params"]["spread2"]["disagrees"] for r in (low, high))
    texts = [judge("linear_scaling", {**r, "group": {}}).text() for r in (low, high)]
    assert "agree more closely than the theory's spread" in texts[0]
    assert "agree more closely" not in texts[1]


def test_a_loss_headline_beside_a_weight_variance_is_decided_by_the_family():
    """``report.lead: loss`` on a model that also has a weight variance (config/sweeps/liu2021_loss.yaml):
    the fits cannot know the lead (it is the report's), so they check the loss too, and the
    headline states that family decision rather than its own joint bound."""
    from sgdsweep.analysis.headline import headline

    ds = _ensemble()
    rng = np.random.default_rng(2)
    loss = 0.5 + ds["weight_var_theory"].values
    reps = loss[:, None] * (1 + 0.02 * 4 * rng.standard_normal((6, 16)))
    ds = ds.assign(loss=("point", reps.mean(1)), loss_se=("point", reps.std(1, ddof=1) / 4),
                   loss_theory=("point", loss), loss_replica=(("point", "replica"), reps))
    fits = fit_ensemble(ds, dict(FIT))
    assert [c["variable"] for c in fits["points"]] == ["weight_var", "loss"]
    head = headline("loss", ds, fits, {}, 0.95)
    assert "Holm-adjusted over the report" in head.sentences[0], head.sentences


def test_a_flat_spectrum_gives_strict_json():
    """Modes of equal variance: r² is undefined (0/0). fits.json is read by strict JSON parsers
    too, so it is None, not NaN."""
    from sgdsweep.analysis.fit.spectra import flatness_exponent

    res = flatness_exponent(np.full(5, 1e-3), np.geomspace(0.1, 10, 5), theory_variance=np.full(5, 1e-3))
    assert res["r_squared"] is None
    json.dumps(res, allow_nan=False)
    assert "r² = —" in judge("flatness", {**res, "group": {}}).text()


def test_a_headline_over_several_groups_names_the_family_s_rejections():
    """Two groups, one exponent 10 SE off its exact theory: "inside the interval in 3 of 4" alone
    does not say whether the fourth is a disagreement (outside is not rejected); the sentence
    counts the family's rejections, so that it matches the headline's bad status."""
    from sgdsweep.analysis.fit.common import parameter
    from sgdsweep.analysis.fit.family import control
    from sgdsweep.analysis.headline import _fit_sentences

    def group(noise: str, b_theory: float) -> dict:
        return {"group": {"noise": noise}, "chi2_pvalue": 0.5, "chi2_reduced": 1.0,
                "params": {"a": parameter(1.0, 0.01, 0.95, "bootstrap", theory=1.0),
                           "b": parameter(-1.0, 0.01, 0.95, "bootstrap", theory=b_theory)}}

    fits = {"power_law": [group("gaussian", -1.0), group("minibatch", -1.1)]}
    control(fits, 0.95)
    sentences, statuses = _fit_sentences("power_law", fits)
    assert "bad" in statuses
    assert "inside the interval in 1 of 2; the report's family rejects 1: DISAGREES" in sentences[1], sentences
    assert "rejects" not in sentences[0]


def test_a_summary_verdict_counts_the_family_s_rejections():
    """Over more groups than are listed, the summary says in how many the family rejects the
    theory, beside how many intervals hold it."""
    from sgdsweep.analysis.fit.common import parameter
    from sgdsweep.analysis.fit.family import control
    from sgdsweep.analysis.fit.verdict import assess

    def group(i: int, theory: float) -> dict:
        return {"group": {"momentum": 0.1 * i}, "n_classes": 1, "relative_spread": 0.0, "relative_spread_theory": 0.0,
                "noise_floor": 0.01, "params": {"spread2": parameter(0.0, 0.001, 0.95, "score", theory=theory)}}

    fits = {"linear_scaling": [group(i, 0.0) for i in range(4)] + [group(4, 0.1)]}
    control(fits, 0.95)
    (v,) = assess(fits)
    assert v.status == "bad" and "exact theory inside in 4 of 5; the report's family rejects 1: DISAGREES" in v.text()


def _broken_collapse() -> xr.Dataset:
    """The six points of :func:`_ensemble` with points at S = 4 30 % above their exact theory
    (1 % SE): at equal λ/S the collapse is broken far beyond every null draw."""
    ds = _ensemble()
    factor = np.where(ds["batch_size"].values == 4.0, 1.3, 1.0)
    theory = ds["weight_var_theory"].values
    reps = theory[:, None] * factor[:, None] * (1 + 0.04 * np.random.default_rng(1).standard_normal((6, 16)))
    return ds.assign(weight_var=("point", reps.mean(1)), weight_var_se=("point", reps.std(1, ddof=1) / 4),
                     weight_var_replica=(("point", "replica"), reps))


def test_a_collapse_far_outside_its_null_is_drawn_only_as_far_as_the_family_needs(monkeypatch):
    """Holm rejects any p-value at or below α/m. A collapse far outside its null is settled by
    the first batch of draws when the batch's 99.9 % bound of its p-value is below α/m (a
    report of a few comparisons); in a report of 600 comparisons it is drawn on until the
    bound is below 0.05/600, and is still rejected."""
    from sgdsweep.analysis.fit import collapse, family

    calls = []
    draws = collapse._null_draws
    monkeypatch.setattr(collapse, "_null_draws", lambda *a, **k: calls.append(1) or draws(*a, **k))
    fits = fit_ensemble(_broken_collapse(), FIT)
    q = fits["linear_scaling"][0]["params"]["spread2"]
    m = fits["family"]["comparisons"]
    assert len(calls) == 1 and q["pvalue"] == 2 / collapse.NULL_DRAWS
    assert q["pvalue_bound"] <= 0.05 / m and q["disagrees"]
    # the verdict states what is known: the bound, not the one batch's floor as if it were exact
    text = judge("linear_scaling", fits["linear_scaling"][0]).text()
    assert f"DISAGREES: p < {q['pvalue_bound']:.2g}" in text, text

    calls.clear()
    monkeypatch.setattr(family, "count", lambda fits: 600)
    q = fit_ensemble(_broken_collapse(), FIT)["linear_scaling"][0]["params"]["spread2"]
    assert q["pvalue_bound"] <= 0.05 / 600 < collapse.tail_bound(0, (len(calls) - 2) * collapse.NULL_DRAWS)
    assert q["pvalue"] <= 0.05 / 600 and q["disagrees"]


def test_the_tail_bound_holds_the_p_value_at_its_confidence():
    """``tail_bound(k, n)`` is below the true two-sided p-value 2q only when the count k of n
    draws in the tail is improbably low: at most 0.1 % of the time, for any q (exact Poisson
    probabilities of k)."""
    from scipy import stats

    from sgdsweep.analysis.fit.collapse import NULL_BOUND_CONFIDENCE, tail_bound

    n = 20000
    for q in (1e-5, 5e-5, 1e-4, 2.7e-4, 4e-4):
        low = [k for k in range(40) if tail_bound(k, n) < 2 * q]
        miss = stats.poisson.cdf(max(low), n * q) if low else 0.0
        assert miss <= 1 - NULL_BOUND_CONFIDENCE + 1e-12, (q, low, miss)
        assert tail_bound(int(stats.poisson.ppf(0.5, n * q)), n) > 2 * q  # not trivially loose
