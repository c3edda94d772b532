"""The defaults of a model module's optional hooks (:mod:`sgdsweep.models` lists the interface):
what a model that does not define a hook gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgdsweep.errors import PointName
    from sgdsweep.models.base import Problem
    from sgdsweep.models.predict import Prediction

#: No optional ``dynamics.observe`` key (``gradient_noise``, ``escape``) is supported.
OBSERVES: frozenset[str] = frozenset()


def check_dynamics(params: Mapping[str, Any], where: PointName) -> None:
    """No restriction on ``dynamics`` beyond the common ones."""


def theory(problem: Problem, params: Mapping[str, Any], pred: Prediction, step: float, gain: float) -> None:
    """No stationary theory: :func:`sgdsweep.models.predict.predict` records why."""


def escape(problem: Problem, params: Mapping[str, Any], pred: Prediction) -> None:
    """No escape theory: the model has no barrier to escape over, so no escape-time field is filled."""


def stability_edge(problem: Problem, params: Mapping[str, Any], axis: str) -> dict[str, Any] | None:
    """No exact stability-edge theory (:func:`sgdsweep.models.edge.stability_edge`): None."""
    return None
