"""Models: each model is one module that builds a :class:`~sgdsweep.models.base.Problem` from
point parameters and owns everything else that is particular to it.

A model module provides (``docs/models.md``, "Adding a model"):

Required:

- ``AXES``: the sweep axes it uses (any other axis is a config error listing these);
- ``OPTIONS``: its ``model.*`` keys with their defaults;
- ``NOISE_TYPES``: the ``noise`` values it supports, a subset of
  :data:`sgdsweep.core.noise_types.ALL` chosen by their properties; the first is the default;
- ``check_point(params, where)``: raise :class:`~sgdsweep.errors.ConfigError` if a point cannot
  be simulated (``where``, a :class:`~sgdsweep.errors.PointName`, names the point in the message);
- ``data_params(params)``: the parameters that determine the problem (points sharing them share
  data);
- ``make_problem(data_params)``: the problem (deterministic, cached per process); its class
  names its compiled kernel family in ``kernel`` (:data:`sgdsweep.models.base.KERNELS`).

Optional, with the defaults of :mod:`sgdsweep.models.defaults`:

- ``noise_types(options)``: the noise types that its options allow (the first the default);
  default ``NOISE_TYPES``;
- ``OBSERVES``: the optional ``dynamics.observe`` keys it supports (``gradient_noise``,
  ``escape``; ``escape: auto`` is on where supported); default none;
- ``check_dynamics(params, where)``: its restrictions on ``dynamics`` (init, method, …);
- ``theory(problem, params, pred, step, gain)``: fill the
  :class:`~sgdsweep.models.predict.Prediction` ``pred`` with the point's stationary theory
  (``step``: the integrator step, λ or the SDE's dt; ``gain``: the noise gain λ/dt, 1 for SGD);
- ``escape(problem, params, pred)``: fill the escape-time fields of ``pred``
  (``escape_time_arrhenius``, ``escape_time_powerlaw``, ``escape_time_exact``,
  ``escape_time_exact_matched``), each with its formula or the reason it is absent, for a model
  with a barrier to escape over (:mod:`sgdsweep.models.escape` holds what such models share);
  default none;
- ``stability_edge(problem, params, axis)``: the exact theory's stability edge along ``axis``
  (``lr`` or ``momentum``) as ``{"value": float, "method": str, ...}``
  (:func:`sgdsweep.models.edge.stability_edge` states the contract), or None where the model has
  no exact edge theory for the point; default None.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from sgdsweep.errors import ConfigError
from sgdsweep.models import defaults, digits, landscape, linear, matrix, quadratic, two_layer

MODELS: dict[str, ModuleType] = {"quadratic": quadratic, "linear": linear, "two_layer": two_layer,
                                 "matrix": matrix, "landscape": landscape, "digits": digits}
#: What every model module defines.
REQUIRED = ("AXES", "OPTIONS", "NOISE_TYPES", "check_point", "data_params", "make_problem")
#: Hooks a model module may define; :mod:`sgdsweep.models.defaults` has the others' defaults.
OPTIONAL = ("noise_types", "OBSERVES", "check_dynamics", "theory", "escape", "stability_edge")


def get_model(kind: str) -> ModuleType:
    """The model module for ``model.kind``."""
    try:
        return MODELS[kind]
    except KeyError:
        raise ConfigError("model.kind", kind, "one of " + ", ".join(sorted(MODELS))) from None


def hook(model: ModuleType, name: str) -> Any:
    """The model's optional hook ``name`` (one of :data:`OPTIONAL` but ``noise_types``, which
    :func:`allowed_noise` applies), or its default."""
    if name not in OPTIONAL or name == "noise_types":
        raise ValueError(f"{name!r} is not a defaulted model hook ({', '.join(OPTIONAL[1:])})")
    return getattr(model, name, getattr(defaults, name))


def allowed_noise(model: ModuleType, options: Mapping[str, Any]) -> tuple[str, ...]:
    """The noise types that a model's ``options`` allow, the first being the default noise: its
    ``noise_types(options)`` where it has one (it narrows ``NOISE_TYPES`` by option), else
    ``NOISE_TYPES``."""
    narrowed = getattr(model, "noise_types", None)
    return narrowed(options) if narrowed else model.NOISE_TYPES


def observing(observable: str) -> tuple[str, ...]:
    """The model kinds whose ``OBSERVES`` includes ``observable``."""
    return tuple(kind for kind, model in MODELS.items() if observable in hook(model, "OBSERVES"))


def make_problem(params):
    """The problem of a point's parameters."""
    model = get_model(params["model"])
    return model.make_problem(model.data_params(params))
