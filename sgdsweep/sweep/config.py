"""From a YAML config to a frozen :class:`Sweep`: validation, defaults, points, identity.

Every check runs here, before any job starts: the schema (types, ranges, unknown keys), the
grid (duplicates, zip groups), the report's lead (:func:`sgdsweep.sweep.lead.check`), and per
point the model's own constraints (its hooks in
:mod:`sgdsweep.models`: noise types, observables, ``check_point``, ``check_dynamics``) and the
burn-in (resolved from the problem's slowest relaxation time when ``auto``, and required to be
shorter than ``steps``). No model is named here: what differs between models is theirs.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.core.identity import LYAPUNOV, HashTemplate, canonical_json, content_hash
from sgdsweep.core.noise_types import SAMPLING_NOISE, SDE_NOISE, describe
from sgdsweep.core.paths import nested_sweep, sweep_dir
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models import allowed_noise, get_model, hook, observing
from sgdsweep.sweep import grid as gridmod
from sgdsweep.sweep import lead as report_lead
from sgdsweep.sweep import limits
from sgdsweep.sweep.cost import Footprint, footprint
from sgdsweep.sweep.device import BACKEND_KEY
from sgdsweep.sweep.device import router as device_router
from sgdsweep.sweep.schema import check_tree, load_schema, read_yaml, validate_and_fill

#: Axes every sweep must set (in the grid or in every explicit point) when the model uses them.
REQUIRED_AXES = ("lr", "batch_size", "samples_per_param", "hidden_width")
#: Keys that vary inside a data set; every other parameter is shared by a data set's points.
IN_SHARD_KEYS = ("lr", "batch_size", "momentum", "replicas")
#: Config sections that determine simulation results (fit/report/execution do not).
SIMULATION_SECTIONS = ("seed", "model", "dynamics", "grid", "points")


@dataclass(frozen=True)
class Point:
    """One parameter point of a sweep.

    Attributes:
        hash: content hash of ``params`` (the point's identity and store name).
        params: fully resolved parameters (every key that can change the result).
        burn_in: burn-in in steps, resolved from ``params['burn_in']``.
        shard: id of the shard (workflow job) the point belongs to
            (:mod:`sgdsweep.sweep.shards`).
        data_set: hash of the parameters the point shares with its data set's other points
            (all but ``lr``, ``batch_size``, ``momentum`` and ``replicas``): one problem, one
            memory footprint.
    """

    hash: str
    params: Mapping[str, Any]
    burn_in: int
    shard: str
    data_set: str = ""
    #: key of the point's stored lanes (:mod:`sgdsweep.store.lanes`) when a later round may
    #: extend it by more replicas (``precision:``), else None
    lanes: str | None = None

    def in_shard(self, shard: str) -> Point:
        """This point in shard ``shard``: ``dataclasses.replace(self, shard=shard)``, without its
        inspection of the fields at each call (a sweep makes one per point). A new field goes here too."""
        return Point(hash=self.hash, params=self.params, burn_in=self.burn_in, shard=shard, data_set=self.data_set,
                     lanes=self.lanes)

    def spec(self) -> dict[str, Any]:
        """JSON-ready description, as passed to simulation tasks."""
        out = {"hash": self.hash, "params": dict(self.params), "burn_in": self.burn_in}
        if self.lanes is not None:
            out["lanes"] = self.lanes
        return out


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its config (defaults filled), its points and coordinates."""

    config: Mapping[str, Any]
    points: tuple[Point, ...]
    coords: tuple[str, ...]
    #: data set (:attr:`Point.data_set`) → the memory its simulation tasks need (:mod:`sgdsweep.sweep.cost`)
    footprints: Mapping[str, Footprint] = field(default_factory=dict, repr=False, compare=False)
    #: data set → the Hessian eigenvalues at its minimum (``Problem.curvatures``): what a point's
    #: burn-in is counted in relaxation times on (:mod:`sgdsweep.sweep.burn_in`)
    curvatures: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _shards: dict[str, list[Point]] = field(default_factory=dict, repr=False, compare=False)
    #: with ``precision:`` or ``search:``, the current round and why each point is in it
    #: (:func:`sgdsweep.sweep.precision.resolve_rounds`); else empty
    rounds: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: values derived from the whole sweep, kept by their owners the first time they are asked
    #: for (``"tasks"``: :func:`sgdsweep.sweep.cost.tasks`); ``dataclasses.replace`` starts a new one
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.config["sweep"]

    @property
    def directory(self) -> Path:
        """``<results_dir>/<sweep>``."""
        return sweep_dir(self.config["results_dir"], self.name)

    @property
    def shards(self) -> dict[str, list[Point]]:
        """Shard id → its points, in sweep order."""
        if not self._shards:
            for p in self.points:
                self._shards.setdefault(p.shard, []).append(p)
        return self._shards

    def simulation_config(self) -> dict[str, Any]:
        """The sections of the config that determine simulation results."""
        return {k: self.config[k] for k in SIMULATION_SECTIONS if k in self.config}

    @property
    def config_hash(self) -> str:
        """Hash of the whole resolved config."""
        return content_hash(self.config)

    @property
    def sweep_hash(self) -> str:
        """Hash of the simulation-relevant config (unchanged by fit/report/execution edits)."""
        return content_hash(self.simulation_config())


def make_point(model, raw_params: Mapping[str, Any], where: PointName, footprints: dict[str, Footprint],
               problems: dict[str, Any] | None = None, curvatures: dict[str, np.ndarray] | None = None,
               coerced: bool = False, data_sets: dict[Hashable, tuple[Any, str, HashTemplate]] | None = None,
               data_key: Hashable = None) -> Point:
    """The :class:`Point` of ``raw_params`` (the config's base parameters with one grid point's
    axes): values coerced, the model's checks passed, ``init: auto`` and the burn-in resolved;
    the footprint of a new data set is added to ``footprints``; the point's shard is its data set
    until :func:`sgdsweep.sweep.shards.assign_shards` groups the sweep's data sets. ``problems`` (canonical JSON of the
    model's data parameters → problem), when given, keeps every problem built for a sweep: the
    models' own caches hold a few, and a sweep of more data sets than that would rebuild one
    per point. ``curvatures``, when given, gets a new data set's Hessian eigenvalues at its
    minimum (what burn-in counts relaxation times on, :mod:`sgdsweep.sweep.burn_in`). ``coerced``:
    every value of ``raw_params`` is already of its key's type (:func:`sgdsweep.sweep.grid.coerce`).
    ``data_sets``, when given with ``data_key``, keeps each data set's problem, its
    :attr:`Point.data_set` and the :class:`~sgdsweep.core.identity.HashTemplate` of its points'
    hashes under its key, so that a data set's parameters are checked and encoded once, not per
    point: the caller's ``data_key`` must be equal for two points exactly when their
    parameters outside :data:`IN_SHARD_KEYS` are (:func:`_data_key`).

    Raises:
        ConfigError: naming the key and ``where``.
    """
    params = dict(raw_params) if coerced else {k: gridmod.coerce(k, v) for k, v in raw_params.items()}
    _check_dynamics(params, model, where)
    cached = data_sets is not None and data_key is not None
    known = data_sets.get(data_key) if cached else None  # type: ignore[union-attr]
    if known is None:
        problem = _checked_problem(model, params, where, problems)
    else:
        model.check_point(params, where)  # may depend on the point's own lr, batch_size, …
        problem = known[0]
    if params["init"] == "auto":  # hash the concrete start, so 'auto' and its meaning hash alike
        params["init"] = problem.auto_init
    burn = _resolve_burn_in(params, problem, where)
    if known is None:
        data_set = content_hash({k: v for k, v in params.items() if k not in IN_SHARD_KEYS})
        point_hash = content_hash(params)
        if cached:
            data_sets[data_key] = (problem, data_set, HashTemplate(params, IN_SHARD_KEYS))  # type: ignore[index]
    else:
        data_set, point_hash = known[1], known[2].hash(params)
    if data_set not in footprints:
        footprints[data_set] = footprint(problem, params)
    if curvatures is not None and data_set not in curvatures:
        curvatures[data_set] = np.asarray(problem.curvatures(), dtype=float)
    return Point(hash=point_hash, params=params, burn_in=burn, shard=data_set, data_set=data_set)


def _resolve_burn_in(params: Mapping[str, Any], problem, where: PointName) -> int:
    steps = params["steps"]
    if params["burn_in"] != "auto":
        burn = int(params["burn_in"])
        if burn >= steps:
            raise ConfigError("dynamics.burn_in", burn, f"an integer below steps = {steps}",
                              f"Nothing would be measured at {where}.")
        return burn
    tau = problem.relaxation_steps(params["lr"], params["momentum"])
    if math.isinf(tau):
        return steps // 2  # unstable in the mean: the replicas will diverge and be flagged
    burn = math.ceil(params["burn_in_relaxations"] * tau)
    if burn >= steps:
        raise ConfigError(
            "dynamics.burn_in", "auto", f"a burn-in shorter than steps = {steps}",
            f"At {where} the auto burn-in is {burn} steps ({params['burn_in_relaxations']} slowest "
            f"relaxation times of {tau:.0f} steps each). Raise steps to at least "
            f"{2 * burn}, use larger lr values, or set dynamics.burn_in explicitly.")
    return burn


def _checked_problem(model, params: Mapping[str, Any], where: PointName, problems: dict[str, Any] | None = None):
    """The point's problem, after the model's own checks (``check_point``); a data set too
    large for memory, or one numpy cannot factorise (a degenerate covariance), is a
    :class:`ConfigError` naming the model's options."""
    try:
        model.check_point(params, where)
        if problems is None:
            return model.make_problem(model.data_params(params))
        data = model.data_params(params)
        key = canonical_json(data)
        if key not in problems:
            problems[key] = model.make_problem(data)
        return problems[key]
    except (MemoryError, np.linalg.LinAlgError) as exc:
        options = {k: v for k, v in model.data_params(params).items() if k not in ("model", "seed")}
        what = "does not fit in memory" if isinstance(exc, MemoryError) else f"is degenerate ({exc})"
        raise ConfigError("model", options, "a problem whose data set can be built",
                          f"At {where} the data set {what}; change samples_per_param or the model's "
                          "sizes and scales.") from None


def build_sweep(raw: Mapping[str, Any], rounds: bool = True) -> Sweep:
    """Validate a config mapping and build its :class:`Sweep`; with ``precision:`` or
    ``search:`` and ``rounds``, at its current round (read from the stores of earlier rounds),
    else the config's own points.

    Raises:
        ConfigError: naming the key, the value given and what is allowed.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("<config>", raw, "a YAML mapping of keys to values")
    if not raw:
        raise empty_config_error("the config")
    raw_grid = raw.get("grid") if isinstance(raw.get("grid"), Mapping) else {}
    for section in ("model", "dynamics"):
        sec = raw.get(section)
        if isinstance(sec, Mapping):
            for key in gridmod.EXTRA_GRID_KEYS:
                if key in sec and key in raw_grid:
                    raise ConfigError(f"grid.{key}", raw_grid[key], f"one place for '{key}'",
                                      f"It is set in both {section} and grid; keep one.")
    check_tree(raw)  # aliases and nesting first: every other walk would expand or recurse into them
    limits.check_sizes(raw)  # from the lists' lengths, before anything is expanded or built
    cfg = validate_and_fill(dict(raw))
    limits.check_results_dir(cfg["results_dir"])
    limits.check_execution(cfg["execution"])
    pair = cfg["fit"]["wigner"]["pair"]
    if pair[0] == pair[1]:
        raise ConfigError("fit.wigner.pair", pair, "two different indices, e.g. [0, 1]",
                          "The pair is two distinct eigenvalues of WᵀW.")
    kind = cfg["model"]["kind"]
    model = get_model(kind)
    options = _model_options(cfg["model"], model, kind, raw_grid)
    cfg["model"] = {"kind": kind, **options}  # the resolved config shows the model's defaults
    required = tuple(a for a in REQUIRED_AXES if a in model.AXES)
    expanded = gridmod.expand(cfg["grid"], cfg.get("points", []), required)
    if not expanded:
        raise ConfigError("grid", cfg["grid"], "at least one point", "The sweep is empty.")

    base = {"model": kind, "seed": cfg["seed"], **options}
    base.update({k: v for k, v in cfg["dynamics"].items() if k != "observe"})
    base["observe"] = _observe(cfg["dynamics"]["observe"], model)
    base.setdefault("noise", allowed_noise(model, options)[0])
    if "search" in cfg:  # an edge search decides from each replica's Lyapunov exponent (sgdsweep.sweep.search)
        base[LYAPUNOV] = True
    base = {k: gridmod.coerce(k, v) for k, v in base.items()}  # once; the grid's values are coerced by expand
    route = device_router(cfg["execution"])  # each point's backend (execution.device); CPU points unchanged
    points: list[Point] = []
    seen: dict[str, int] = {}
    footprints: dict[str, Footprint] = {}
    problems: dict[str, Any] = {}
    curvatures: dict[str, np.ndarray] = {}
    data_sets: dict[Hashable, tuple[Any, str, HashTemplate]] = {}
    with _cyclic_gc_paused():  # the points and their dicts: millions of objects at 10⁶ points
        for i, gp in enumerate(expanded):
            where = PointName(gp)
            _check_axes(gp, model, kind, required)
            params = route({**base, **gp}, where)
            point = make_point(model, params, where, footprints, problems, curvatures, coerced=True,
                               data_sets=data_sets, data_key=_data_key(gp, params))
            if point.hash in seen:
                raise ConfigError("points" if i >= len(expanded) - len(cfg.get("points", [])) else "grid",
                                  dict(gp), "distinct points",
                                  f"{where} appears twice in the sweep; remove the duplicate.")
            seen[point.hash] = i
            points.append(point)

    report_lead.check(cfg, kind, base["observe"], {"momentum": {p.params.get("momentum", 0.0) for p in points}})
    coords = tuple(a for a in gridmod.AXES if a in model.AXES) + tuple(
        k for k in gridmod.EXTRA_GRID_KEYS if any(k in gp for gp in expanded))
    sweep = Sweep(config=cfg, points=tuple(points), coords=coords, footprints=footprints, curvatures=curvatures)
    if rounds and ("precision" in cfg or "search" in cfg):  # the current round's points, from the stored ones
        from sgdsweep.sweep.precision import resolve_rounds

        sweep = resolve_rounds(sweep)
    from sgdsweep.sweep.shards import assign_shards

    with _cyclic_gc_paused():
        return assign_shards(sweep)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a sweep's points are made. They hold no
    reference cycles (reference counting frees them), but each full collection walks every object
    made so far, and a sweep of 10⁶ points makes millions of them: a fifth of the build's time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _check_axes(gp: Mapping[str, Any], model, kind: str, required: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` if the grid point ``gp`` sets an axis of another model, or
    lacks one of the ``required`` axes."""
    for axis in gp:
        if axis in gridmod.AXES and axis not in model.AXES:
            raise ConfigError(f"grid.{axis}", gp[axis], f"an axis of model.kind {kind}: " + ", ".join(model.AXES),
                              f"'{axis}' applies to another model; remove it.")
    for axis in required:
        if axis not in gp:
            raise ConfigError(f"grid.{axis}", None, "a value or a list of values",
                              f"Every {kind} sweep sets '{axis}'; add it to grid (or to every point).")


def _data_key(gp: Mapping[str, Any], params: Mapping[str, Any]) -> Hashable:
    """The key under which :func:`make_point` keeps the data set of the point ``params`` made from
    the grid point ``gp`` and the sweep's base parameters: ``gp``'s items outside
    :data:`IN_SHARD_KEYS`, and the backend; None where a value is not hashable. ``gp``'s values
    are coerced (:func:`sgdsweep.sweep.grid.coerce`: one type per key, -0.0 is 0.0), so equal
    values are the same parameter."""
    key = (tuple((k, v) for k, v in gp.items() if k not in IN_SHARD_KEYS), params.get(BACKEND_KEY))
    try:
        hash(key)
    except TypeError:  # the point's data set is found the slow way
        return None
    return key


def _model_options(section: Mapping[str, Any], model, kind: str, raw_grid: Mapping[str, Any]) -> dict[str, Any]:
    """The model's options: its defaults overridden by ``model.*``; a key of another model is an error."""
    options = dict(model.OPTIONS)
    for key, value in section.items():
        if key == "kind":
            continue
        if key not in model.OPTIONS:
            raise ConfigError(f"model.{key}", value, f"a key of model.kind {kind}: "
                              + (", ".join(model.OPTIONS) or "(none)"),
                              f"'{key}' belongs to another model kind; remove it.")
        options[key] = value
    for key in ("n_inputs", "label_noise"):
        if key in raw_grid and key not in model.OPTIONS:
            raise ConfigError(f"grid.{key}", raw_grid[key], f"a key of model.kind {kind}: "
                              + (", ".join(model.OPTIONS) or "(none)"), f"model.kind {kind} has no '{key}'.")
    return options


def _observe(section: Mapping[str, Any], model) -> dict[str, Any]:
    """``dynamics.observe`` with ``escape: auto`` resolved (on where the model observes escape)."""
    out = dict(section)
    if out["escape"] == "auto":
        out["escape"] = "escape" in hook(model, "OBSERVES")
    out["noise_lags"] = sorted(set(out["noise_lags"]))
    return out


def _check_dynamics(params: Mapping[str, Any], model, where: PointName) -> None:
    """Noise type, SDE and observable choices that the model and dynamics support; then the
    model's own ``check_dynamics``."""
    noise = params["noise"]
    if noise not in model.NOISE_TYPES:
        raise ConfigError("grid.noise", noise, f"for model.kind {params['model']}: " + ", ".join(model.NOISE_TYPES),
                          f"At {where}.")
    if params["method"] == "sde":
        if params["momentum"] != 0.0:
            raise ConfigError("grid.momentum", params["momentum"], "0 with dynamics.method sde",
                              f"The SDE has no momentum term. At {where}.")
        if noise not in SDE_NOISE:
            raise ConfigError("grid.noise", noise, "with dynamics.method sde: " + ", ".join(SDE_NOISE),
                              f"The SDE's noise is Gaussian. At {where}.")
        k = 1.0 / params["dt_over_lr"]
        if abs(k - round(k)) > 1e-9:
            raise ConfigError("dynamics.dt_over_lr", params["dt_over_lr"],
                              "1/k for an integer k (1, 0.5, 0.25, 0.1, …)",
                              "Each SGD step must be a whole number of SDE steps.")
        limit = load_schema()["$defs"]["steps"]["maximum"]
        if params["steps"] * round(k) > limit:
            raise ConfigError("dynamics.dt_over_lr", params["dt_over_lr"],
                              f"at most {limit:.0e} integrator steps (steps / dt_over_lr)",
                              f"At {where}, {params['steps']} steps of {round(k)} SDE steps each; use a larger "
                              "dt_over_lr or fewer steps.")
    elif params["dt_over_lr"] != 1.0:
        raise ConfigError("dynamics.dt_over_lr", params["dt_over_lr"], "1.0 unless dynamics.method is sde",
                          "Only the SDE integrator has its own step.")
    observe = params["observe"]
    observes = hook(model, "OBSERVES")
    if observe["gradient_noise"] and not ("gradient_noise" in observes and noise in SAMPLING_NOISE):
        raise ConfigError("dynamics.observe.gradient_noise", True,
                          f"model.kind {describe(observing('gradient_noise'))} with noise {describe(SAMPLING_NOISE)}",
                          f"D(m) is the noise of the sampled batches of a single layer. At {where}.")
    if observe["escape"] and "escape" not in observes:
        raise ConfigError("dynamics.observe.escape", True, f"model.kind {describe(observing('escape'))}",
                          "Only these models define a basin to escape from.")
    hook(model, "check_dynamics")(params, where)


def empty_config_error(name: str) -> ConfigError:
    """The error for a config without a single key (``name``: the file, or "the config"): what a
    sweep needs at least — a grid of its model's required axes; every other key has a default."""
    kind = load_schema()["properties"]["model"]["properties"]["kind"]["default"]
    axes = [a for a in REQUIRED_AXES if a in get_model(kind).AXES]
    return ConfigError("<config file>", name, "a config with at least a grid of the model's axes",
                       f"{name} is empty (no keys: nothing but blank lines or comments). A sweep needs at least "
                       f"`grid` with the axes of its model; for the default model (model.kind {kind}) "
                       f"{', '.join(axes)}, e.g. `grid: {{lr: [0.1, 0.2], batch_size: 4, samples_per_param: 10}}`. "
                       "Every other key (sweep, model, dynamics, fit, …) has a default; the repository's "
                       "config/config.yaml is a complete example (docs/configuration.md)")


def load_sweep(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Sweep:
    """Read a YAML config file (safely), apply top-level ``overrides`` and build the sweep, which
    must fit in memory (:func:`check_fits`).

    Raises:
        ConfigError: as :func:`build_sweep`; for a file without a single key,
            :func:`empty_config_error` naming it.
    """
    raw = read_yaml(path)
    if not raw:
        raise empty_config_error(str(path))
    if overrides:
        raw.update(overrides)
    sweep = build_sweep(raw)
    check_place(sweep)
    check_fits(sweep)
    return sweep


def check_place(sweep: Sweep) -> None:
    """Raise :class:`ConfigError` if the sweep's directory lies inside another sweep's directory,
    or holds one (:func:`sgdsweep.core.paths.nested_sweep`): runs of the outer sweep would lose the
    inner one's results."""
    found = nested_sweep(sweep.directory)
    if found is not None:
        other, how = found
        where = "inside another sweep's directory" if how == "inside" else "around another sweep's directory"
        raise ConfigError("results_dir", sweep.config["results_dir"],
                          "a directory whose sweeps lie side by side, none inside another",
                          f"With sweep '{sweep.name}' the sweep's directory {sweep.directory} lies {where}, "
                          f"{other}: a run of the outer sweep would delete the inner one's results. Choose "
                          "another results_dir (e.g. results) or sweep name")


def check_fits(sweep: Sweep) -> None:
    """Raise :class:`ConfigError` if simulating the points of ``sweep`` that have no complete
    store needs more memory than ``execution.max_memory`` (:func:`sgdsweep.sweep.cost.check_memory`).
    Every point is checked first; only when they do not fit are the stores read, so that a
    finished or imported sweep that simulates nothing is never refused."""
    from sgdsweep.store.points import complete_points
    from sgdsweep.sweep.cost import check_memory

    try:
        check_memory(sweep)
    except ConfigError:
        done = complete_points(sweep.directory / "points", (p.hash for p in sweep.points))
        check_memory(sweep, [p.hash for p in sweep.points if p.hash not in done])
