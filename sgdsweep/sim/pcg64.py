"""NumPy's PCG64 uniform stream inside compiled loops.

Hand-written: NumPy's generators cannot be stepped from Numba-compiled code, and the kernels
must draw exactly ``Generator.random``'s doubles (``tests/sim/test_pcg64.py`` pins the identity).
A lane's uniforms (its sample selection) come from a :class:`numpy.random.Generator` on
:class:`numpy.random.PCG64`. The kernels of :mod:`sgdsweep.sim.kernels` carry each lane's generator
state — the 128-bit LCG state and increment as (hi, lo) words, a row of 4 uint64 — and step it
themselves inside the block loop (no buffer of every step's numbers):
:func:`next_double` gives the doubles of ``Generator.random``. :func:`states` reads the
generators' states before a block loop, :func:`store` writes them back after it, so the
generators continue where the compiled loop stopped.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: PCG64's 128-bit multiplier (``PCG_DEFAULT_MULTIPLIER_128`` of NumPy's ``pcg64.h``), high
#: and low 64-bit words.
MULT_HI = np.uint64(2549297995355413924)
MULT_LO = np.uint64(4865540595714422341)
_MASK64 = (1 << 64) - 1


@intrinsic
def _muladd128(typingctx, s_hi, s_lo, m_hi, m_lo, i_hi, i_lo):  # pragma: no cover - compiled
    """(s·m + i) mod 2¹²⁸ of 128-bit numbers given as (hi, lo) uint64 words, as (hi, lo)."""
    sig = types.UniTuple(types.uint64, 2)(*(types.uint64,) * 6)

    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)

        def join(hi, lo):
            return builder.or_(builder.shl(builder.zext(hi, i128), ir.Constant(i128, 64)), builder.zext(lo, i128))

        r = builder.add(builder.mul(join(args[0], args[1]), join(args[2], args[3])), join(args[4], args[5]))
        hi = builder.trunc(builder.lshr(r, ir.Constant(i128, 64)), ir.IntType(64))
        lo = builder.trunc(r, ir.IntType(64))
        return context.make_tuple(builder, signature.return_type, [hi, lo])

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def next_double(hi, lo, inc_hi, inc_lo):  # pragma: no cover - compiled
    """One step of PCG64 from the state (hi, lo) with increment (inc_hi, inc_lo): returns the
    new state and its double in [0, 1), ``Generator.random``'s next number (the state advances
    first, then XSL-RR gives 64 bits, of which the top 53 make the double)."""
    hi, lo = _muladd128(hi, lo, MULT_HI, MULT_LO, inc_hi, inc_lo)
    x = hi ^ lo
    rot = hi >> np.uint64(58)
    bits = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
    return hi, lo, np.float64(bits >> np.uint64(11)) * (1.0 / 9007199254740992.0)


def is_pcg64(gen) -> bool:
    """Whether ``gen`` (a Generator, or anything with a ``bit_generator``) runs on PCG64."""
    return type(getattr(gen, "bit_generator", None)) is np.random.PCG64


def states(gens) -> np.ndarray:
    """The PCG64 states of ``gens`` as rows (state hi, state lo, increment hi, increment lo),
    shape (len(gens), 4), uint64."""
    out = np.empty((len(gens), 4), dtype=np.uint64)
    for row, gen in zip(out, gens):
        s = gen.bit_generator.state["state"]
        row[:] = (s["state"] >> 64, s["state"] & _MASK64, s["inc"] >> 64, s["inc"] & _MASK64)
    return out


def store(gens, rows: np.ndarray) -> None:
    """Set each generator of ``gens`` to the state of its row of ``rows`` (as :func:`states`):
    the LCG state; the increment and the buffered 32-bit word stay as they are."""
    for gen, row in zip(gens, rows):
        full = gen.bit_generator.state
        full["state"]["state"] = (int(row[0]) << 64) | int(row[1])
        gen.bit_generator.state = full
