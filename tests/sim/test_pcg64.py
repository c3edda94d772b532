"""The compiled PCG64 stream (sgdsweep.sim.pcg64) against NumPy's Generator.random."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from sgdsweep.sim import pcg64


@numba.njit
def _fill(rows, lane, out):
    hi, lo, inc_hi, inc_lo = rows[lane, 0], rows[lane, 1], rows[lane, 2], rows[lane, 3]
    for i in range(out.shape[0]):
        hi, lo, out[i] = pcg64.next_double(hi, lo, inc_hi, inc_lo)
    rows[lane, 0] = hi
    rows[lane, 1] = lo


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 + 7])
def test_next_double_is_generator_random(seed):
    """The same doubles, bit for bit, as Generator.random over 100,000 draws (every rotation
    of XSL-RR and both words of the 128-bit state take part), from a fresh generator and from
    one that has drawn 32-bit numbers (a buffered word that doubles do not use)."""
    for warm in (False, True):
        gen = np.random.default_rng(seed)
        if warm:
            gen.integers(0, 2**31, size=3, dtype=np.uint32)
        rows = pcg64.states([gen])
        got = np.empty(100_000)
        _fill(rows, 0, got)
        np.testing.assert_array_equal(got, gen.random(100_000))


def test_store_continues_the_generator_where_the_compiled_draws_stopped():
    """After store, each generator draws what it would have drawn had NumPy made the compiled
    loop's draws; its increment is untouched, and the other rows' generators are independent."""
    gens = [np.random.default_rng(s) for s in (3, 4, 5)]
    twins = [np.random.default_rng(s) for s in (3, 4, 5)]
    rows = pcg64.states(gens)
    for lane, n in enumerate((1, 17, 1000)):
        _fill(rows, lane, np.empty(n))
        twins[lane].random(n)
    pcg64.store(gens, rows)
    for gen, twin in zip(gens, twins):
        assert gen.bit_generator.state == twin.bit_generator.state
        np.testing.assert_array_equal(gen.random(50), twin.random(50))


def test_is_pcg64():
    assert pcg64.is_pcg64(np.random.default_rng(0))
    assert not pcg64.is_pcg64(np.random.Generator(np.random.Philox(0)))
    assert not pcg64.is_pcg64(np.random.Generator(np.random.PCG64DXSM(0)))
    assert not pcg64.is_pcg64(object())
