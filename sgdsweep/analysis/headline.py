"""The report's first screen: a headline on the sweep's question (:mod:`sgdsweep.sweep.lead`)
with the measured value, the theory value and their agreement, and the figure that answers it.

:func:`headline` returns a :class:`Headline`: plain-text sentences, a status (``good``: the
measurements agree with the exact theory; ``bad``: they do not; ``neutral``: nothing exact to
compare with) and the lead figure (its name, alt text, and the function and arguments that draw
it). Agreement of a measured value m ± SE with an exact value t is judged on z = (m − t)/SE:
the n points of a sentence agree when max |z| stays within the bound that n independent
standard normals stay within together with the report's confidence (:func:`joint_bound`; 2.80 for
n = 5 at 95 %). The momentum lead also checks the stability edge: the exact edge
(:func:`sgdsweep.models.edge.stability_edge`) must lie between the largest μ at which a replica
diverged and the smallest at which none did (:func:`measured_bracket`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.fit.points import short_burn_in_note
from sgdsweep.analysis.fit.verdict import HEADLINE, NAMES, SYMBOLS, assess, judge, num, where
from sgdsweep.sweep import lead as leads


@dataclass
class Headline:
    """The first screen of a report: ``sentences`` (plain text, each a claim with its numbers),
    ``status`` (``good``, ``bad`` or ``neutral``), the lead figure ``figure`` = (name, alt text,
    make, args) or None, and ``lead`` (the resolved ``report.lead``)."""

    lead: str
    sentences: list[str]
    status: str
    figure: tuple[str, str, Callable[..., Any], tuple[Any, ...]] | None = None
    notes: list[str] = field(default_factory=list)


def joint_bound(n: int, confidence: float) -> float:
    """The |z| that n independent standard normals all stay within with probability
    ``confidence``: Φ⁻¹(1 − (1 − confidence^(1/n))/2) (1.96 for one point at 95 %)."""
    from scipy import special  # not scipy.stats: 1 s more to import, for the same quantile

    return float(-special.ndtri((1.0 - confidence ** (1.0 / max(n, 1))) / 2.0))


def _swept(ds: xr.Dataset) -> list[str]:
    return [a for a in json.loads(ds.attrs.get("swept_axes", "[]")) if a in ds.coords]


def _where(ds: xr.Dataset, i: int, axes: list[str]) -> str:
    from sgdsweep.analysis.figures import label_of

    return label_of(axes, tuple(ds[a].values[i].item() if hasattr(ds[a].values[i], "item") else ds[a].values[i]
                                for a in axes))


def agreement(ds: xr.Dataset, name: str, label: str, confidence: float, mask: np.ndarray | None = None,
              theory: str | None = None, words: str = "the exact theory",
              fits: Mapping[str, Any] | None = None, exact: bool = True) -> tuple[str, str] | None:
    """(sentence, status) comparing ``name`` (± ``name_se``) with its exact theory
    (``theory``, default ``name_theory``; ``words`` names it) at the points of ``mask``: the
    point of largest deviation with its values, the range of measured/theory and the decision;
    None when no point has both. The decision is the fits' own (``fits["points"]``, decided
    with every other comparison of the report: :mod:`sgdsweep.analysis.fit.points`) where they
    checked the same points, else the joint bound. A prediction that is not ``exact`` (leading
    order) is never disagreed with: beyond the bound the sentence says the measurements deviate
    from it by more than their noise, a correction beyond leading order, and the status is neutral."""
    theory = theory or f"{name}_theory"
    if name not in ds or theory not in ds or f"{name}_se" not in ds:
        return None
    m, se, t = (np.asarray(ds[v].values, float) for v in (name, f"{name}_se", theory))
    use = np.isfinite(m) & np.isfinite(se) & (se > 0) & np.isfinite(t) & (t != 0)
    if "diverged" in ds:  # as in the fits: a point with a diverged replica is not compared
        use &= ~np.asarray(ds["diverged"].values, bool)
    if mask is not None:
        use &= mask
    if not use.any():
        return None
    idx = np.flatnonzero(use)
    z = (m[idx] - t[idx]) / se[idx]
    worst = idx[int(np.argmax(np.abs(z)))]
    ratio = m[idx] / t[idx]
    bound = joint_bound(idx.size, confidence)
    max_z = float(np.max(np.abs(z)))
    where = _where(ds, worst, _swept(ds))
    agrees = max_z <= bound
    text = (f"{label}: measured {num(m[worst])} ± {num(se[worst], 2)} against {words} {num(t[worst])}"
            + (f" at {where}" if where else "")
            + (f" (the largest deviation of {idx.size} points, {(m[worst] - t[worst]) / se[worst]:+.2f} SE); "
               f"measured/theory {num(ratio.min())} to {num(ratio.max())}" if idx.size > 1
               else f" ({(m[worst] - t[worst]) / se[worst]:+.2f} SE)")
            + f"; the {conf_words(idx.size, confidence)} bound is {bound:.2f} SE")
    decided = _decided(fits, name, theory, idx.size)
    if decided is not None:
        agrees = not decided["disagrees"]
        text = text[:text.rindex("; the ")] + (
            f"; p = {decided['pvalue']:.2g} for the largest of {idx.size} deviation{'s' if idx.size > 1 else ''}, "
            f"Holm-adjusted over the report {decided['pvalue_holm']:.2g}")
    if not exact:
        return text + ": " + (f"consistent with {words}" if agrees else
                              f"deviates from {words} beyond its noise (a correction beyond leading order)"), \
            "good" if agrees else "neutral"
    text += ": " + (f"agrees with {words}" if agrees else f"DISAGREES with {words}")
    return text, "good" if agrees else "bad"


def _decided(fits: Mapping[str, Any] | None, name: str, theory: str, n_points: int) -> dict[str, Any] | None:
    """The fits' point-by-point check of ``name`` against ``theory`` over ``n_points`` points, when
    it was decided with the report's family (has ``disagrees``); None otherwise."""
    for check in (fits or {}).get("points") or []:
        if (check.get("variable"), check.get("theory"), check.get("n_points")) == (name, theory, n_points) \
                and "disagrees" in check:
            return check
    return None


