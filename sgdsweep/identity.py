"""Content-addressed identity of a parameter point.

A point's hash is the SHA-256 of its canonical JSON: keys sorted, floats written by ``repr``
after conversion to ``float`` (so ``0.1``, ``1e-1`` and ``0.10`` hash alike), integers kept as
integers, and the simulation-code version included so that a change of the numerics that alters
results also changes every hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

#: Bump when a change of the simulation code changes stored results; every point then reruns.
SIMULATION_VERSION = 3

HASH_LENGTH = 16


def canonical_value(value: Any) -> Any:
    """Return ``value`` in canonical form: floats normalised, containers canonicalised.

    Booleans stay booleans; integral floats stay floats (the schema decides the type of a key,
    see :func:`sgdsweep.grid.coerce`).
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot hash a non-finite float: {value!r}")
        return float(repr(float(value)))  # round trip: one spelling per float
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        return canonical_value(value.item())  # numpy scalar
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    raise TypeError(f"cannot hash a value of type {type(value).__name__}: {value!r}")


def canonical_json(params: Mapping[str, Any]) -> str:
    """Canonical JSON text of a parameter mapping: sorted keys, no whitespace."""
    return json.dumps(canonical_value(params), sort_keys=True, separators=(",", ":"))


def content_hash(params: Mapping[str, Any], length: int = HASH_LENGTH) -> str:
    """Hex digest (``length`` characters) of the canonical JSON of ``params`` plus the code version."""
    text = canonical_json({"params": params, "simulation_version": SIMULATION_VERSION})
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def hash_words(hex_digest: str) -> list[int]:
    """Split a hex digest into 32-bit integers, usable as ``numpy.random.SeedSequence`` entropy."""
    return [int(hex_digest[i : i + 8], 16) for i in range(0, len(hex_digest), 8)]
