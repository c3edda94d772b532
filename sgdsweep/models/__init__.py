"""Models: data generation, per-point checks and stability/relaxation estimates.

Each model module exposes the same small interface (see :mod:`sgdsweep.models.linear`):
``PARAMS`` (the point parameters it uses), ``NOISE_TYPES`` (the ``noise`` values it supports),
``check_point(params, where)`` raising :class:`~sgdsweep.errors.ConfigError`,
``data_params(params)``, ``make_data(data_params)`` and ``relaxation_steps(data, lr, momentum)``.
"""

from __future__ import annotations

from types import ModuleType

from ..errors import ConfigError
from . import linear

MODELS: dict[str, ModuleType] = {"linear": linear}


def get_model(kind: str) -> ModuleType:
    """The model module for ``model.kind``."""
    try:
        return MODELS[kind]
    except KeyError:
        raise ConfigError("model.kind", kind, "one of " + ", ".join(sorted(MODELS))) from None