def conf_words(n: int, confidence: float) -> str:
    """``95 % joint`` (several points) or ``95 %`` (one point)."""
    return f"{confidence:.0%} joint" if n > 1 else f"{confidence:.0%}"


def _combine(statuses: list[str]) -> str:
    if "bad" in statuses:
        return "bad"
    return "good" if "good" in statuses else "neutral"


def _x_axis(ds: xr.Dataset, prefer: tuple[str, ...] = ("lr",)) -> str | None:
    """The axis a lead figure is drawn against: the first swept axis with more than one value,
    those of ``prefer`` first."""
    swept = _swept(ds)
    for axis in [*[a for a in prefer if a in swept], *swept]:
        if leads.varying(ds, axis):
            return axis
    return swept[0] if swept else None


def _point_params(config: Mapping[str, Any], ds: xr.Dataset) -> list[dict[str, Any]]:
    """Each point's resolved parameters: the config's first point with the point's swept values
    (the edge and the theory curve of the momentum lead need them); empty when the config
    cannot be built here (e.g. a report spec without the sweep's config)."""
    if "model" not in config or "grid" not in config:
        return []
    from sgdsweep.errors import SgdsweepError
    from sgdsweep.sweep.config import build_sweep

    try:
        base = dict(build_sweep(dict(config), rounds=False).points[0].params)
    except (SgdsweepError, ValueError, KeyError):
        return []
    swept = _swept(ds)
    return [{**base, **{a: np.asarray(ds[a].values)[i].item() for a in swept}} for i in range(ds.sizes["point"])]


def measured_bracket(mu: np.ndarray, status: np.ndarray, side: str) -> tuple[float | None, float | None]:
    """The measured edge of a sweep along one axis, from each point's status (0: no replica
    diverged, > 0: some did): for ``side`` ``"lower"`` (stable above the edge) the largest value
    below every stable one at which a replica diverged, and the smallest stable value; for
    ``"upper"`` (stable below) the largest stable value and the smallest value above every stable
    one at which a replica diverged. None where the sweep has no such value (an open bracket)."""
    stable = mu[status == 0]
    if stable.size == 0:
        return None, None
    diverged = mu[status > 0]
    if side == "lower":
        below = diverged[diverged < stable.min()]
        return (float(below.max()) if below.size else None), float(stable.min())
    above = diverged[diverged > stable.max()]
    return float(stable.max()), (float(above.min()) if above.size else None)


