"""The report's status line describes the largest deviation from the exact theory in standard
errors, and says why there is none instead of printing NaN."""

from __future__ import annotations

import xarray as xr

from sgdsweep.analysis.status import status_line


def _ensemble(se: list[float], theory: list[float] | None = (1.0, 2.0, 3.0)) -> xr.Dataset:
    data = {"weight_var": ("point", [1.1, 2.0, 2.4]), "weight_var_se": ("point", se),
            "diverged_replicas": ("point", [0, 0, 0])}
    if theory is not None:
        data["weight_var_theory"] = ("point", list(theory))
    return xr.Dataset(data, coords={"point": ["a", "b", "c"]}, attrs={"sweep": "s"})


def test_the_largest_deviation_is_described_without_calling_it_agreement():
    line = status_line(_ensemble([0.1, 0.1, 0.1]))
    assert "3 points, all done." in line and "lies within 6.00 standard errors" in line  # |2.4 − 3|/0.1
    assert "at each of the 3 points with one" in line and "agree" not in line


def test_no_finite_standard_error_is_said_and_no_nan_printed():
    line = status_line(_ensemble([float("nan")] * 3))
    assert "nan" not in line.lower() and "No point with an exact weight-variance theory has a finite standard" in line
    missing = _ensemble([0.1] * 3, theory=[float("nan")] * 3)
    missing["weight_var_theory"].attrs["missing_because"] = "no theory for this noise"
    assert "No exact weight-variance theory for these points (no theory for this noise)." in status_line(missing)
    assert "standard errors" not in status_line(_ensemble([0.1] * 3, theory=None))
