"""Rounds: sweeps that extend their points until a precision target is met, or search an edge.

A sweep with ``precision:`` or ``search:`` (docs/precision.md) runs in *rounds*. Round 0 is the
config's own points. After a round, what the next one simulates is decided from the stored
results alone, so it is deterministic, and a killed or repeated run arrives at the same rounds:

- ``precision``: each point's measured standard errors give the replicas it still needs
  (``SE ∝ 1/√R``, :func:`replicas_needed`); a censored escape fraction or a measured
  window short against the loss autocorrelation time gives the steps it needs. A point extended
  by replicas keeps its lanes (:mod:`sgdsweep.store.lanes`): the next round simulates only the
  new replicas. Limits: ``precision.budget``.
- ``search``: a bisection for the stability edge, one new point per combination of the other
  axes and round (:mod:`sgdsweep.sweep.search`).

Rounds are global: round k + 1 starts when every point of round k is stored, so the budget is
charged in one order whatever the timing. :func:`resolve_rounds` turns a sweep's round-0 points
into the points of its current round, with :attr:`Sweep.rounds` saying why each one is there;
``sgdsweep run`` runs Snakemake once per round until nothing is pending.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from sgdsweep.core.identity import EXTENSIBLE, content_hash, points_digest
from sgdsweep.errors import ConfigError, PointName, StoreError
from sgdsweep.models import get_model
from sgdsweep.store import lanes as lanes_store
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import Point, Sweep, make_point

#: Smallest growth of a point's replicas (or steps) in a round that extends it, and the factor
#: on the steps that censoring or the autocorrelation time ask for: falling just short of a
#: target costs a whole round.
MARGIN = 1.1
#: Largest growth of a point's replicas in one round: estimates from few replicas are noisy, so
#: a round goes at most this far before measuring again (:func:`replicas_needed`).
ROUND_GROWTH = 4
#: Shortest measured window, in loss autocorrelation times: below it each replica's time
#: average rests on a handful of independent stretches, and what the burn-in left weighs on it;
#: the replicas' spread does not show that, so such a point gets more steps (docs/precision.md).
MIN_WINDOW_AUTOCORR = 10.0
#: Largest growth of a point's replicas or steps in one round.
MAX_GROWTH = 64
#: Default of ``precision.budget.disk`` (the schema's): the disk the stored lanes may take.
DEFAULT_DISK = "20GiB"


@dataclasses.dataclass
class _State:
    base: Point
    replicas: int
    steps: int
    point: Point
    status: str | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    spent: dict[int, int] = dataclasses.field(default_factory=dict)  # steps → replicas simulated
    hashes: list[str] = dataclasses.field(default_factory=list)  # the point's hash in each round

    def move(self, point: Point) -> None:
        """Make ``point`` the state's point of the next round."""
        self.point = point
        self.hashes.append(point.hash)


def stored_summary(sweep: Sweep, point: Point) -> dict[str, Any] | None:
    """The summary of ``point``'s complete store in ``sweep``; None when there is none (or it is
    damaged: the next run recomputes it like any other store)."""
    path = point_store.point_path(sweep.directory / "points", point.hash)
    if not path.exists():
        return None
    try:
        return point_store.read_attrs(path)["summary"]
    except StoreError:
        return None  # damaged: recomputed by the next run like any other store


def _ceil(x: float) -> int:
    """Smallest integer ≥ ``x``, ignoring rounding error (4.4000000000000004 · 100 → 440)."""
    return math.ceil(round(x, 9))


def _percent(x: float) -> str:
    return f"{100 * x:.3g} %"


def replicas_needed(replicas: int, rel: float, target: float) -> int:
    """Replicas for the next round of a point whose relative standard error ``rel`` at
    ``replicas`` replicas is above ``target``.

    A standard error falls as 1/√R, so the target needs about ``R (rel/target)²``. That estimate
    is itself noisy (its relative error is about √(2/(R−1)), more for skewed observables), and
    an overestimate is spent for good while an underestimate costs only another round: the next
    round asks for the estimate divided by 1 + √(2/(R−1)), at most :data:`ROUND_GROWTH` times
    the replicas, and at least :data:`MARGIN` times them.
    """
    estimate = replicas * (rel / target) ** 2 / (1 + math.sqrt(2 / max(1, replicas - 1)))
    return max(_ceil(replicas * MARGIN), min(_ceil(estimate), ROUND_GROWTH * replicas))


