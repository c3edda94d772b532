"""One ``.npy`` member read as :func:`numpy.lib.format.read_array` reads it (without pickle), with
its parsed header remembered: a sweep's point stores repeat a few headers (the same arrays, the
same shapes), and parsing one (NumPy's ``ast.literal_eval`` of a Python dict) costs more than
reading the member's data.

A header is parsed and the member read by NumPy's own public functions the first time its exact
bytes are seen (:func:`numpy.lib.format.read_magic`, ``read_array_header_1_0`` / ``_2_0``,
``read_array``, with all their checks); a member whose header bytes were seen before is read with
:func:`numpy.frombuffer` from its data, whose length must be exactly what the header declares
(else NumPy reads it, and raises as it would). The result is the same array either way: the same
data type, shape, memory order and bytes, a new writeable array.
"""

from __future__ import annotations

import io
import math

import numpy as np

#: Most distinct headers remembered (more are parsed each time).
MAX_HEADERS = 4096

_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}  # header bytes → dtype, shape, fortran


def _header_end(raw: bytes) -> int:
    """Where the data of the ``.npy`` bytes ``raw`` begin (format 1.0 or 2.0), or 0."""
    if len(raw) < 12 or raw[:6] != b"\x93NUMPY":
        return 0
    if raw[6] == 1:
        return 10 + int.from_bytes(raw[8:10], "little")
    if raw[6] == 2:
        return 12 + int.from_bytes(raw[8:12], "little")
    return 0


def read_npy(raw: bytes) -> np.ndarray:
    """The array of the ``.npy`` bytes ``raw`` (module docstring).

    Raises: what :func:`numpy.lib.format.read_array` raises for them (ValueError for a damaged
    or crafted header, an object array, or data of another length)."""
    end = _header_end(raw)
    known = _HEADERS.get(raw[:end]) if 0 < end <= len(raw) else None
    if known is not None:
        dtype, shape, fortran = known
        count = math.prod(shape)
        if len(raw) - end == count * dtype.itemsize:
            flat = np.frombuffer(raw, dtype=dtype, count=count, offset=end)
            return (flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)).copy(order="K")
    array = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    if end and len(_HEADERS) < MAX_HEADERS:
        fp = io.BytesIO(raw)
        version = np.lib.format.read_magic(fp)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fp)
        if not dtype.hasobject and fp.tell() == end:
            _HEADERS[raw[:end]] = (dtype, tuple(shape), bool(fortran))
    return array
