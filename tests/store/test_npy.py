"""The ``.npy`` reader and checker of point stores (:mod:`sgdsweep.store.npy`): the same array as
NumPy's ``read_array`` for every header it reads (the parsed header cached), and a member checked
from its header and size before its data is parsed."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from sgdsweep.store import npy


def _npy_header(descr, shape, fortran=False, version=(1, 0)) -> bytes:
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {shape!r}, }}".encode()
    prefix = 10 if version[0] == 1 else 12
    text += b" " * (64 - (prefix + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + len(text).to_bytes(prefix - 8, "little") + text



def _both(raw: bytes):
    out = []
    for read in (npy.read_npy, lambda r: np.lib.format.read_array(io.BytesIO(r), allow_pickle=False)):
        try:
            out.append(read(raw))
        except ValueError as exc:
            out.append(exc)
    return out


_SAME = {
    "C f8": _npy_header("<f8", (2, 3)) + np.arange(6.0).tobytes(),
    "big-endian fortran": _npy_header(">f8", (2, 3), fortran=True) + np.arange(6.0).tobytes(),
    "table fortran": _npy_header([("a", "<f8"), ("b", ">i4")], (2, 2), fortran=True) + bytes(48),
    "0-d": _npy_header("<c16", ()) + bytes(16),
    "zero-size": _npy_header("<f8", (0, 3)),
    "version 2.0": _npy_header("<i2", (3,), version=(2, 0)) + np.arange(3, dtype="<i2").tobytes(),
    "data too long": _npy_header("<f8", (3,)) + np.arange(4.0).tobytes(),
    "data too short": _npy_header("<f8", (3,)) + np.arange(2.0).tobytes(),
    "bool bytes not 0/1": _npy_header("|b1", (3,)) + b"\x00\x01\x02",
    "negative dims": _npy_header("<f8", (-2, -3)) + np.arange(6.0).tobytes(),
    "object": _npy_header("|O", (1,)) + b"x" * 8,
    "version 2.1": _npy_header("<f8", (2, 3), version=(2, 1)) + np.arange(6.0).tobytes(),
    "void of no bytes": _npy_header("|V0", (10,)),
}


@pytest.mark.parametrize("case", list(_SAME))
def test_read_npy_reads_what_read_array_reads(case):
    """read_npy gives read_array's array, or raises ValueError where read_array does, for headers
    of every kind (orders, byte orders, tables, 0-d, zero-size, format 2.0, a format 2.1 that
    NumPy refuses, a void type of no bytes) and data of the wrong length; each case twice, the
    second read through the header cache."""
    for _ in range(2):
        got, want = _both(_SAME[case])
        if isinstance(want, Exception):
            assert isinstance(got, ValueError), (got, want)
            continue
        assert isinstance(got, np.ndarray), (got, want)
        assert (got.dtype, got.shape, got.tobytes(), got.flags.f_contiguous, got.flags.c_contiguous,
                got.flags.writeable) == (want.dtype, want.shape, want.tobytes(), want.flags.f_contiguous,
                                         want.flags.c_contiguous, True)


def test_a_cached_header_read_with_other_data_lengths():
    """One header, cached, then read over data of the right, a longer and a shorter length: the
    result is read_array's each time."""
    head = _npy_header("<f4", (4,))
    for data in (bytes(16), bytes(20), bytes(12), np.arange(4, dtype="<f4").tobytes()):
        got, want = _both(head + data)
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            assert got.tobytes() == want.tobytes() and got.shape == want.shape


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's own read, compared
@pytest.mark.parametrize("shape", [(-1, -1), (-2, -3), (0, -5), (2**63, 0), (2**62, 2**62, 0)])
def test_check_member_refuses_a_shape_no_reader_reads(shape):
    """Negative dimensions, and zero-size shapes beyond NumPy's largest dimension, which no reader
    reads, are refused by check_member, though their declared product of sizes may match."""
    n = max(math.prod(shape), 0)
    raw = _npy_header("<f8", shape) + bytes(8 * n)
    assert all(isinstance(r, ValueError) for r in _both(raw))  # no reader reads it
    with pytest.raises(ValueError):
        npy.check_member(raw, len(raw))