def needs(summary: Mapping[str, Any], replicas: int, steps: int, burn_in: int,
          observables: Mapping[str, Mapping[str, float]]) -> tuple[int, int, list[str]] | str:
    """What one stored point still needs to meet ``observables`` (``precision.observables``).

    Returns:
        (replicas, steps, reasons) — the size that should meet every target (unchanged when it
        is met) and one line per unmet target, e.g. ``weight_var rel SE 1.2 % > 0.5 %: +320
        replicas`` — or a string saying why no size can (an observable that is not defined).
    """
    r_new, t_new, reasons = replicas, steps, []
    window = steps - burn_in
    for name, target in observables.items():
        if name == "escape_time":
            alive = replicas - int(summary.get("diverged_replicas") or 0)
            censored = int(summary.get("escape_censored") or 0)
            frac = censored / alive if alive else 1.0
            limit = target.get("censored_fraction")
            if limit is not None and frac > limit:
                # survival ~ exp(−T/τ): T' = T · ln(1/limit) / ln(1/frac)
                grow = math.log(1 / limit) / math.log(1 / frac) * MARGIN if frac < 1 else 4.0
                t = _ceil(steps * min(grow, MAX_GROWTH))
                t_new = max(t_new, t)
                reasons.append(f"escape_time censored {_percent(frac)} > {_percent(limit)}: steps {steps} → {t}")
        tau, se = summary.get(name), summary.get(f"{name}_se")
        if "rel_se" not in target:
            continue
        if tau is None or se is None or tau == 0:
            if name == "escape_time":
                t = steps * 4
                t_new = max(t_new, t)
                reasons.append(f"escape_time: no replica escaped: steps {steps} → {t}")
                continue
            return (f"{name} has no standard error at this point (fewer than two replicas measured it: they "
                    "diverged, or it is not observed)")
        rel = abs(se / tau)
        if rel > target["rel_se"] and name == "escape_time":
            # τ's SE is τ/√k with k replicas escaped: the target needs k = 1/rel_se² of them, at
            # the escaped fraction measured (a count, not a spread: no estimate to hold back)
            escaped = max(1, alive - censored)
            wanted = math.ceil(round(1 / target["rel_se"] ** 2, 9)) * alive / escaped
            r = max(_ceil(replicas * MARGIN), min(_ceil(wanted), ROUND_GROWTH * replicas))
            r_new = max(r_new, r)
            reasons.append(f"{name} rel SE {_percent(rel)} > {_percent(target['rel_se'])}: +{r - replicas} replicas")
        elif rel > target["rel_se"]:
            r = replicas_needed(replicas, rel, target["rel_se"])
            r_new = max(r_new, r)
            reasons.append(f"{name} rel SE {_percent(rel)} > {_percent(target['rel_se'])}: +{r - replicas} replicas")
        autocorr = summary.get("loss_autocorr_time")
        if name != "escape_time" and autocorr and window < MIN_WINDOW_AUTOCORR * autocorr:
            t = burn_in + _ceil(MIN_WINDOW_AUTOCORR * autocorr * MARGIN)
            if t > t_new:
                t_new = t
                reasons.append(f"measured window {window} steps < {MIN_WINDOW_AUTOCORR:g} loss autocorrelation "
                               f"times ({autocorr:.3g} steps each): steps {steps} → {t}")
    return r_new, t_new, reasons


def _spend(state: _State) -> int:
    return sum(r * t for t, r in state.spent.items())


def _at(sweep: Sweep, model, state: _State, replicas: int, steps: int) -> Point:
    params = {**state.base.params, "replicas": replicas, "steps": steps, EXTENSIBLE: True}
    point = make_point(model, params, PointName({a: params[a] for a in sweep.coords if a in params}),
                       sweep.footprints)  # type: ignore[arg-type]
    return dataclasses.replace(point, lanes=lanes_store.lanes_key(point.params))


def fit_half_widths(fits: Mapping[str, Any], targets: Mapping[str, float]) -> dict[str, float | None]:
    """Per fit target ``kind.param``, the largest half-width of its interval over the fit's
    groups in ``fits`` (``fits.json``); None when the fit has no such interval."""
    out: dict[str, float | None] = {}
    for name in targets:
        kind, param = name.split(".", 1)
        widths = []
        for res in fits.get(kind, []) if isinstance(fits.get(kind), list) else []:
            q = (res.get("params") or {}).get(param) or {}
            lo, hi = (q.get("interval") or [None, None])[:2]
            if lo is not None and hi is not None:
                widths.append((hi - lo) / 2)
        out[name] = max(widths) if widths else None
    return out


