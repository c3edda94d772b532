"""What each fit found, in words: the headline numbers and a verdict that counts the goodness of fit.

:func:`assess` turns the output of :func:`sgdsweep.analysis.fit.fit_ensemble` into :class:`Verdict` objects
(the report's first screen renders them); :func:`verdicts` gives the same as plain-text lines (one per
verdict, then one per fit that did not run) for a terminal summary.

A parameter reads ``a = 1.031 [1.028, 1.034]; exact theory 1.031 (inside); leading order 1
(outside: the correction beyond leading order that the exact theory predicts)``. A fit with a
goodness of fit says whether the fitted law describes the data at all, and when it does not, what
the deviations are: those of the exact theory (the measurements agree with it point by point), or
not. A verdict is ``good`` only when every theory value lies inside its interval and no deviation
is left unexplained; ``bad`` when a theory value lies outside, or the measurements disagree with
the exact theory; ``neutral`` when there is nothing to compare with (no theory value) or a law is
rejected without a theory that explains why.

Fits with more than :data:`MAX_LISTED` groups (or points) get one summary verdict each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sgdsweep.analysis.fit.escape import LAW_NAMES
from sgdsweep.models.base import SHORT_BURN_IN, SHORT_BURN_IN_FIX

#: Human names of the fits, in the order the report and the summary list them.
NAMES = {"power_law": "Power law weight_var = A·λ^a·S^b", "linear_scaling": "Linear scaling rule: collapse in λ/S",
         "momentum_scaling": "Momentum scaling: collapse in λ/((1−μ)S)",
         "escape": "Escape time: ln(λτ) against 1/λ", "wigner": "Random-matrix statistics of a degenerate pair",
         "wigner_width": "Pair width σ² = A·λ^a·S^b", "flatness": "Inverse variance–flatness exponent ψ"}
#: The fitted quantities each fit's verdict states (the headline numbers).
HEADLINE = {"power_law": ("a", "b"), "linear_scaling": ("spread2",), "momentum_scaling": ("spread2",),
            "escape": ("slope", "slope_exact"), "wigner": ("binder",), "wigner_width": ("a", "b"), "flatness": ("psi",)}
#: Symbols of the quantities in the verdicts.
SYMBOLS = {"spread2": "Δ²", "psi": "ψ", "binder": "Binder cumulant", "slope": "slope",
           "slope_exact": "slope (against the exact discrete chain)"}
#: Headline quantities whose ``theory`` is an approximate law, not an exact theory: the escape
#: slope's is Kramers' (its exact comparison is ``slope_exact``).
APPROXIMATE = {("escape", "slope")}
#: Why a leading-order value lies outside the interval when the exact theory lies inside.
BEYOND_LEADING = {"spread2": "the collapse is imperfect by as much as the exact theory predicts"}
#: A fit with more groups (or points) than this gets one summary verdict.
MAX_LISTED = 3


@dataclass
class Verdict:
    """One fit (one group of it, or all its groups summarised) in words.

    ``sentences``: the first states the headline numbers (estimate [interval], exact theory,
    leading order); the next say how well the law fits and what that means. ``status``: "good",
    "bad" or "neutral" (module docstring). ``numbers``: the headline values as printed.
    """

    fit: str
    where: str
    sentences: list[str]
    status: str
    numbers: list[str] = field(default_factory=list)
    #: Says how far a "good" status reaches when only some groups have a theory value.
    scope: str = ""

    @property
    def title(self) -> str:
        return NAMES.get(self.fit, self.fit) + (f" at {self.where}" if self.where else "")

    def text(self) -> str:
        """The verdict as one plain-text line."""
        return f"{self.title}: " + "; ".join(self.sentences) + (f" (agrees {self.scope})" if self.scope else "")


def num(x: float | None, digits: int = 4) -> str:
    """A number as the verdicts print it: ``digits`` significant digits, "—" for none."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.{digits}g}"


def pvalue(p: float) -> str:
    """A p-value as printed: two significant digits, or "p < 1e-30" below that."""
    return "p < 1e-30" if p < 1e-30 else f"p = {p:.2g}"


def _own_pvalue(q: dict[str, Any]) -> str:
    """A compared quantity's p-value as printed; where its null was drawn only until a 99.9 %
    bound of it fell below the report's Holm level (``pvalue_bound``), that bound:
    ``p < 0.00069``."""
    return f"p < {q['pvalue_bound']:.2g}" if q.get("pvalue_bound") is not None else pvalue(q["pvalue"])


def where(group: dict[str, Any]) -> str:
    """A group's values of the axes that were not fitted, as ``hidden_width = 2, lr = 0.01``."""
    return ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in group.items())


