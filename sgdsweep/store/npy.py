"""One ``.npy`` member read as :func:`numpy.lib.format.read_array` reads it (without pickle), with
its parsed header remembered, and checked from its header alone.

A sweep's point stores repeat a few headers (the same arrays, the same shapes), and parsing one
(NumPy's ``ast.literal_eval`` of a Python dict) costs more than reading the member's data. A
header is parsed by NumPy's own public functions (:func:`numpy.lib.format.read_magic`,
``read_array_header_1_0`` / ``_2_0``, with all their checks) the first time its exact bytes are
seen (:func:`header`). A member whose header parses is read with :func:`numpy.frombuffer` from
its data, whose length must be exactly what the header declares; any other is read by
:func:`numpy.lib.format.read_array`, which raises as it would. The result is the same array
either way: the same data type, shape, memory order and bytes, a new writeable array.

:func:`check_member` checks a member from its header and size alone, before any of its data is
read: a data type of numbers or booleans (or a table of them), and exactly as many bytes as its
shape declares (NumPy allocates the declared shape before it reads the data).
"""

from __future__ import annotations

import io
import math
import sys

import numpy as np

#: Most distinct headers remembered (more are parsed each time).
MAX_HEADERS = 4096
#: Bytes of a ``.npy`` file before its header's length field ends (magic, version, length).
PREFIX_BYTES = 12
#: Longest header read when a member is checked, bytes (NumPy parses at most 10,000).
MAX_HEADER_BYTES = 1 << 16
#: NumPy data type kinds of numbers and booleans.
NUMERIC = "biufc"

_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}  # header bytes → dtype, shape, fortran


def _header_end(raw: bytes) -> int:
    """Where the data of the ``.npy`` bytes ``raw`` begin (format 1.0 or 2.0), or 0."""
    if len(raw) < PREFIX_BYTES or raw[:6] != b"\x93NUMPY" or raw[7] != 0:
        return 0
    if raw[6] == 1:
        return 10 + int.from_bytes(raw[8:10], "little")
    if raw[6] == 2:
        return 12 + int.from_bytes(raw[8:12], "little")
    return 0


def header_end(prefix: bytes) -> int:
    """Where the data begin of the ``.npy`` file whose first :data:`PREFIX_BYTES` bytes are
    ``prefix``.

    Raises: ValueError for a file that is not ``.npy`` of format 1.0 or 2.0."""
    end = _header_end(prefix)
    if not end:
        raise ValueError("not a .npy file of format 1.0 or 2.0")
    return end


def header(raw: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(data type, shape, Fortran order, where the data begin) of the ``.npy`` bytes ``raw`` (at
    least its whole header), parsed by NumPy the first time these header bytes are seen.

    Raises: ValueError for a header NumPy does not parse (damaged or crafted), cut short, or of
    a format other than 1.0 and 2.0."""
    end = header_end(raw[:PREFIX_BYTES])
    if end > len(raw):
        raise ValueError(f"its header of {end} bytes is cut short")
    key = bytes(raw[:end])
    known = _HEADERS.get(key)
    if known is None:
        fp = io.BytesIO(key)
        version = np.lib.format.read_magic(fp)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        try:
            shape, fortran, dtype = read(fp)
        except Exception as exc:  # noqa: BLE001 - NumPy raises several types for a crafted header
            raise ValueError(f"its header is not one NumPy reads ({exc})") from None
        if fp.tell() != end:
            raise ValueError("its header's length field and its header differ")
        known = (dtype, tuple(int(s) for s in shape), bool(fortran))
        if not dtype.hasobject and len(_HEADERS) < MAX_HEADERS:
            _HEADERS[key] = known
    return (*known, end)


def _plain(dtype: np.dtype, kinds: str) -> bool:
    """Whether ``dtype`` is of ``kinds``, or a table (structured) of fields of numbers or booleans."""
    if dtype.fields is not None:
        return not dtype.hasobject and all(_plain(field[0], NUMERIC) for field in dtype.fields.values())
    return dtype.subdtype is None and dtype.kind in kinds


def check_member(raw: bytes, size: int, kinds: str = NUMERIC) -> tuple[np.dtype, tuple[int, ...]]:
    """Check a ``.npy`` member of ``size`` bytes from ``raw``, its first bytes (at least its
    header): a data type of ``kinds`` (by default numbers or booleans; or a table whose columns
    are), and ``size`` exactly the header and the data its shape declares.

    Returns: its data type and shape.

    Raises: ValueError saying what is wrong."""
    dtype, shape, _, end = header(raw)
    if not _plain(dtype, kinds) or dtype.itemsize == 0:
        raise ValueError(f"its data type is {dtype}, not one sgdsweep writes there")
    if any(s < 0 for s in shape) or math.prod(max(s, 1) for s in shape) * dtype.itemsize > sys.maxsize:
        raise ValueError(f"its header declares shape {shape}, which no array has")
    need = end + math.prod(shape) * dtype.itemsize
    if size != need:
        raise ValueError(f"it holds {size} bytes, but its header declares shape {shape} of {dtype}: {need} bytes")
    return dtype, shape


def read_npy(raw: bytes) -> np.ndarray:
    """The array of the ``.npy`` bytes ``raw`` (module docstring).

    Raises: what :func:`numpy.lib.format.read_array` raises for them (ValueError for a damaged
    or crafted header, an object array, or data of another length)."""
    try:
        dtype, shape, fortran, end = header(raw)
    except ValueError:
        dtype = None
    if dtype is not None and not dtype.hasobject and dtype.itemsize > 0 and min(shape, default=0) >= 0:
        count = math.prod(shape)
        if len(raw) - end == count * dtype.itemsize:
            flat = np.frombuffer(raw, dtype=dtype, count=count, offset=end)
            return (flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)).copy(order="K")
    return np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