def fit_archive_name(made_from: Mapping[str, Any]) -> str:
    """File name of the fits made from one set of points with one fit config, in
    ``rounds/fits/``: ``<points digest>-<fit config hash>.json``."""
    return f"{made_from['points_digest']}-{made_from['spec_hash']}.json"


def _fit_round(sweep: Sweep, model, states: list[_State], k: int, targets: Mapping[str, float],
               budget: Mapping[str, Any], total: int, log: dict[str, tuple[int, float]]) -> int:
    """After every point has settled at round ``k``: extend the points that met their targets
    when a fit's interval is wider than its target (``precision.fits``), read from the fits made
    from exactly the current points (``rounds/fits/<points digest>.json``, which the workflow's
    fit job keeps, or ``fits.json``). An interval's half-width
    falls as 1/√R too, so every point's replicas grow by ``(half-width / target)²``
    (:func:`replicas_needed`). When, after the replicas at least doubled since ``log`` (target →
    replicas in all and half-width then), it did not fall at least as the fourth root of the
    replicas, the interval is not set by the noise and the points stop; a fit that gives the
    target no interval stops them too. Returns the replica-steps the extension adds (0: none)."""
    import json

    current = [s for s in states if s.status == "met"]
    made_from = {"points_digest": points_digest(s.point.hash for s in states),
                 "spec_hash": content_hash(sweep.config["fit"])}
    fits: dict[str, Any] = {}
    for path in (sweep.directory / "rounds" / "fits" / fit_archive_name(made_from), sweep.directory / "fits.json"):
        try:
            fits = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        settings = fits.get("settings") or {}
        if all(settings.get(k) == v for k, v in made_from.items()):
            break
        fits = {}
    if not current or not fits:
        for s in current:  # the fit of this round is still to be made (by the workflow's fit job)
            s.status = "pending fit"
        return 0
    widths = fit_half_widths(fits, targets)
    missing = [n for n, w in widths.items() if w is None]
    if missing:
        kind = missing[0].split(".")[0]
        why = (fits.get("skipped") or {}).get(kind, "the fit gives it no interval")
        for s in current:
            s.status = f"stopped: no interval of {missing[0]} ({why})"
        return 0
    unmet = {n: w for n, w in widths.items() if w > targets[n]}
    if not unmet:
        return 0
    if k == budget["max_rounds"]:
        for s in current:
            s.status = f"budget: max_rounds = {budget['max_rounds']}"
        return 0
    worst = max(unmet, key=lambda n: unmet[n] / targets[n])
    replicas = sum(s.replicas for s in current)
    before, hw_before = log.get(worst, (replicas, unmet[worst]))
    if replicas >= 2 * before:  # after at least doubling, it should have narrowed about as 1/√R
        if unmet[worst] > hw_before * (before / replicas) ** 0.25:
            for s in current:
                s.status = (f"stopped: {worst} half-width {hw_before:.3g} → {unmet[worst]:.3g} from {before} to "
                            f"{replicas} replicas in all: the interval is set by the fit's model, not by the noise")
            return 0
        log[worst] = (replicas, unmet[worst])
    log.setdefault(worst, (replicas, unmet[worst]))
    reasons = [f"{n} half-width {w:.3g} > {targets[n]:.3g}" for n, w in unmet.items()]
    added = 0
    for s in current:
        r = min(replicas_needed(s.replicas, unmet[worst], targets[worst]), budget["max_replicas"])
        if r <= s.replicas:
            s.status = f"budget: max_replicas = {budget['max_replicas']}"
            continue
        cost = (r - s.replicas) * s.steps
        if total + cost > budget["max_replica_steps"]:
            s.status = f"budget: max_replica_steps = {budget['max_replica_steps']:.3g}"
            continue
        total += cost
        added += cost
        s.status = None
        s.history.append({"round": k + 1, "replicas": r, "steps": s.steps,
                          "reasons": [f"{'; '.join(reasons)}: +{r - s.replicas} replicas"]})
        s.replicas = r
        s.move(_at(sweep, model, s, r, s.steps))
    return added