def _alpha(res: dict[str, Any]) -> float:
    return 1 - float(res.get("confidence", 0.95))


def parameter_sentence(name: str, q: dict[str, Any]) -> str:
    """``a = 1.031 [1.028, 1.034]; exact theory 1.031 (inside); leading order 1 (outside: …)``."""
    lo, hi = q["interval"]
    text = f"{SYMBOLS.get(name, name)} = {num(q['estimate'])} [{num(lo)}, {num(hi)}]"
    if q.get("theory") is not None:
        text += f"; exact theory {num(q['theory'])} ({_theory_word(q)})"
    lead = q.get("leading_order")
    if lead is not None and lo is not None and hi is not None:
        if lo <= lead <= hi:
            text += f"; leading order {num(lead)} (inside)"
        elif q.get("theory_inside"):
            why = BEYOND_LEADING.get(name, "the correction beyond leading order that the exact theory predicts")
            text += f"; leading order {num(lead)} (outside: {why})"
        else:
            text += f"; leading order {num(lead)} (outside)"
    return text


def disagrees(q: dict[str, Any]) -> bool | None:
    """Whether a compared quantity disagrees with its exact theory: the report-wide (Holm) decision
    of :mod:`sgdsweep.analysis.fit.family` where the fits carry one, else its own interval."""
    if "disagrees" in q:
        return bool(q["disagrees"])
    return None if q.get("theory_inside") is None else not q["theory_inside"]


def _theory_word(q: dict[str, Any]) -> str:
    """inside; DISAGREES (p-values); or outside its own interval but not rejected over the report.

    The decision is the family's (:func:`disagrees`). Where a quantity's p-value comes from a test
    other than its interval's (the collapse's exact null draws against its approximate score
    interval), the theory can lie inside the interval and still be rejected: said as such."""
    rejected = disagrees(q)
    if q.get("theory_inside") and not rejected:
        return "inside"
    if not rejected:
        return (f"outside the interval, {_own_pvalue(q)}; not a disagreement over the report's comparisons "
                f"(Holm-adjusted {pvalue(q['pvalue_holm'])})" if q.get("pvalue_holm") is not None else "outside")
    if q.get("pvalue") is None:
        return "OUTSIDE"
    adjusted = f", Holm-adjusted {pvalue(q['pvalue_holm'])}" if q.get("pvalue_holm") is not None else ""
    inside = "inside the interval, but " if q.get("theory_inside") else ""
    return f"{inside}DISAGREES: {_own_pvalue(q)}{adjusted}"


def _numbers(q: dict[str, Any]) -> list[str]:
    values = [q["estimate"], *q["interval"], q.get("theory"), q.get("leading_order")]
    return [num(v) for v in values if v is not None]


def _power_law_fit(res: dict[str, Any], law: str = "a pure power law") -> tuple[str, str]:
    """(sentence on the goodness of fit, status it implies: "good", "bad" or "neutral")."""
    p, red = res.get("chi2_pvalue"), res.get("chi2_reduced")
    if p is None or red is None:
        return f"no degrees of freedom left to test {law}", "good"
    stat = f"χ²/dof = {num(red, 3)}, {pvalue(p)}"
    agree = res.get("agreement_pvalue")
    agreement = (f"measured vs exact theory χ²/n = {num(res['agreement_chi2_reduced'], 3)}, {pvalue(agree)}"
                 + (f", Holm-adjusted {pvalue(res['agreement_pvalue_holm'])}"
                    if res.get("agreement_pvalue_holm") is not None else "")) if agree is not None else ""
    deviates = agree is not None and bool(res.get("agreement_disagrees", agree < _alpha(res)))
    if p >= _alpha(res):  # the law fits; the measurements may still sit off the exact theory (a shifted A)
        if deviates:
            return (f"{law} fits ({stat}), but the measurements deviate from the exact theory point by point "
                    f"({agreement})"), "bad"
        return f"{law} fits ({stat})", "good"
    if agree is None:
        return (f"{law} is rejected ({stat}): the exponents are those of the best-fitting power law, "
                + "not of an exact law", "neutral")
    if not deviates:
        return (f"{law} is rejected ({stat}): the deviations are those of the exact theory ({agreement})", "good")
    return f"{law} is rejected ({stat}) and the measurements deviate from the exact theory ({agreement})", "bad"


def _status(qs: list[dict[str, Any]], fit_status: str = "good") -> str:
    decided = [disagrees(q) for q in qs if disagrees(q) is not None]
    if fit_status == "bad" or True in decided:
        return "bad"
    return "good" if decided and fit_status == "good" else "neutral"


