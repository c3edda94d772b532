"""One decision for a whole report: Holm's family-wise control over every comparison with theory.

A report compares many fitted quantities with the exact theory at once (each power-law exponent of
each group, each collapse, each escape slope, each pair's Wigner test, …). Were each read at its own
5 % level, a report of ten comparisons on a correct engine would say "disagrees" somewhere in about
40 % of runs. So a comparison only *disagrees* when Holm's step-down procedure rejects it over the
report's whole family: with the p-values sorted, p₍ᵢ₎ ≤ α/(m − i + 1) for it and every smaller one
(m comparisons, α = 1 − confidence). The report then says "disagrees" with probability at most α
whatever the dependence between the comparisons (Holm, Scand. J. Statist. 6, 65 (1979)).

The intervals stay the marginal ones (each covers its own quantity at the confidence level: measured
in ``benchmarks/calibration.py``); a theory value outside its interval that the family does not
reject is "outside the interval, within the report's family-wise level", not a disagreement.

:func:`control` annotates the fits of :func:`sgdsweep.analysis.fit.fit_ensemble` in place: each
compared quantity gets ``disagrees`` (bool) and ``pvalue_holm`` (its Holm-adjusted p-value); the
fits get ``family`` = ``{"method", "alpha", "comparisons", "disagreements"}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

#: The quantities of each fit whose p-values against the exact theory enter the family: the
#: headline parameters the verdicts state, and (keys starting with "@") a whole-fit test stored
#: on the result itself: the power law's point-by-point agreement, the Wigner pair's KS test and
#: the headline's point-by-point check of a variable (:mod:`sgdsweep.analysis.fit.points`).
COMPARED: dict[str, tuple[str, ...]] = {
    "power_law": ("a", "b", "@agreement"), "linear_scaling": ("spread2",), "momentum_scaling": ("spread2",),
    "escape": ("slope_exact",), "wigner": ("binder", "@ks"), "wigner_width": ("a", "b"), "flatness": ("psi",),
    "points": ("@points",)}
#: Where a whole-fit test keeps its p-value and its decision.
WHOLE_FIT = {"@agreement": ("agreement_pvalue", "agreement_disagrees"), "@ks": ("ks_pvalue", "ks_disagrees"),
             "@points": ("pvalue", "disagrees")}


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values: reject comparison i at family-wise level α exactly when the result
    is ≤ α. ``adjusted₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎)`` in increasing order of p."""
    p = np.asarray(pvalues, float)
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(scaled)
    return out


def _comparisons(fits: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, str, float]]:
    """(dict holding the p-value, key of its p-value, key of its decision, p-value) of every comparison."""
    for kind, names in COMPARED.items():
        for res in fits.get(kind) or []:
            if not isinstance(res, dict) or res.get("error"):
                continue
            for name in names:
                if name in WHOLE_FIT:
                    key, decision = WHOLE_FIT[name]
                    if res.get(key) is not None:
                        yield res, key, decision, float(res[key])
                    continue
                q = (res.get("params") or {}).get(name)
                if q and q.get("pvalue") is not None:
                    yield q, "pvalue", "disagrees", float(q["pvalue"])


def count(fits: dict[str, Any]) -> int:
    """How many comparisons with theory ``fits`` holds: the family's size m."""
    return sum(1 for _ in _comparisons(fits))


def control(fits: dict[str, Any], confidence: float) -> dict[str, Any]:
    """Decide every comparison of ``fits`` with Holm's procedure at α = 1 − ``confidence``
    (module docstring); annotates ``fits`` in place and returns its ``family`` summary."""
    alpha = 1.0 - confidence
    found = list(_comparisons(fits))
    adjusted = holm(np.array([c[3] for c in found])) if found else np.array([])
    for (holder, key, decision, _), adj in zip(found, adjusted):
        holder[key + "_holm" if key != "pvalue" else "pvalue_holm"] = float(adj)
        holder[decision] = bool(adj <= alpha)
    family = {"method": "holm", "alpha": alpha, "comparisons": len(found),
              "disagreements": int(sum(adjusted <= alpha))}
    fits["family"] = family
    return family


#: The keys :func:`control` adds: each comparison's decision.
DECISIONS = frozenset({"disagrees", *(decision for _, decision in WHOLE_FIT.values())})


def unjudged(res: Any) -> Any:
    """A deep copy of a fit result (or any part of one) without what :func:`control` added to it:
    the Holm-adjusted p-values (``*_holm``) and the decisions (:data:`DECISIONS`), which depend on
    every other comparison of the report."""
    if isinstance(res, dict):
        return {k: unjudged(v) for k, v in res.items() if k not in DECISIONS and not k.endswith("_holm")}
    if isinstance(res, list):
        return [unjudged(v) for v in res]
    return res


def sentence(family: dict[str, Any] | None) -> str:
    """The report's one line on how its verdicts control false alarms."""
    if not family or not family.get("comparisons"):
        return ""
    m, alpha = family["comparisons"], family["alpha"]
    return (f"A verdict says “disagrees” only where Holm's correction over all {m} comparison"
            f"{'s' if m != 1 else ''} with the exact theory in this report rejects it: on a correct engine, a "
            f"report shows any “disagrees” with probability at most {alpha:.0%}. Each interval is a "
            f"{1 - alpha:.0%} interval of its own quantity.")