#: Per observable that a target may name, the ``dynamics.observe`` switch it needs (None: always
#: measured).
_OBSERVED_BY = {"weight_var": None, "loss": "loss", "loss_autocorr_time": "loss", "test_loss": "test_loss",
                "escape_time": "escape"}


def _measured(point: Point, name: str) -> bool:
    """Whether ``point``'s store will hold the observable ``name`` (a precision target's)."""
    switch = _OBSERVED_BY.get(name)
    if switch is not None and not point.params["observe"][switch]:
        return False
    if name == "test_loss":  # a model's problem may define none (no held-out set, no expectation)
        from sgdsweep.models import make_problem
        from sgdsweep.sim.results import problem_probe

        problem = make_problem(point.params)
        return problem.test_loss(problem_probe(problem)) is not None
    return True


def _check_targets(sweep: Sweep) -> None:
    """Refuse a target on a quantity the sweep's points do not measure: without it every round
    would find the target unmet (an escape time on a model with no basin to escape from asks for
    4 × the steps each round until the budget runs out)."""
    from sgdsweep.models import observing

    kind = sweep.config["model"]["kind"]
    observables = sweep.config["precision"].get("observables", {})
    firsts = list({p.data_set: p for p in sweep.points}.values())  # one point per problem and dynamics
    measured = [n for n in _OBSERVED_BY if all(_measured(p, n) for p in firsts)]
    for name in observables:
        if name in measured:
            continue
        switch = _OBSERVED_BY[name]
        if name == "escape_time" and kind not in observing("escape"):
            why = (f"model.kind {kind} has no basin to escape from: only model.kind "
                   f"{', '.join(observing('escape'))} measures escape_time")
        elif switch is not None and not all(p.params["observe"][switch] for p in firsts):
            why = f"dynamics.observe.{switch} is off: set it to true to measure {name}"
        else:
            why = f"model.kind {kind} defines no {name} for these points"
        raise ConfigError(f"precision.observables.{name}", observables[name],
                          f"a target on a quantity that model.kind {kind} measures here: {', '.join(measured)}",
                          f"{why}; without it no round could meet the target. Remove the target or change "
                          "the model")
    for name in sweep.config["precision"].get("fits", {}):
        if name.startswith("escape.") and "escape_time" not in measured:
            raise ConfigError(f"precision.fits.{name}", sweep.config["precision"]["fits"][name],
                              f"a fit of a quantity that model.kind {kind} measures here: {', '.join(measured)}",
                              f"The escape fit needs escape times, which only model.kind "
                              f"{', '.join(observing('escape'))} measures, with dynamics.observe.escape on. "
                              "Remove the target or change the model")


@dataclasses.dataclass(frozen=True)
class LaneDisk:
    """The disk a precision sweep's stored lanes may take (bytes): ``total``, the sum over its
    ``points`` of ``max_replicas`` replicas × the bytes of one replica's lanes (``per_replica``,
    the largest of the sweep's; :attr:`sgdsweep.sweep.cost.Footprint.lane_bytes`) of a
    ``dim``-parameter model; ``limit``, ``precision.budget.disk``."""

    total: int
    points: int
    max_replicas: int
    per_replica: int
    dim: int
    limit: int


def disk_limit(budget: Mapping[str, Any]) -> int:
    """``precision.budget.disk`` in bytes (:func:`dask.utils.parse_bytes`: ``20GB``, ``20G``,
    ``1.5TiB`` or a number of bytes).

    Raises:
        ConfigError: naming the key, what was given and what is allowed.
    """
    from dask.utils import parse_bytes

    value = budget.get("disk", DEFAULT_DISK)
    try:
        limit = parse_bytes(value)
    except (ValueError, TypeError, OverflowError):  # OverflowError: a size beyond a float ('1e400')
        limit = 0
    if limit < 1:
        raise ConfigError("precision.budget.disk", value, "a size of at least 1 byte: a number of bytes or a "
                          "size such as 500MB, 20GB, 20G, 1.5TiB",
                          "It limits the disk the points' stored lanes may take")
    return int(limit)