def _escape(res: dict[str, Any]) -> tuple[list[str], list[tuple[str, dict[str, Any]]], str]:
    """The escape fit's sentences, compared quantities and status. The exact discrete chain's slope
    (``slope_exact``) is the only comparison with an exact theory and decides the status; Kramers'
    and the power law's slopes are approximations: supported or not, never a disagreement."""
    slope, exact = res["params"]["slope"], res["params"].get("slope_exact")
    lo, hi = slope["interval"]
    text = f"slope = {num(slope['estimate'])} [{num(lo)}, {num(hi)}]"
    if exact is not None:
        text += f"; exact discrete chain {num(exact['theory'])} ({_theory_word(exact)})"
    sentences = [text]
    absent = res.get("laws_absent") or {}
    if slope.get("theory") is not None and "arrhenius" not in absent:
        sentences.append(f"Kramers slope {num(slope['theory'])} ({'inside' if slope['theory_inside'] else 'outside'})")
    if slope.get("theory_powerlaw") is not None and "powerlaw" not in absent:
        sentences.append(f"power-law escape slope {num(slope['theory_powerlaw'])} "
                         f"({'inside' if slope['theory_powerlaw_inside'] else 'outside'})")
    if absent:  # a law that does not hold at these points (fit_escape's laws_absent) is not compared
        sentences.append(f"{' and '.join(LAW_NAMES.get(k, k) for k in absent)} not compared (no prediction here)")
    laws = res.get("supported_laws") or []
    compared = [law for law in ("arrhenius", "powerlaw") if law not in absent]
    if compared:
        sentences.append("approximate law supported: " + ", ".join(LAW_NAMES.get(k, k) for k in laws) if laws else
                         "neither approximate law's slope is inside" if len(compared) > 1 else
                         f"{LAW_NAMES.get(compared[0], compared[0])}: slope not inside")
    return sentences, [("slope_exact", exact)] if exact is not None else [], "good"


def judge(kind: str, res: dict[str, Any]) -> Verdict:
    """The verdict of one group (one result) of the fit ``kind``."""
    here = where(res.get("group", {}))
    if res.get("error") or not res.get("params"):
        return Verdict(kind, here, [f"not fitted: {res.get('error', 'no parameters')}"], "neutral")
    qs = [(n, res["params"][n]) for n in HEADLINE[kind] if (res["params"].get(n) or {}).get("estimate") is not None]
    sentences = [parameter_sentence(n, q) for n, q in qs]
    numbers = [x for _, q in qs for x in _numbers(q)]
    fit_status = "good"
    if kind in ("power_law", "wigner_width"):
        missing = [n for n in ("a", "b") if res["params"].get(n) is None]
        if missing:
            sentences.append(" and ".join(missing) + " not identifiable (its axis has a single value)")
        sentence, fit_status = _power_law_fit(res)
        sentences.append(sentence)
    elif kind in ("linear_scaling", "momentum_scaling"):
        sentences.append(f"relative spread √Δ² = {num(res['relative_spread'], 3)}"
                         + (f" (exact theory {num(res['relative_spread_theory'], 3)})"
                            if res.get("relative_spread_theory") is not None else "")
                         + f"; measurement noise alone {num(res['noise_floor'], 3)} per point")
        spread = res["params"]["spread2"]
        if disagrees(spread) and spread.get("pvalue_tail") == "lower":  # rejected for too small a spread
            sentences.append("the points agree more closely than the theory's spread and their standard errors "
                             "allow: the standard errors overstate the noise, or the points are correlated")
    elif kind == "escape":
        sentences, qs, fit_status = _escape(res)
    elif kind == "wigner":
        consistent = not res["ks_disagrees"] if "ks_disagrees" in res else res["wigner_consistent"]
        sentences.append(f"Wigner surmise {'consistent' if consistent else 'REJECTED'} "
                         f"(KS {pvalue(res['ks_pvalue'])})")
        fit_status = "good" if consistent else "bad"
    elif kind == "flatness":
        sentences.append(f"r² = {num(res['r_squared'], 3)} over {res['n_modes']} modes, curvature spread "
                         f"{num(res['curvature_spread'], 3)}×")
        if res.get("excluded_modes"):  # round-off modes: left out of the fit, said here
            sentences.append(f"{res['excluded_modes']} mode(s) below the numerical floor "
                             f"({num(res.get('numerical_floor', 1e-10))} × the largest variance or curvature) excluded")
    status = _status([q for _, q in qs], fit_status)
    if status != "good" and res.get("short_burn_in"):
        sentences.append(short_burn_in_sentence(res["short_burn_in"]))
    return Verdict(kind, here, sentences, status, numbers)


