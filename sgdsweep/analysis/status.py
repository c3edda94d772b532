"""The report's status line: what became of the points, and how far the measured weight variance
lies from its exact theory, in standard errors.

It describes; it does not judge. Whether the measurements agree with the theory is decided by the
headline and the fits, over the report's whole family of comparisons
(:mod:`sgdsweep.analysis.fit.family`).
"""

from __future__ import annotations

import html

import numpy as np
import xarray as xr

from sgdsweep.analysis.figures import point_status


def status_line(ds: xr.Dataset) -> str:
    """One HTML paragraph: the points done, with some diverged replicas and fully diverged
    (:func:`~sgdsweep.analysis.figures.point_status`); then the largest |measured − theory| / SE of
    ``weight_var`` over the points not fully diverged that have a finite one, or why there is none."""
    status = point_status(ds)
    ok = status < 2
    text = f"<p class='status'>Sweep <b>{html.escape(ds.attrs.get('sweep', ''))}</b>: {ds.sizes['point']} points, "
    if (status == 0).all():
        text += "all done. "
    else:
        text += (f"{int((status == 0).sum())} done, {int((status == 1).sum())} with some diverged replicas "
                 f"(excluded from averages), {int((status == 2).sum())} fully diverged (excluded from fits). ")
    if "weight_var_theory" not in ds:
        return text + "</p>"
    theory = np.asarray(ds["weight_var_theory"].values, float)[ok]
    z = np.abs((np.asarray(ds["weight_var"].values, float)[ok] - theory)
               / np.asarray(ds["weight_var_se"].values, float)[ok]) if "weight_var_se" in ds else np.array([])
    if np.isfinite(z).any():
        text += (f"The measured weight variance lies within {float(np.nanmax(z)):.2f} standard errors of the exact "
                 f"theory at each of the {int(np.isfinite(z).sum())} points with one (max |measured − theory| / SE).")
    elif np.isfinite(theory).any():
        text += ("No point with an exact weight-variance theory has a finite standard error to compare it with "
                 "(a single replica that did not diverge, or none).")
    else:
        why = ds["weight_var_theory"].attrs.get("missing_because", "no theory for this model")
        text += f"No exact weight-variance theory for these points ({html.escape(why)})."
    return text + "</p>"