def lane_disk(sweep: Sweep) -> LaneDisk:
    """The :class:`LaneDisk` of a precision sweep: each point may grow to
    ``precision.budget.max_replicas`` replicas, and keeps every replica's lanes (one set per
    number of steps it runs: a point whose steps grow starts new lanes beside the earlier ones,
    which this estimate does not count)."""
    budget = sweep.config["precision"]["budget"]
    sizes = [sweep.footprints[p.data_set] for p in sweep.points]
    per_replica = max((f.lane_bytes for f in sizes), default=0)
    dim = max((f.dim for f in sizes), default=0)
    total = sum(f.lane_bytes for f in sizes) * int(budget["max_replicas"])
    return LaneDisk(total, len(sizes), int(budget["max_replicas"]), per_replica, dim, disk_limit(budget))


def _check_disk(sweep: Sweep) -> None:
    """Refuse a sweep whose lanes may take more disk than ``precision.budget.disk``."""
    from sgdsweep.sweep.cost import format_bytes

    est = lane_disk(sweep)
    if est.total <= est.limit:
        return
    fitting = est.limit // max(1, est.total // est.max_replicas)
    first = max(int(p.params["replicas"]) for p in sweep.points)
    lower = (f"lower precision.budget.max_replicas to {fitting} or fewer, " if fitting >= max(2, first)
             else "")
    raise ConfigError(
        "precision.budget.disk", sweep.config["precision"]["budget"].get("disk", DEFAULT_DISK),
        f"at least the estimated disk of the stored lanes, {format_bytes(est.total)}",
        f"Each of the {est.points} point(s) may grow to precision.budget.max_replicas = {est.max_replicas} "
        f"replicas, and a precision sweep keeps every replica's lanes (its accumulators, "
        f"{format_bytes(est.per_replica)} per replica of a d = {est.dim} model) under "
        f"{sweep.directory / 'points' / lanes_store.LANES_DIR}: {format_bytes(est.total)} against "
        f"{format_bytes(est.limit)}. To fix it, {lower}sweep fewer points, observe the full covariance of fewer "
        "parameters (dynamics.observe.cov_max_dim below d keeps its diagonal), or raise precision.budget.disk "
        "if the disk has the space")


def _check_precision(sweep: Sweep, budget: Mapping[str, Any]) -> None:
    """Refuse what rounds cannot do: sizes swept (the rounds decide them), a budget below the
    first round's size, a fit target on a fit that is not enabled, a target on a quantity the
    points do not measure (:func:`_check_targets`), lanes estimated beyond the disk budget
    (:func:`_check_disk`)."""
    for key in ("replicas", "steps"):
        if key in sweep.coords:
            raise ConfigError(f"grid.{key}", [p.params[key] for p in sweep.points][:4],
                              f"one dynamics.{key} for every point of a sweep with precision targets",
                              f"The rounds decide each point's {key}; set the first round's in dynamics.{key}.")
    for key, limit in (("replicas", "max_replicas"), ("steps", "max_steps")):
        first = max(int(p.params[key]) for p in sweep.points)
        if budget[limit] < first:
            raise ConfigError(f"precision.budget.{limit}", budget[limit], f"at least dynamics.{key} = {first}",
                              f"The budget limits how far the rounds extend the first round's {key}.")
    for name in sweep.config["precision"].get("fits", {}):
        kind = name.split(".")[0]
        if not sweep.config["fit"].get(kind, {}).get("enabled", True):
            raise ConfigError(f"precision.fits.{name}", sweep.config["precision"]["fits"][name],
                              f"a target of an enabled fit (fit.{kind}.enabled is false)",
                              f"Enable fit.{kind} or remove the target.")
    _check_targets(sweep)
    _check_disk(sweep)


def round_zero(sweep: Sweep) -> list[Point]:
    """The first round's points of a precision sweep built without its rounds
    (``build_sweep(config, rounds=False)``): its points made extensible. Reads no store."""
    model = get_model(sweep.config["model"]["kind"])
    states = [_State(base=p, replicas=int(p.params["replicas"]), steps=int(p.params["steps"]), point=p)
              for p in sweep.points]
    return [_at(sweep, model, s, s.replicas, s.steps) for s in states]