def short_burn_in_sentence(count: int, whose: str = "its points") -> str:
    """What a verdict that is not "agrees" says of the ``count`` points of ``whose`` (the points it
    fitted) whose burn-in is short (:data:`~sgdsweep.models.base.SHORT_BURN_IN` relaxation times)."""
    one = count == 1
    return (f"{count} of {whose} {'has' if one else 'have'} a burn-in under {SHORT_BURN_IN:g} slowest relaxation "
            f"times: {'its' if one else 'their'} averages may still hold the relaxation from the start "
            f"({SHORT_BURN_IN_FIX})")


def _summary(kind: str, results: list[dict[str, Any]]) -> Verdict:
    """One verdict for a fit with many groups: how many fitted, the range of each headline
    quantity, how many theory values lie inside, how often the law is rejected."""
    per = [judge(kind, r) for r in results]
    fitted = [r for r in results if r.get("params") and not r.get("error")]
    unit = "points" if kind in ("wigner", "flatness") else "groups"
    sentences = [f"{len(fitted)} of {len(results)} {unit} fitted"]
    for name in HEADLINE[kind]:
        qs = [r["params"][name] for r in fitted if (r["params"].get(name) or {}).get("estimate") is not None]
        if not qs:
            continue
        est = [q["estimate"] for q in qs]
        text = f"{SYMBOLS.get(name, name)} from {num(min(est))} to {num(max(est))}"
        judged = [q["theory_inside"] for q in qs if q.get("theory_inside") is not None
                  and (kind, name) not in APPROXIMATE]
        if judged:
            text += f"; exact theory inside in {sum(judged)} of {len(judged)}"
        rejected = sum(bool(q.get("disagrees")) for q in qs)  # outside is not rejected: the family decides
        if rejected:
            text += f"; the report's family rejects {rejected}: DISAGREES"
        leads = [q for q in qs if q.get("leading_order") is not None and q["interval"][0] is not None]
        if leads:
            inside = sum(q["interval"][0] <= q["leading_order"] <= q["interval"][1] for q in leads)
            text += f"; leading order {num(leads[0]['leading_order'])} inside in {inside} of {len(leads)}"
        sentences.append(text)
    if kind in ("power_law", "wigner_width"):
        rejected = [r for r in fitted if r.get("chi2_pvalue") is not None and r["chi2_pvalue"] < _alpha(r)]
        if rejected:
            explained = sum(_power_law_fit(r)[1] == "good" for r in rejected)
            sentences.append(f"a pure power law is rejected in {len(rejected)} of {len(fitted)} groups "
                             f"(the deviations are those of the exact theory in {explained} of them)")
    failed = [r for r in results if r.get("error") or not r.get("params")]
    if failed:
        sentences.append(f"{len(failed)} not fitted ({failed[0].get('error', 'no parameters')})")
    statuses = [v.status for v in per]  # a group without a theory value says nothing against the others
    status = "bad" if "bad" in statuses else "good" if "good" in statuses else "neutral"
    short = sum(int(r.get("short_burn_in") or 0) for r, v in zip(results, per) if v.status != "good")
    if short:
        sentences.append(short_burn_in_sentence(short, f"the points of the {unit} that do not agree"))
    scope = (f"where it has one ({statuses.count('good')} of {len(results)} {unit})"
             if status == "good" and statuses.count("good") < len(results) else "")
    return Verdict(kind, f"all {len(results)} {unit}", sentences, status, scope=scope)


def assess(fits: dict[str, Any]) -> list[Verdict]:
    """The verdicts of every fit that ran, in the order of :data:`NAMES`: one per group, or one
    summary per fit with more than :data:`MAX_LISTED` groups."""
    out: list[Verdict] = []
    for kind in NAMES:
        results = fits.get(kind) or []
        if len(results) > MAX_LISTED:
            out.append(_summary(kind, results))
        else:
            out.extend(judge(kind, r) for r in results)
    return out


def verdicts(fits: dict[str, Any]) -> list[str]:
    """Plain-text lines for a terminal summary: one per verdict of :func:`assess` (prefixed by
    its status: "ok", "FAIL" or "note"), then one per declared fit that did not run, with why."""
    mark = {"good": "ok", "bad": "FAIL", "neutral": "note"}
    lines = [f"[{mark[v.status]}] {v.text()}" for v in assess(fits)]
    lines += [f"[not run] {NAMES.get(k, k)}: {why}" for k, why in (fits.get("skipped") or {}).items()]
    return lines
