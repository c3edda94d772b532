"""What every fit shares: groups of points, replica tables, bootstrap resampling, parameter summaries.

Intervals. A fit with per-replica data is repeated on ``bootstrap`` resamples of the replicas
(each point's replicas are drawn with replacement, independently per point, as the replicas
are; a fit weighted by the points' SEs recomputes them from each resample, since fixed weights
hide the variance that the estimated weights add); the interval is ``estimate ± z·sd_boot`` with
z the normal quantile of the confidence level. Without per-replica data, or with ``bootstrap:
0``, the analytic interval of the weighted least-squares fit is used and the summary says so
(``interval_method``). Every comparison with a theory also gets its p-value (:func:`parameter`).
"""

from __future__ import annotations

import functools
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import xarray as xr


def groups(ds: xr.Dataset, fitted_axes: tuple[str, ...]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Split the points by the values of every swept axis that is not fitted.

    Points that differ in momentum, P/N, noise, … obey different laws; pooling them would mix
    amplitudes and exponents. Returns (group values, boolean mask over points) pairs.
    """
    swept = json.loads(ds.attrs.get("swept_axes", "[]"))
    other = [a for a in swept if a not in fitted_axes and a in ds.coords]
    if not other:
        return [({}, np.ones(ds.sizes["point"], bool))]
    keys = list(zip(*(ds[a].values.tolist() for a in other)))
    out = []
    for key in dict.fromkeys(keys):
        mask = np.array([k == key for k in keys])
        out.append((dict(zip(other, key)), mask))
    return out


def axis_values(ds: xr.Dataset, name: str, default: float) -> np.ndarray:
    """Per-point values of an axis: its coordinate, or ``default`` (the resolved config value)
    when the axis was not swept and so is not stored per point."""
    if name in ds.coords or name in ds.data_vars:
        return np.asarray(ds[name].values, float)
    return np.full(ds.sizes["point"], float(ds.attrs.get(name, default)))


def replica_order(ds: xr.Dataset, name: str) -> np.ndarray:
    """Per point, the permutation of the replicas that puts ``name``'s finite values first."""
    return np.argsort(~np.isfinite(np.asarray(ds[name].values, float)), axis=1, kind="stable")


def replica_table(ds: xr.Dataset, name: str) -> np.ndarray | None:
    """Per-replica values (point, replica) with each row's finite values moved to the front
    (NaN after), so that ``row[:count]`` are the usable replicas; None if ``name`` is absent."""
    if name not in ds:
        return None
    return np.take_along_axis(np.asarray(ds[name].values, float), replica_order(ds, name), axis=1)


def resample_indices(counts: np.ndarray, width: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap indices (n_boot, points, width): for point i, ``counts[i]`` draws with replacement
    from ``range(counts[i])`` (the remaining columns repeat them and are ignored by callers)."""
    u = rng.random((n_boot, counts.size, width))
    return np.minimum((u * np.maximum(counts, 1)[None, :, None]).astype(np.int64),
                      np.maximum(counts - 1, 0)[None, :, None])


def resampled_means(table: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Means over bootstrap resamples of each point's replicas and each resample's standard error
    of the mean (sd/√count), both (n_boot, points), so that a fit weighted by the SEs can
    recompute its weights per resample; NaN for points without finite replicas."""
    counts = np.isfinite(table).sum(axis=1)
    idx = resample_indices(counts, table.shape[1], n_boot, rng)
    draws = np.take_along_axis(np.broadcast_to(table, (n_boot,) + table.shape), idx, axis=2)
    used = np.arange(table.shape[1])[None, None, :] < counts[None, :, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(used, draws, 0.0).sum(axis=2) / counts[None, :]
        dev = np.where(used, draws - means[:, :, None], 0.0)
        se = np.sqrt((dev**2).sum(axis=2) / (counts[None, :] - 1) / counts[None, :])
    return means, se


# The quantiles come from scipy.special, which scipy.stats calls for them too (the same numbers):
# importing scipy.stats costs 0.6 s more, most of a fit job's time on a small sweep. It is
# imported where it is used, so importing sgdsweep.analysis.fit (the report does, for column names)
# loads neither.


@functools.lru_cache(maxsize=64)
def z_quantile(confidence: float) -> float:
    """Two-sided normal quantile of a confidence level (1.96 for 0.95)."""
    from scipy import special

    return float(special.ndtri(0.5 + confidence / 2))


@functools.lru_cache(maxsize=256)
def t_quantile(probability: float, dof: int) -> float:
    """Student's t quantile (cached: a sweep's many per-point fits ask for the same few)."""
    from scipy import special

    return float(special.stdtrit(dof, probability))


def parameter(estimate: float, stderr: float, confidence: float, method: str, *,
              theory: float | None = None, leading_order: float | None = None,
              dof: int | None = None) -> dict[str, Any]:
    """JSON summary of one fitted quantity: estimate, standard error, interval, theory, whether the
    theory lies inside, and the two-sided p-value of the theory (``pvalue``: the probability of an
    estimate at least as far from the theory as this one, were the theory true; None without one).

    The interval is ``estimate ± q·stderr`` with q the normal quantile of ``confidence``, or
    Student's t on ``dof`` degrees of freedom when given (analytic least-squares intervals). The
    p-value uses the same distribution, so the theory lies inside exactly when ``pvalue ≥ 1 −
    confidence``. The report's verdicts test every p-value of a report together
    (:mod:`sgdsweep.analysis.fit.family`)."""
    q = z_quantile(confidence) if dof is None else (t_quantile(0.5 + confidence / 2, dof) if dof > 0 else math.inf)
    ok = math.isfinite(estimate) and math.isfinite(stderr)
    lo, hi = (estimate - q * stderr, estimate + q * stderr) if ok else (math.nan, math.nan)
    th = None if theory is None or not math.isfinite(theory) else float(theory)
    p = None
    if th is not None and ok:
        p = two_sided_pvalue((estimate - th) / stderr if stderr > 0 else math.inf * (estimate != th), dof)
    return {"estimate": _num(estimate), "stderr": _num(stderr), "interval": [_num(lo), _num(hi)],
            "interval_method": method, "theory": th, "leading_order": leading_order,
            "theory_inside": (bool(lo <= th <= hi) if th is not None and ok else None), "pvalue": p}


def two_sided_pvalue(z: float, dof: int | None = None) -> float:
    """P(|Z| ≥ |z|) for a standard normal Z, or Student's t on ``dof`` degrees of freedom (nan → 1:
    no evidence against)."""
    from scipy import special

    if not math.isfinite(z):
        return 1.0 if math.isnan(z) else 0.0
    if dof is None:
        return float(2 * special.ndtr(-abs(z)))
    return float(2 * special.stdtr(dof, -abs(z))) if dof > 0 else 1.0


def _num(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def boot_sd(samples: np.ndarray) -> np.ndarray:
    """Standard deviation over the first axis, ignoring non-finite resamples."""
    s = np.where(np.isfinite(samples), samples, np.nan)
    with np.errstate(invalid="ignore"):
        return np.nanstd(s, axis=0, ddof=1)


def wls(design: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, float]:
    """Weighted least squares: coefficients and the weighted residual sum of squares."""
    sw = np.sqrt(weights)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
    resid = (y - design @ coef) * sw
    return coef, float(resid @ resid)


def wls_many(design: np.ndarray, ys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Coefficients of the weighted fit for many right-hand sides ys (n_boot, n), each with its own
    weights (n_boot, n)."""
    a = np.einsum("ni,bn,nj->bij", design, weights, design)
    rhs = np.einsum("ni,bn,bn->bi", design, weights, ys)
    # a resample can weight one point so heavily that its system is singular: least squares there
    return (np.linalg.pinv(a) @ rhs[..., None])[..., 0]


def t_as_normal(z: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """Student-t statistics on ``dof`` degrees of freedom mapped to standard-normal ones of equal
    tail probability: a mean divided by its estimated SE over R replicas is t on R − 1, and sums
    of their squares read as χ² would reject too often (7–8 % at a nominal 5 % with 32 replicas)."""
    from scipy import special

    z, dof = np.asarray(z, float), np.asarray(dof, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dof > 0, -special.ndtri(special.stdtr(np.maximum(dof, 1), -np.abs(z))) * np.sign(z), z)
