"""The exact stability edge of a point, whatever its model: the dispatcher that asks the point's
model (its ``stability_edge`` hook, :mod:`sgdsweep.models`) for the edge that
:mod:`sgdsweep.theory.edge` computes from the model's arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sgdsweep.models import get_model, hook
from sgdsweep.theory.edge import AXES


def stability_edge(problem: Any, params: Mapping[str, Any], axis: str) -> dict[str, Any] | None:
    """The exact theory's stability edge of a point's problem along ``axis``.

    Args:
        problem: ``model.make_problem(model.data_params(params))``.
        params: a resolved point's parameters (``model``, ``lr``, ``batch_size``, ``momentum``,
            ``noise``, ...); the value of ``axis`` in them is ignored.
        axis: ``lr`` or ``momentum``.

    Returns:
        ``{"value": float, "method": str, ...}`` (see :func:`sgdsweep.theory.edge.find_edge`:
        ``value`` is the largest stable value, ``math.inf`` when the whole range is stable), or
        None when the point's model (its ``stability_edge`` hook) has no exact edge theory for it.

    Raises:
        ValueError: ``axis`` is not one of :data:`sgdsweep.theory.edge.AXES`.
    """
    if axis not in AXES:
        raise ValueError(f"stability_edge axis {axis!r}: allowed are {', '.join(AXES)} "
                         "(the search.edge key of the config)")
    return hook(get_model(params["model"]), "stability_edge")(problem, params, axis)
