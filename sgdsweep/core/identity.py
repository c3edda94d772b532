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
from collections.abc import Iterable, Mapping
from typing import Any

#: Bump when a change of the simulation code changes stored results; every point then reruns
#: (on the same random streams: see STREAM_VERSION). 4: the thesis landscape's matched noise is
#: drawn from its 2 × 2 covariance. 5: the summary gains fdr_residual_se; the thesis landscape's
#: minima are polished to a zero gradient. 6: escape theory columns only where their law holds
#: (reasons per point), the thesis landscape's Kramers column is Eyring–Kramers, the 2-D exact
#: chain no longer overflows, the 1-D exact chain is Richardson-extrapolated. 7: the exact escape
#: columns refuse a τ that rounding could spoil or that a chain without step noise cannot have, a
#: 2-D kernel row's dropped mass stays in the basin, and the 2-D box grows until τ holds still.
SIMULATION_VERSION = 7
#: The version the random numbers are keyed by (:func:`stream_hash`: replicas' streams and data
#: sets). Fixed apart from SIMULATION_VERSION, so that rerunning points does not reseed them —
#: and does not hand the statistical tests new seeds. Bump only to reseed everything.
STREAM_VERSION = 3

HASH_LENGTH = 16


def canonical_value(value: Any) -> Any:
    """Return ``value`` in canonical form: floats normalised, containers canonicalised.

    Booleans stay booleans; integral floats stay floats (the schema decides the type of a key,
    see :func:`sgdsweep.sweep.grid.coerce`).
    """
    kind = type(value)  # exact-type fast paths first: configs are plain dicts, lists and scalars
    if kind is dict:
        return {str(k): canonical_value(v) for k, v in value.items()}
    if kind is str or kind is bool or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"cannot hash a non-finite float: {value!r}")
        return float(repr(value))
    if kind is list or kind is tuple:
        return [canonical_value(v) for v in value]
    if isinstance(value, bool):
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
    """Canonical JSON text of a parameter mapping: sorted keys, no whitespace.

    The same text as ``json.dumps(canonical_value(params), ...)``: json writes floats by
    ``repr`` and tuples as lists itself, so only what it cannot encode (numpy scalars) goes
    through :func:`canonical_value` — json's C encoder then hashes 10⁴ points in a fraction of a
    second.
    """
    try:
        return json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False, default=canonical_value)
    except ValueError:
        canonical_value(params)  # raises the message naming the non-finite float
        raise


def content_hash(params: Mapping[str, Any], length: int = HASH_LENGTH) -> str:
    """Hex digest (``length`` characters) of the canonical JSON of ``params`` plus the code version:
    a point's identity (its store, whether it reruns)."""
    return _digest(params, SIMULATION_VERSION, length)


class HashTemplate:
    """:func:`content_hash` of parameter mappings that are alike but for the numbers of a few keys
    (a sweep's points of one data set differ only in ``lr``, ``batch_size``, ``momentum`` and
    ``replicas``): the canonical JSON is encoded once, with a marker in place of each of
    ``varying``'s values, and each mapping's numbers are then written into it as ``json`` writes
    them (``int.__repr__``, ``float.__repr__``).

    :meth:`hash` equals :func:`content_hash` for every mapping with the template's keys and, outside
    ``varying``, its values; the caller promises the values. A mapping with other keys, or with a
    varying value that is not a plain ``int`` or finite ``float``, is hashed by
    :func:`content_hash` itself.
    """

    def __init__(self, params: Mapping[str, Any], varying: Iterable[str]) -> None:
        keys = [k for k in dict.fromkeys(varying) if k in params]
        self.names = frozenset(params)
        markers = {k: json.dumps(f"\x00{i}\x00") for i, k in enumerate(keys)}
        text = canonical_json({"params": {**params, **{k: json.loads(m) for k, m in markers.items()}},
                               "simulation_version": SIMULATION_VERSION})
        self.keys: tuple[str, ...] = ()
        #: the canonical text with ``%s`` in place of each of :attr:`keys`' values (``%`` escaped);
        #: None where a value of the template holds a marker
        self.text: str | None = None
        if any(text.count(m) != 1 for m in markers.values()):
            return
        self.keys = tuple(sorted(keys, key=lambda k: text.index(markers[k])))  # in the text's order
        parts = []
        for key in self.keys:
            before, _, text = text.partition(markers[key])
            parts.append(before)
        parts.append(text)
        self.text = "%s".join(part.replace("%", "%%") for part in parts)

    def hash(self, params: Mapping[str, Any], length: int = HASH_LENGTH) -> str:
        """:func:`content_hash` of ``params``."""
        if self.text is None or params.keys() != self.names:
            return content_hash(params, length)
        values = []
        for key in self.keys:
            value = params[key]
            kind = type(value)
            if kind is float:  # "%s" writes a float as float.__repr__, an int as int.__repr__ (as json does)
                if not math.isfinite(value):
                    return content_hash(params, length)
            elif kind is not int:
                return content_hash(params, length)
            values.append(value)
        return hashlib.sha256((self.text % tuple(values)).encode()).hexdigest()[:length]


def stream_hash(params: Mapping[str, Any], length: int = HASH_LENGTH) -> str:
    """Hex digest of ``params`` plus :data:`STREAM_VERSION`: the key of the random numbers that
    ``params`` determine (a point's replica streams, a problem's data set)."""
    return _digest(params, STREAM_VERSION, length)


#: Parameters that the random streams of an *extensible* point (``params["extensible"]``, the
#: points of a sweep with ``precision:``) do not depend on: how many replicas it has and how long
#: they run. Its replica r is the same whatever its size, and the first T steps of a replica are
#: the same whatever its steps, so a point extended by more replicas equals the same point run at
#: the larger size from the start.
SIZE_KEYS = ("replicas", "steps")
#: Parameter that marks a point as extensible (its value True); part of its identity, so an
#: extensible point and a plain one of the same size never share a store.
EXTENSIBLE = "extensible"
#: Parameter that asks a point's simulation for each replica's Lyapunov exponent
#: (:mod:`sgdsweep.sim.tangent`; value True, on every point of an edge search): part of its identity.
LYAPUNOV = "lyapunov"


def replica_stream_key(params: Mapping[str, Any], length: int = HASH_LENGTH) -> str:
    """The key of a point's replica streams: :func:`stream_hash` of ``params``; for an
    extensible point (:data:`EXTENSIBLE`), of ``params`` without :data:`SIZE_KEYS`."""
    if params.get(EXTENSIBLE):
        return stream_hash({k: v for k, v in params.items() if k not in SIZE_KEYS}, length)
    return stream_hash(params, length)


def points_digest(hashes: Iterable[str]) -> str:
    """Digest of a set of point hashes (order ignored): which points an ensemble, and the fits
    made from it, hold."""
    return content_hash({"points": sorted(hashes)})


def _digest(params: Mapping[str, Any], version: int, length: int) -> str:
    text = canonical_json({"params": params, "simulation_version": version})
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def hash_words(hex_digest: str) -> list[int]:
    """Split a hex digest into 32-bit integers, usable as ``numpy.random.SeedSequence`` entropy."""
    return [int(hex_digest[i : i + 8], 16) for i in range(0, len(hex_digest), 8)]