def _edge_sentence(axis_sym: str, value: float, lo: float | None, hi: float | None, side: str,
                   where: str) -> tuple[str, str]:
    """(sentence, status): the measured bracket [lo, hi] against the exact edge ``value``."""
    inside = (lo is None or lo <= value) and (hi is None or value <= hi)
    if side == "lower":
        seen = (f"a replica diverged at {axis_sym} = {num(lo)} and none at {axis_sym} ≥ {num(hi)}" if lo is not None
                else f"no replica diverged at any {axis_sym} ≥ {num(hi)} (none below was run)")
    else:
        seen = (f"no replica diverged at {axis_sym} ≤ {num(lo)}, one did at {num(hi)}" if hi is not None
                else f"no replica diverged at any {axis_sym} ≤ {num(lo)} (none above was run)")
    text = (f"Stability edge{' at ' + where if where else ''}: {seen}; the exact edge {axis_sym} = {num(value)} "
            f"(the second-moment map's spectral radius reaches 1) "
            + ("lies inside that bracket: agrees" if inside and lo is not None and hi is not None
               else "is consistent with it" if inside else "lies OUTSIDE that bracket: DISAGREES"))
    return text, "good" if inside else "bad"


def _momentum(ds: xr.Dataset, fits: Mapping[str, Any], config: Mapping[str, Any],
              confidence: float) -> Headline:
    from sgdsweep.analysis import lead_figures
    from sgdsweep.analysis.figures import label_of, point_status, split_by
    from sgdsweep.models import get_model
    from sgdsweep.models.edge import stability_edge

    others = [a for a in _swept(ds) if a != "momentum"]
    params = _point_params(config, ds)
    status = point_status(ds)
    mu = np.asarray(ds["momentum"].values, float)
    sentences, statuses, edges, curves = [], [], [], []
    for key, sel in split_by(ds, others):
        where = label_of(others, key) if len(split_by(ds, others)) > 1 else label_of(
            [a for a in ("lr", "batch_size") if a in ds.coords],
            tuple(np.asarray(ds[a].values)[sel][0].item() for a in ("lr", "batch_size") if a in ds.coords))
        theory = None
        if params:
            p = params[int(np.flatnonzero(sel)[0])]
            model = get_model(p["model"])
            problem = model.make_problem(model.data_params(p))
            theory = stability_edge(problem, p, "momentum")
            if theory is not None:
                curves.append({"key": key, **_theory_curve(model, problem, p, mu[sel], theory)})
        lower = theory.get("lower") if theory else None
        upper = theory["value"] if theory and math.isfinite(theory.get("value", math.nan)) else None
        edges.append({"key": key, "lower": lower, "upper": upper})
        for side, value in (("lower", lower), ("upper", upper)):
            if value is not None:
                lo, hi = measured_bracket(mu[sel], status[sel], side)
                text, st = _edge_sentence("μ", value, lo, hi, side, where)
                sentences.append(text)
                statuses.append(st)
        if theory is None:
            lo, hi = measured_bracket(mu[sel], status[sel], "lower")
            sentences.append(f"Stability edge{' at ' + where if where else ''}: replicas diverged up to μ = {num(lo)}, "
                             f"none from μ = {num(hi)}; no exact edge theory for this model and noise")
    found = agreement(ds, "weight_var", "Weight variance at the stable μ", confidence, mask=status == 0, fits=fits)
    if found:
        sentences.append(found[0])
        statuses.append(found[1])
    figure = ("momentum_edge", "weight variance against momentum with the exact stability edge",
              lead_figures.momentum, (ds, edges, curves))
    return Headline("momentum", sentences, _combine(statuses), figure)


#: The momentum lead's theory curve: at most this many μ values, and only for problems with at
#: most this many weights (each value is one exact second-moment solve).
CURVE_POINTS, CURVE_MAX_WEIGHTS = 48, 16


