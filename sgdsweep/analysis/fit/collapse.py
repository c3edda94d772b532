"""Collapse of curves onto one scaling variable: one number for the spread, with its uncertainty.

The linear scaling rule says the stationary weight variance depends on λ and S only through
``x = λ/S`` (and, with momentum, through ``λ/((1−μ)S)``). Points that share ``x`` then have equal
values. The statistic is the pooled variance of ``ln value`` among points with equal ``x``,
corrected for the measurement noise so that a perfect collapse has expectation 0::

    Δ² = Σ_c [ Σ_{i∈c} (ln v_i − mean_c ln v)² − (1 − 1/n_c) Σ_{i∈c} s_i² ] / Σ_c (n_c − 1)

with ``s_i = se_i / v_i`` and classes ``c`` of at least two points. ``√Δ²`` is the typical
relative deviation from the collapse (0.05 = 5 %). The theory value is the same statistic of
the exact theory at the same points (no noise to remove); the leading-order value is 0.

Interval (``interval_method: score``). With Gaussian log values of known variances ``s_i²`` the
estimate's variance depends on the true spread θ itself::

    Var(Δ̂² | θ) = [Σ_c 2 tr((C_c Σ_c)²) + 4 θ Σ_c (n_c − 1) s̄_c²] / (Σ_c (n_c − 1))²

(``C_c`` centres class c, ``Σ_c = diag(s_i²)``, ``s̄_c²`` the class's mean ``s_i²``; the second
term counts θ only where θ > 0). The interval is every θ that the estimate does not reject at
the confidence level, ``|Δ̂² − θ| ≤ q·√Var(Δ̂² | θ)`` (q Student's t quantile on the fewest
replicas less one: the SEs are estimated): a score interval, like Wilson's for a proportion. An
interval built from the variance at the estimate instead is too narrow exactly when the estimate
falls low, and missed the exact theory in 13 % of data sets at a nominal 5 %
(benchmarks/calibration.py).

The theory's p-value is exact rather than normal: Δ̂² is a quadratic form whose upper tail is
heavier than a normal one, and a report's family-wise decision reads p-values far in the tail
(0.05/m). :func:`null_test` draws Δ̂² under the theory, log values ``ln theory_i + s_i·T_i``
with ``T_i`` Student's t on the point's replicas less one (a mean's deviation over its estimated
SE; normal without replica counts), from a fixed seed. Over more than a hundred points one batch
of draws is taken, and beyond its reach the normal law with its mean and variance
(:data:`NULL_EXACT_POINTS`): Δ̂² is then a sum of many independent class terms, and drawing its far
tail would cost draws × points.

How far into the tail to draw depends on the report: Holm rejects every p-value at or below α/m
(m comparisons) whatever the others are, so a p-value need not be resolved once a 99.9 % upper
bound of it (:func:`tail_bound`) is at most α/m. :func:`null_test` takes that level as
``target``; :func:`sgdsweep.analysis.fit.fit_ensemble` first draws one batch per collapse, counts
the report's comparisons, and draws on only for the collapses whose bound is still above α/m (a
collapse far outside its null otherwise cost ten batches for nothing).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sgdsweep.analysis.fit.common import parameter, t_quantile, z_quantile


def collapse_classes(x: np.ndarray) -> list[np.ndarray]:
    """Indices of the points in each class of equal ``x`` (to 9 significant digits) with ≥ 2
    points, classes in order of their first point."""
    keys = np.array([float(f"{v:.9g}") for v in np.asarray(x, float)])
    if keys.size == 0:
        return []
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")  # the points of each class together, in index order
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    classes = [(first[k], idx) for k, idx in enumerate(np.split(order, bounds)) if idx.size >= 2]
    return [idx for _, idx in sorted(classes, key=lambda c: c[0])]


def _spread2(logv: np.ndarray, rel_var: np.ndarray | None, classes: list[np.ndarray]) -> np.ndarray:
    """Δ² for log values logv (..., n); rel_var (n,) the noise variance of each log value (None: no correction)."""
    ss = np.zeros(logv.shape[:-1])
    dof = 0
    for idx in classes:
        y = logv[..., idx]
        ss = ss + ((y - y.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
        if rel_var is not None:
            ss = ss - (1 - 1 / idx.size) * rel_var[idx].sum()
        dof += idx.size - 1
    return ss / dof


def _score_variance(rel_var: np.ndarray, classes: list[np.ndarray]) -> tuple[float, float, int]:
    """``(A, B, dof)`` with ``Var(Δ̂² | θ) = (A + B·max(θ, 0)) / dof²`` (module docstring)."""
    a = b = 0.0
    dof = 0
    for idx in classes:
        s2, n = rel_var[idx], idx.size
        # tr((CΣ)²) = Σ_i (1 − 2/n) s_i⁴ + (Σ_i s_i²)² / n²
        a += 2 * (float((1 - 2 / n) * (s2**2).sum()) + float(s2.sum()) ** 2 / n**2)
        b += 4 * (n - 1) * float(s2.mean())
        dof += n - 1
    return a, b, dof


def score_interval(estimate: float, a: float, b: float, dof: int, z: float) -> tuple[float, float]:
    """Every θ with ``|estimate − θ| ≤ z·√((a + b·max(θ, 0)) / dof²)``: the score interval."""
    k = z**2 / dof**2
    half0 = z * math.sqrt(a) / dof  # the half-width where θ ≤ 0
    root = math.sqrt(max(k * b * estimate + (k * b) ** 2 / 4 + k * a, 0.0))
    lo = estimate - half0 if estimate - half0 <= 0 else estimate + k * b / 2 - root
    hi = estimate + half0 if estimate + half0 <= 0 else estimate + k * b / 2 + root
    return lo, hi


#: Draws of the null distribution in :func:`null_pvalue`, and their seed (the same fits every time).
#: Where fewer than :data:`NULL_TAIL` draws lie in the estimate's tail, batches of
#: :data:`NULL_DRAWS` more are drawn, up to :data:`NULL_DRAWS_MAX` in all: the smallest p-value is
#: 2/NULL_DRAWS_MAX = 1e-5, so a family of up to α/1e-5 = 5000 comparisons can still reject a
#: collapse (the first batch alone floors it at 1e-4: no rejection beyond 500 comparisons).
NULL_DRAWS, NULL_SEED = 20000, 20240102
NULL_TAIL, NULL_DRAWS_MAX = 10, 200000
#: Over more than NULL_EXACT_POINTS points the null takes one batch of NULL_ELEMENTS/points
#: draws (between :data:`NULL_DRAWS_LARGE` and :data:`NULL_DRAWS`): its tail where at least
#: NULL_TAIL draws lie beyond the estimate, else the normal law with the draws' mean and
#: variance. With so many classes Δ̂² is a sum of many independent terms, close to normal, and
#: its far tail is not worth draws × points (a Student-t draw costs ~0.1 µs).
NULL_EXACT_POINTS, NULL_ELEMENTS, NULL_DRAWS_LARGE = 100, 4 * 10**6, 1000


def _null_draws(log_theory: np.ndarray, rel_var: np.ndarray, classes: list[np.ndarray],
                replicas: np.ndarray | None, rng: np.random.Generator, draws: int = NULL_DRAWS) -> np.ndarray:
    """``draws`` values of Δ̂² under the theory (module docstring)."""
    shape = (draws, rel_var.size)
    if replicas is None:
        noise = rng.standard_normal(shape)
    else:  # (mean − truth)/SE over R replicas is Student's t on R − 1
        noise = rng.standard_t(np.maximum(np.asarray(replicas, float) - 1, 1)[None, :], size=shape)
    members = np.concatenate(classes)  # the points of each class together
    sizes = np.array([idx.size for idx in classes])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    y = log_theory[members][None, :] + np.sqrt(rel_var[members])[None, :] * noise[:, members]
    means = np.add.reduceat(y, starts, axis=1) / sizes
    y -= np.repeat(means, sizes, axis=1)
    correction = float(sum((1 - 1 / idx.size) * rel_var[idx].sum() for idx in classes))
    return (np.add.reduceat(y * y, starts, axis=1).sum(axis=1) - correction) / int((sizes - 1).sum())


#: Confidence of :func:`tail_bound`, the bound at which :func:`null_test` stops short of
#: :data:`NULL_TAIL` draws in the tail.
NULL_BOUND_CONFIDENCE = 0.999


def tail_bound(tail_draws: int, total: int) -> float:
    """An upper bound, at :data:`NULL_BOUND_CONFIDENCE`, of the two-sided p-value ``2q`` when
    ``tail_draws`` of ``total`` independent draws lie in its smaller tail (q that tail's
    probability): twice the exact Poisson upper limit of the count over ``total``."""
    from scipy import special  # on use: building a sweep's summary imports this module

    return min(1.0, 2.0 * float(special.gammaincinv(tail_draws + 1, NULL_BOUND_CONFIDENCE)) / total)


def null_test(estimate: float, log_theory: np.ndarray, rel_var: np.ndarray, classes: list[np.ndarray],
              replicas: np.ndarray | None = None, target: float = 0.0) -> tuple[float, str, float | None]:
    """(two-sided p-value, its tail: ``"lower"`` or ``"upper"``, bound) of ``estimate`` under the
    theory (module docstring): twice the smaller tail of Δ̂² drawn with the points' noise, in
    batches of :data:`NULL_DRAWS` until that tail holds :data:`NULL_TAIL` draws, the draws reach
    :data:`NULL_DRAWS_MAX` (p-values down to 2/NULL_DRAWS_MAX), or :func:`tail_bound` is at
    most ``target`` (then ``bound`` is that bound; else None). Over more than
    :data:`NULL_EXACT_POINTS` points, from one batch, and beyond its reach from the normal law
    matched to it. ``replicas`` (n,): each point's replica count (None: the SEs are taken as
    exact). A lower tail is a spread smaller than the theory's and the noise allow."""
    rng = np.random.default_rng(NULL_SEED)
    points = int(sum(idx.size for idx in classes))
    if points > NULL_EXACT_POINTS:
        n = min(NULL_DRAWS, max(NULL_DRAWS_LARGE, NULL_ELEMENTS // points))
        draws = _null_draws(log_theory, rel_var, classes, replicas, rng, n)
        below, above = int(np.count_nonzero(draws <= estimate)), int(np.count_nonzero(draws >= estimate))
        if min(below, above) >= NULL_TAIL:
            return float(min(1.0, 2 * min(below, above) / n)), ("lower" if below < above else "upper"), None
        z = (estimate - float(draws.mean())) / max(float(draws.std(ddof=1)), np.finfo(float).tiny)
        return float(min(1.0, math.erfc(abs(z) / math.sqrt(2)))), ("lower" if z < 0 else "upper"), None
    below = above = total = 0
    while True:
        draws = _null_draws(log_theory, rel_var, classes, replicas, rng)
        below += int(np.count_nonzero(draws <= estimate))
        above += int(np.count_nonzero(draws >= estimate))
        total += NULL_DRAWS
        if min(below, above) >= NULL_TAIL or total >= NULL_DRAWS_MAX:
            bound = None
            break
        bound = tail_bound(min(below, above), total)
        if bound <= target:
            break
    return (float(min(1.0, 2 * max(min(below, above), 1) / total)), ("lower" if below < above else "upper"),
            bound)


def null_pvalue(estimate: float, log_theory: np.ndarray, rel_var: np.ndarray, classes: list[np.ndarray],
                replicas: np.ndarray | None = None) -> float:
    """The p-value of :func:`null_test`."""
    return null_test(estimate, log_theory, rel_var, classes, replicas)[0]


def fit_collapse(x: np.ndarray, value: np.ndarray, se: np.ndarray, theory: np.ndarray | None = None,
                 confidence: float = 0.95, *, variable: str = "lr/batch_size",
                 replicas: np.ndarray | None = None, target: float = 0.0) -> dict[str, Any]:
    """Spread Δ² of ``ln value`` among points with equal scaling variable ``x`` (module docstring).

    Args:
        x: the scaling variable per point (λ/S, or λ/((1−μ)S)), shape (n,).
        value, se: measured values (> 0) and standard errors, shape (n,); the SEs set the noise
            correction and the score interval.
        theory: exact theory at the same points, or None.
        variable: how ``x`` is built, for the summary.
        replicas: each point's replica count, shape (n,), for the theory's p-value (None: the
            SEs are taken as exact).
        target: the p-value level below which the theory's p-value need not be resolved
            (:func:`null_test`); 0 resolves it as far as the draws reach.

    Returns:
        JSON-ready dict with ``params["spread2"]`` (estimate, score interval, theory, its p-value
        and ``pvalue_tail``, ``pvalue_bound`` where the draws stopped at ``target``, leading
        order 0, inside), ``relative_spread`` (√Δ², or 0 when Δ² ≤ 0), ``n_classes``,
        ``n_points``, or ``error`` when no two usable points share ``x``.
    """
    x, value, se = (np.asarray(a, float) for a in (x, value, se))
    ok = np.isfinite(value) & np.isfinite(se) & (value > 0) & (se > 0) & np.isfinite(x)
    if theory is not None:
        theory = np.asarray(theory, float)
        has = np.isfinite(theory) & (theory > 0)
        if has[ok].any():
            ok &= has
        else:
            theory = None
    keep = np.flatnonzero(ok)
    classes = collapse_classes(x[keep])
    result: dict[str, Any] = {"statistic": "pooled variance of ln(value) among points with equal " + variable
                              + ", noise removed", "variable": variable, "confidence": confidence,
                              "n_classes": len(classes), "n_points": int(sum(c.size for c in classes))}
    if not classes:
        result["error"] = f"no two usable points share the same {variable}: nothing to collapse"
        return result
    v, s = value[keep], se[keep]
    rel_var = (s / v) ** 2
    est = float(_spread2(np.log(v), rel_var, classes))
    th = float(_spread2(np.log(theory[keep]), None, classes)) if theory is not None else None
    a, b, dof = _score_variance(rel_var, classes)

    def sd(theta: float) -> float:
        return math.sqrt(a + b * max(theta, 0.0)) / dof

    q = parameter(est, sd(est), confidence, "score", theory=th, leading_order=0.0)
    # with estimated SEs the deviations are Student's t on the replicas less one, not normal
    quantile = (t_quantile(0.5 + confidence / 2, int(np.min(np.asarray(replicas)[keep])) - 1)
                if replicas is not None and np.min(np.asarray(replicas)[keep]) > 2 else z_quantile(confidence))
    lo, hi = score_interval(est, a, b, dof, quantile)
    q["interval"] = [lo, hi]
    if th is not None:
        q["theory_inside"] = bool(lo <= th <= hi)
        q["pvalue"], q["pvalue_tail"], bound = null_test(
            est, np.log(theory[keep]), rel_var, classes,
            None if replicas is None else np.asarray(replicas, float)[keep], target)
        if bound is not None:
            q["pvalue_bound"] = bound
    result["params"] = {"spread2": q}
    result["relative_spread"] = math.sqrt(max(est, 0.0))
    result["relative_spread_theory"] = math.sqrt(max(th, 0.0)) if th is not None else None
    result["noise_floor"] = float(np.sqrt(rel_var[np.concatenate(classes)].mean()))
    return result