def _precision_rounds(sweep: Sweep) -> Sweep:
    cfg = sweep.config["precision"]
    budget = cfg["budget"]
    observables = cfg.get("observables", {})
    fit_targets = cfg.get("fits", {})
    fit_log: dict[str, tuple[int, float]] = {}
    model = get_model(sweep.config["model"]["kind"])
    _check_precision(sweep, budget)
    states = []
    for p in sweep.points:
        r, t = int(p.params["replicas"]), int(p.params["steps"])
        st = _State(base=p, replicas=r, steps=t, point=p)
        st.move(_at(sweep, model, st, r, t))
        states.append(st)
    total = sum(s.replicas * s.steps for s in states)
    rounds = 0
    for k in range(budget["max_rounds"] + 1):
        rounds = k
        summaries = {id(s): stored_summary(sweep, s.point) for s in states if s.status is None}
        if any(v is None for v in summaries.values()):
            for s in states:
                if s.status is None and summaries[id(s)] is None:
                    s.status = "pending"
            break
        advanced = False
        for s in states:
            if s.status is not None:
                continue
            s.spent[s.steps] = max(s.spent.get(s.steps, 0), s.replicas)
            need = needs(summaries[id(s)], s.replicas, s.steps, s.point.burn_in, observables)
            if isinstance(need, str):
                s.status = f"stopped: {need}"
                continue
            r, t, reasons = need
            if not reasons:
                s.status = "met"
                continue
            if k == budget["max_rounds"]:
                s.status = f"budget: max_rounds = {budget['max_rounds']}"
                continue
            limited = []
            if r > budget["max_replicas"]:
                r, limited = budget["max_replicas"], [*limited, f"max_replicas = {budget['max_replicas']}"]
            if t > budget["max_steps"]:
                t, limited = budget["max_steps"], [*limited, f"max_steps = {budget['max_steps']}"]
            if (r, t) == (s.replicas, s.steps):
                s.status = "budget: " + ", ".join(limited)
                continue
            cost = r * t - (s.spent.get(t, 0) * t)
            if total + cost > budget["max_replica_steps"]:
                s.status = f"budget: max_replica_steps = {budget['max_replica_steps']:.3g}"
                continue
            total += cost
            if limited:  # the reasons say what was asked for; the round takes what the budget allows
                reasons = [*reasons, f"held to {r} replicas × {t} steps by {', '.join(limited)}"]
            s.history.append({"round": k + 1, "replicas": r, "steps": t, "reasons": reasons})
            s.replicas, s.steps = r, t
            s.move(_at(sweep, model, s, r, t))
            advanced = True
        if not advanced and fit_targets:
            added = _fit_round(sweep, model, states, k, fit_targets, budget, total, fit_log)
            total += added
            advanced = added > 0
        if not advanced:
            break
    for s in states:
        if s.status is None:
            s.status = "pending"
    info = {"kind": "precision", "round": rounds, "replica_steps": sum(_spend(s) for s in states),
            "points": {s.point.hash: {
                "base": s.base.hash, "status": s.status, "replicas": s.replicas, "steps": s.steps,
                "rounds": len(s.history), "replica_steps": _spend(s), "history": s.history, "hashes": s.hashes}
                for s in states}}
    return dataclasses.replace(sweep, points=tuple(s.point for s in states), rounds=info, _shards={})


def resolve_rounds(sweep: Sweep) -> Sweep:
    """The sweep at its current round (module docstring): ``sweep`` itself when it has neither
    ``precision`` nor ``search``; else its points replaced by the current round's (precision) or
    by every point evaluated so far (search), reading the stored results under
    ``sweep.directory``, with :attr:`Sweep.rounds` describing each.

    Raises:
        ConfigError: both sections set, or a search combination with fewer than two values.
    """
    has_precision, has_search = "precision" in sweep.config, "search" in sweep.config
    if has_precision and has_search:
        raise ConfigError("search", sweep.config["search"], "no search in a sweep with precision targets",
                          "A sweep either extends its points to a precision or searches an edge; "
                          "split it into two sweeps.")
    if has_precision:
        return _precision_rounds(sweep)
    if has_search:
        from sgdsweep.sweep.search import search_rounds

        return search_rounds(sweep)
    return sweep


def extension_reasons(sweep: Sweep) -> dict[str, str]:
    """Point hash → why the current round simulates it (its last extension's reasons), for the
    points that a round extended."""
    info = sweep.rounds
    out = {}
    if info and info["kind"] == "precision":
        for h, p in info["points"].items():
            if p["history"]:
                last = p["history"][-1]
                out[h] = f"round {last['round']}: " + "; ".join(last["reasons"])
    return out