def _theory_curve(model: Any, problem: Any, params: Mapping[str, Any], mu: np.ndarray,
                  edge: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The exact weight variance over μ between the swept values, inside the stable range (and
    dense towards the edge, where it diverges); empty for large problems (:data:`CURVE_MAX_WEIGHTS`)."""
    from sgdsweep.models.predict import predict

    lo = max(float(mu.min()), edge.get("lower") if edge.get("lower") is not None else -math.inf)
    hi = min(float(mu.max()), edge["value"] if math.isfinite(edge.get("value", math.nan)) else math.inf)
    if not hi > lo:
        return {"mu": np.array([]), "theory": np.array([])}
    gap = hi - lo
    grid = lo + gap * (1 - np.cos(np.linspace(1e-3, np.pi / 2, CURVE_POINTS // 2))) if edge.get("lower") else []
    grid = np.unique(np.r_[grid, np.linspace(lo + gap * 1e-3, hi, CURVE_POINTS // 2)])
    values = []
    for m in grid:
        pred = predict(problem, {**params, "momentum": float(m)})
        cov = pred.weight_cov
        if cov is None or cov.shape[0] > CURVE_MAX_WEIGHTS:
            return {"mu": np.array([]), "theory": np.array([])}
        values.append(float(np.trace(cov) / cov.shape[0]))
    return {"mu": grid, "theory": np.array(values)}


#: A fit's headline lists at most this many groups' estimates (then says how many more).
MAX_HEADLINE_GROUPS = 6


def _fit_sentences(kind: str, fits: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The headline sentences of one fit and the statuses of its verdicts
    (:func:`sgdsweep.analysis.fit.verdict.assess`): a single group's verdict in full; for
    several, per headline quantity every group's estimate [interval] (up to
    :data:`MAX_HEADLINE_GROUPS`) and in how many the exact theory lies inside."""
    results = [r for r in fits.get(kind) or [] if r.get("params") and not r.get("error")]
    statuses = [v.status for v in assess({kind: fits.get(kind) or []})]
    if len(results) == 1:
        v = judge(kind, results[0])
        return [NAMES[kind] + (f" at {v.where}" if v.where else "") + ": " + "; ".join(v.sentences)], statuses
    sentences = []
    for name in HEADLINE[kind]:
        qs = [(r.get("group", {}), r["params"][name]) for r in results
              if (r["params"].get(name) or {}).get("estimate") is not None]
        if not qs:
            continue
        listed = "; ".join(f"{num(q['estimate'])} [{num(q['interval'][0])}, {num(q['interval'][1])}]"
                           + (f" at {where(g)}" if g else "") for g, q in qs[:MAX_HEADLINE_GROUPS])
        text = (f"{NAMES[kind]} in {len(qs)} groups, {SYMBOLS.get(name, name)} = {listed}"
                + (f"; {len(qs) - MAX_HEADLINE_GROUPS} more in the fit's section" if len(qs) > MAX_HEADLINE_GROUPS
                   else ""))
        theories = {num(q["theory"]) for _, q in qs if q.get("theory") is not None}
        judged = [q["theory_inside"] for _, q in qs if q.get("theory_inside") is not None]
        if judged:
            text += (f"; exact theory {theories.pop() if len(theories) == 1 else 'per group'} inside the interval "
                     f"in {sum(judged)} of {len(judged)}")
        rejected = sum(bool(q.get("disagrees")) for _, q in qs)  # outside is not rejected: the family decides
        if rejected:
            text += f"; the report's family rejects {rejected}: DISAGREES"
        sentences.append(text)
    if kind == "wigner":
        consistent = [bool(r.get("wigner_consistent")) for r in results]
        sentences.append(f"spacings consistent with the Wigner surmise (KS) in {sum(consistent)} of {len(consistent)}")
    return sentences, statuses


def headline(requested: str | None, ds: xr.Dataset, fits: Mapping[str, Any], config: Mapping[str, Any],
             confidence: float = 0.95) -> Headline:
    """The headline of the report of ``ds`` (module docstring) for ``report.lead`` =
    ``requested`` (``auto`` or None: :func:`sgdsweep.sweep.lead.resolve`). A requested lead
    the data cannot show falls back to ``auto``'s, with a note that says so."""
    lead = leads.resolve(requested, ds, fits)
    out = _build(lead, ds, fits, config, confidence)
    if out is None:
        fallback = leads.resolve("auto", ds, fits)
        out = _build(fallback, ds, fits, config, confidence) or Headline(fallback, [], "neutral")
        out.notes.append(f"report.lead = {lead}: this sweep holds nothing to draw it; leading with {out.lead} instead")
    if not out.sentences:
        out.sentences.append("No measurement with an exact theory to compare it with")
    # every lead but escape states the stationary state, which a short burn-in may not have reached
    note = None if out.lead == "escape" else short_burn_in_note(ds, _compared(ds), lambda i: _where(ds, i, _swept(ds)))
    if note:
        out.notes.append(note)
    return out


def _compared(ds: xr.Dataset) -> np.ndarray:
    """Per point, whether it has a stationary theory value (weight_var's or the loss's) and no
    diverged replica: the points whose short burn-in a headline warns of."""
    keep = np.zeros(ds.sizes["point"], bool)
    for theory in ("weight_var_theory", "loss_theory"):
        if theory in ds:
            keep |= np.isfinite(np.asarray(ds[theory].values, float))
    if "diverged" in ds:
        keep &= ~np.asarray(ds["diverged"].values, bool)
    return keep


def _build(lead: str, ds: xr.Dataset, fits: Mapping[str, Any], config: Mapping[str, Any],
           confidence: float) -> Headline | None:
    from sgdsweep.analysis import figures, lead_figures, spectra_figures

    if lead == "momentum":
        return _momentum(ds, fits, config, confidence) if leads.varying(ds, "momentum") else None
    if lead in ("weight_var", "loss"):
        name = lead
        if name not in ds or not np.isfinite(np.asarray(ds[name].values, float)).any():
            return None
        label = "Weight variance" if name == "weight_var" else "Training loss"
        found = agreement(ds, name, label, confidence, fits=fits)
        sentences, status = ([found[0]], found[1]) if found else (
            [(f"{label}: measured from {num(np.nanmin(ds[name].values))} to {num(np.nanmax(ds[name].values))}; "
             "no exact theory for this model to compare with")], "neutral")
        fitted = [r for r in fits.get("power_law") or [] if r.get("params") and not r.get("error")]
        if name == "weight_var" and len(fitted) == 1:  # its exponents: the default sweep's question
            more, more_status = _fit_sentences("power_law", fits)
            sentences += more
            status = _combine([status, *more_status])
        if name == "weight_var" and not leads.single_ratio(ds):
            fig = ("weight_var", "weight variance against lr/batch_size", figures.weight_var_against_ratio, (ds,))
        else:
            axis = _x_axis(ds, ("lr", "batch_size"))
            fig = (f"lead_{name}_against_{axis}", f"{name} against {axis}", figures.against_axis,
                   (ds, axis, figures.MAX_GROUPS, (name,))) if axis else None
        return Headline(lead, sentences, status, fig)
    if lead == "escape":
        results = fits.get("escape") or []
        if not any(r.get("params") for r in results):
            return None
        fitted, statuses = _fit_sentences("escape", fits)
        sentences = []
        exact = agreement(ds, "escape_time", "Mean escape time τ", confidence, theory="escape_time_theory_exact",
                          words="the exact discrete chain's τ", fits=fits)
        if exact:  # the measured τ against the exact chain's first, then the fit of the slope
            sentences.append(exact[0])
            statuses.append(exact[1])
        sentences += fitted
        return Headline(lead, sentences, _combine(statuses),
                        ("escape_all", "escape time against 1/lr", lead_figures.escape_overview, (ds, results)))
    if lead == "isotropy":
        found = agreement(ds, "joint_eigenvalue", "Joint fluctuations on the range of Γ, mean stiff eigenvalue",
                          confidence, words="the leading-order isotropic value λ⟨r²⟩/(2S)", fits=fits,
                          exact=False)
        if found is None:
            return None
        sentences = [found[0]]
        if "joint_anisotropy" in ds and np.isfinite(ds["joint_anisotropy"].values).any():
            a = np.asarray(ds["joint_anisotropy"].values, float)
            sentences.append("anisotropy (std/mean of those eigenvalues, 0 when isotropic) from "
                             f"{num(np.nanmin(a), 3)} to {num(np.nanmax(a), 3)}")
        return Headline(lead, sentences, found[1], ("isotropy", ("joint fluctuation spectrum against its isotropic "
                                                    "value"), lead_figures.isotropy, (ds,)))
    if lead in ("flatness", "wigner"):
        if not any(r.get("params") for r in fits.get(lead) or []):
            return None
        sentences, statuses = _fit_sentences(lead, fits)
        if lead == "wigner" and any(r.get("params") for r in fits.get("wigner_width") or []):
            more, more_status = _fit_sentences("wigner_width", fits)
            sentences += more
            statuses += more_status
        make = spectra_figures.flatness if lead == "flatness" else spectra_figures.wigner
        return Headline(lead, sentences, _combine(statuses), (lead, NAMES[lead], make, (ds, fits[lead])))
    if lead == "fdr":
        found = agreement(ds, "fdr_residual", "Fluctuation–dissipation residual", confidence, fits=fits,
                          words="the residual the papers' relation leaves", exact=False)
        if found is None and "fdr_residual" not in ds:
            return None
        sentences, statuses = ([found[0]], [found[1]]) if found else ([], [])
        if found is None and np.isfinite(np.asarray(ds["fdr_residual"].values, float)).any():
            r = np.asarray(ds["fdr_residual"].values, float)
            sentences.append(f"fluctuation–dissipation residual from {num(np.nanmin(r), 3)} to {num(np.nanmax(r), 3)} "
                             "(measured; no exact value for this model)")
        for var, words in (("noise_whiteness", "gradient-noise whiteness max ‖D(m)‖/‖D(0)‖"),
                           ("q_ratio", "antisymmetric ratio max|Q|/max|D_sym|")):
            if var in ds and np.isfinite(ds[var].values).any():
                v = np.asarray(ds[var].values, float)
                sentences.append(f"{words} from {num(np.nanmin(v), 3)} to {num(np.nanmax(v), 3)} (measured; "
                                 "no exact value to compare with)")
        axis = _x_axis(ds)
        return Headline(lead, sentences, _combine(statuses), (f"lead_fdr_against_{axis}", "FDR residual",
                                                              figures.against_axis,
                                                              (ds, axis, figures.MAX_GROUPS, ("fdr_residual",))))
    if lead == "spectrum":
        if "weight_cov_eigenvalues" not in ds:
            return None
        axis = _x_axis(ds, ())
        sentences, statuses = _spectrum_sentences(ds, confidence, fits)
        return Headline(lead, sentences, _combine(statuses),
                        (f"lead_spectrum_against_{axis}", "covariance eigenvalues",
                         spectra_figures.spectrum_against_axis, (ds, axis)))
    return None


def _spectrum_sentences(ds: xr.Dataset, confidence: float,
                        fits: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """Measured/exact eigenvalues over every mode and point, the detailed-balance approximation's
    worst ratio to the exact one, and the weight variance's agreement (the statistical test:
    the eigenvalues carry no standard errors)."""
    sentences, statuses = [], []
    meas = np.asarray(ds["weight_cov_eigenvalues"].values, float)
    if "weight_cov_eigenvalues_theory" in ds:
        ratio = meas / np.asarray(ds["weight_cov_eigenvalues_theory"].values, float)
        ratio = ratio[np.isfinite(ratio)]
        if ratio.size:
            sentences.append(f"Covariance eigenvalues: measured/exact theory from {num(ratio.min(), 3)} to "
                             f"{num(ratio.max(), 3)} over {ratio.size} eigenvalues of {ds.sizes['point']} points "
                             "(no standard errors per eigenvalue)")
    balance = "weight_cov_eigenvalues_theory_detailed_balance"
    if balance in ds and "weight_cov_eigenvalues_theory" in ds:
        r = np.asarray(ds[balance].values, float) / np.asarray(ds["weight_cov_eigenvalues_theory"].values, float)
        if np.isfinite(r).any():
            sentences.append(f"the detailed-balance approximation gives from {num(np.nanmin(r), 3)} to "
                             f"{num(np.nanmax(r), 3)} of the exact eigenvalues")
    found = agreement(ds, "weight_var", "Weight variance", confidence, fits=fits)
    if found:
        sentences.append(found[0])
        statuses.append(found[1])
    return sentences, statuses

