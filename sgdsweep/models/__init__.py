"""Models: each module builds a :class:`~sgdsweep.models.base.Problem` from point parameters.

Every model module exposes the same small interface:

- ``AXES``: the sweep axes it uses (any other axis is a config error listing these);
- ``OPTIONS``: its ``model.*`` keys with their defaults;
- ``NOISE_TYPES``: the ``noise`` values it supports; the first is the default, unless the
  module also has ``noise_types(options)``: those its options allow (the first the default);
- ``check_point(params, where)``: raise :class:`~sgdsweep.errors.ConfigError` if a point cannot
  be simulated (``where`` names the point in the message);
- ``data_params(params)``: the parameters that determine the problem (points sharing them share
  data);
- ``make_problem(data_params)``: the problem (deterministic, cached per process).
"""

from __future__ import annotations

from types import ModuleType

from sgdsweep.errors import ConfigError
from sgdsweep.models import digits, landscape, linear, matrix, quadratic, two_layer

MODELS: dict[str, ModuleType] = {"quadratic": quadratic, "linear": linear, "two_layer": two_layer,
                                 "matrix": matrix, "landscape": landscape, "digits": digits}


def get_model(kind: str) -> ModuleType:
    """The model module for ``model.kind``."""
    try:
        return MODELS[kind]
    except KeyError:
        raise ConfigError("model.kind", kind, "one of " + ", ".join(sorted(MODELS))) from None


def noise_types(model: ModuleType, options) -> tuple[str, ...]:
    """The noise types that a model's ``options`` allow, the first being the default noise: its
    ``noise_types(options)`` where it has one (it narrows ``NOISE_TYPES`` by option), else
    ``NOISE_TYPES``."""
    narrowed = getattr(model, "noise_types", None)
    return narrowed(options) if narrowed else model.NOISE_TYPES


def make_problem(params):
    """The problem of a point's parameters."""
    model = get_model(params["model"])
    return model.make_problem(model.data_params(params))
