"""An exponential that compiled loops can vectorise.

Hand-written: Numba's ``math.exp``/``np.exp`` call libm one number at a time (Numba vectorises
them only with Intel's SVML, which is not a dependency), so the thesis landscape's sample loops
would stay scalar. :func:`exp` is plain arithmetic instead (Cody–Waite reduction by ln 2, a
degree-13 Taylor polynomial, the power of two written into the exponent bits), which LLVM
vectorises with the rest of the loop. Within 2 ulp of ``np.exp`` on [−708, 709]
(``tests/sim/test_fused.py`` pins it); the argument is clamped to that range, so it does not
overflow to inf or underflow to subnormals: exp(−708) ≈ 3.3e−308 and exp(709) ≈ 8.2e307 stand in
for both ends.

The loops that use it are compiled with ``error_model="numpy"``: Numba's default inserts a
division-by-zero check before every float division, and that branch alone stops LLVM from
vectorising a loop. A NaN argument gives NaN (``min``/``max`` keep it), so a diverged weight
still shows as one.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 to 32 bits: n·_LN2_HI is exact for |n| < 2¹¹
_LN2_LO = 1.90821492927058770002e-10  # ln 2 − _LN2_HI
_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = (1.0 / math.factorial(k) for k in range(2, 14))


@intrinsic
def _pow2(typingctx, n):
    """2.0**n for an int64 n in [−1022, 1023]: n + 1023 written into a double's exponent bits."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        bits = builder.shl(builder.add(args[0], ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        return builder.bitcast(bits, ir.DoubleType())
    return types.float64(types.int64), codegen


@numba.njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
def exp(x: float) -> float:  # pragma: no cover - compiled
    """e**x for x clamped to [−708, 709] (2 ulp), in arithmetic that vectorises (module doc).
    Inlined by LLVM, not by Numba, so that a caller's reassociation flags do not reach the
    reduction's exact steps."""
    x = min(max(x, -708.0), 709.0)
    n = np.floor(x * _LOG2E + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO  # |r| ≤ ln2 / 2
    p = _C13
    p = p * r + _C12
    p = p * r + _C11
    p = p * r + _C10
    p = p * r + _C9
    p = p * r + _C8
    p = p * r + _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + 1.0
    p = p * r + 1.0
    return p * _pow2(np.int64(n))
