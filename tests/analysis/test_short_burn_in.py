"""Which points the report calls short of burn-in (``burn_in_relaxations`` under SHORT_BURN_IN):
not those of an escape sweep, whose replicas are meant to leave the stationary state they start
in, and whose burn-in (0) is no fault."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from sgdsweep.analysis.fit import assess, fit_ensemble
from sgdsweep.analysis.fit.points import short_burn_in
from sgdsweep.analysis.headline import headline


def _ensemble(escaped_fraction: float | None) -> xr.Dataset:
    """16 points (λ × S) of a weight variance 3 × its theory, burn-in 0 relaxation times; with
    ``escaped_fraction`` (a number: escapes observed) as an escape sweep stores it."""
    lr, s = np.meshgrid([0.05, 0.1, 0.2, 0.4], [2.0, 4.0, 8.0, 16.0], indexing="ij")
    lr, s = lr.ravel(), s.ravel()
    truth = 0.3 * lr / s
    data = {"weight_var": ("point", 3 * truth), "weight_var_se": ("point", 0.01 * truth),
            "weight_var_theory": ("point", truth), "diverged": ("point", np.zeros(lr.size, bool)),
            "burn_in_relaxations": ("point", np.zeros(lr.size))}
    if escaped_fraction is not None:
        data["escaped_fraction"] = ("point", np.full(lr.size, escaped_fraction))
    coords = {"point": [f"p{i}" for i in range(lr.size)], "lr": ("point", lr), "batch_size": ("point", s)}
    return xr.Dataset(data, coords=coords, attrs={"swept_axes": json.dumps(["lr", "batch_size"])})


def test_an_escape_sweep_is_not_called_short_of_burn_in():
    """Points that observe escapes (``escaped_fraction`` stored, escaped or not) are not counted:
    neither the fits' verdicts nor the headline, where an escape sweep whose escape fit could not
    run leads with the weight variance, blame the burn-in for what the escapes did. The same
    points without escapes observed are counted."""
    conf = {"power_law": {"enabled": True}, "confidence": 0.95}
    for fraction in (0.0, 0.25):
        ds = _ensemble(fraction)
        assert not short_burn_in(ds).any()
        fits = fit_ensemble(ds, conf)
        assert "short_burn_in" not in fits["power_law"][0]
        (verdict,) = [v for v in assess(fits) if v.fit == "power_law"]
        assert verdict.status == "bad" and "burn-in" not in verdict.text()
        head = headline("weight_var", ds, fits, {})
        assert head.lead == "weight_var" and not [n for n in head.notes if "burn-in" in n]
    plain = _ensemble(None)
    assert short_burn_in(plain).all()
    fits = fit_ensemble(plain, conf)
    assert fits["power_law"][0]["short_burn_in"] == 16
    assert [n for n in headline("weight_var", plain, fits, {}).notes if n.startswith("16 of 16 points have a burn-in")]


def test_one_short_point_is_said_in_the_singular(tmp_path):
    """"1 of 16 points has a burn-in …: its averages", in the headline's note, a verdict's sentence
    and the plan's warning."""
    from sgdsweep.analysis.fit.verdict import short_burn_in_sentence
    from sgdsweep.sweep.burn_in import short_burn_in_warning
    from sgdsweep.sweep.config import build_sweep

    ds = _ensemble(None)
    ds["burn_in_relaxations"].values[:] = 10.0
    ds["burn_in_relaxations"].values[3] = 0.5
    conf = {"power_law": {"enabled": True}, "confidence": 0.95}
    (note,) = [n for n in headline("weight_var", ds, fit_ensemble(ds, conf), {}).notes if "burn-in" in n]
    assert note.startswith("1 of 16 points has a burn-in under 4") and "): its averages may" in note, note
    assert short_burn_in_sentence(1).startswith("1 of its points has a burn-in under 4 slowest relaxation times: "
                                                "its averages")
    assert short_burn_in_sentence(2).startswith("2 of its points have a burn-in")
    sweep = build_sweep({"sweep": "one", "results_dir": str(tmp_path), "model": {"kind": "quadratic"},
                         "dynamics": {"steps": 4000, "replicas": 2, "burn_in": 20},
                         "grid": {"lr": [0.05, 1.0], "batch_size": 1, "noise": "gaussian"}})
    warning = short_burn_in_warning(sweep)
    assert warning.startswith("warning: 1 of 2 points has a burn-in") and "): its averages" in warning, warning
