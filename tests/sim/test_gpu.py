"""The GPU path (:mod:`sgdsweep.sim.gpu`): its counter-based indices, its numpy reference against
the exact theory, and — where CuPy sees a CUDA device — the kernel against the reference.

CI has no GPU: there the kernel test is skipped and the reference, which defines the kernel's
arithmetic and random indices, is what runs. ``benchmarks/kernel_gpu.py`` repeats the
kernel-against-reference check on the device before it times anything.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from sgdsweep.models import linear
from sgdsweep.sim import gpu
from sgdsweep.theory import linear as th


def make_data(n: int = 8, p: int = 64, n_outputs: int = 1):
    return linear.make_problem({"n_inputs": n, "n_outputs": n_outputs, "n_samples": p, "label_noise": 0.5,
                                "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                "noiseless": False, "seed": 3})


def test_splitmix64_matches_the_published_sequence():
    """SplitMix64 seeded with 0 gives 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F (Vigna's
    reference); the CUDA kernel implements the same finaliser."""
    state = np.uint64(0x9E3779B97F4A7C15) * np.arange(3, dtype=np.uint64)
    out = gpu.splitmix64(state)
    assert [hex(int(v)) for v in out] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4", "0x6c45d188009454f"]


def test_batch_indices_are_uniform_and_independent_of_the_other_replicas():
    keys = gpu.replica_keys(seed=7, replicas=200)
    idx = np.concatenate([gpu.batch_indices(keys, t, 5, 37) for t in range(40)])
    counts = np.bincount(idx.ravel(), minlength=37)
    assert idx.min() >= 0 and idx.max() < 37
    assert scipy.stats.chisquare(counts).pvalue > 1e-3
    # replica 13's stream is the same when it is alone
    alone = gpu.batch_indices(gpu.replica_keys(seed=7, replicas=14)[13:], 11, 5, 37)
    np.testing.assert_array_equal(alone[0], gpu.batch_indices(keys, 11, 5, 37)[13])


@pytest.mark.parametrize("momentum", [0.0, 0.6])
def test_reference_weight_variance_matches_exact_theory(momentum):
    """The time mean of |w − ŵ|²/N over independent replicas against Tr(M)/N of the exact
    discrete-time theory with replacement; the tolerance is 4 standard errors across replicas.
    The theory without replacement (a (P − S)/(P − 1) smaller noise) must be rejected, so the
    test can tell the sampling scheme apart."""
    data = make_data()
    lr, s, replicas, burn, steps = 0.8 * (1 - momentum), 4, 600, 300, 1500
    run = gpu.run_reference(data, lr=lr, momentum=momentum, batch_size=s, steps=steps, burn_in=burn,
                            w0=np.tile(data.w_min, (replicas, 1)), seed=1)
    mean, se = run.sq_dev.mean(), run.sq_dev.std(ddof=1) / np.sqrt(replicas)
    exact = th.weight_var(th.stationary_second_moment(data, lr, s, momentum, noise="minibatch_replace"))
    other = th.weight_var(th.stationary_second_moment(data, lr, s, momentum, noise="minibatch"))
    assert abs(mean - exact) < 4 * se, (mean, exact, se)
    assert abs(mean - other) > 6 * se, (mean, other, se)


def test_reference_does_not_depend_on_the_other_replicas():
    data = make_data()
    w0 = np.random.default_rng(0).standard_normal((5, data.n_inputs))
    kw = {"lr": 0.3, "momentum": 0.5, "batch_size": 3, "steps": 50, "burn_in": 10, "seed": 2}
    all5 = gpu.run_reference(data, w0=w0, **kw)
    first3 = gpu.run_reference(data, w0=w0[:3], **kw)
    np.testing.assert_array_equal(all5.w_final[:3], first3.w_final)
    np.testing.assert_array_equal(all5.sq_dev[:3], first3.sq_dev)


@pytest.mark.parametrize("bad, message", [
    ({"lr": 0.0}, "lr=0.0"),
    ({"momentum": 1.0}, "momentum=1.0"),
    ({"batch_size": 65}, "batch_size=65"),
    ({"burn_in": 50}, "burn_in=50"),
    ({"w0": np.zeros((2, 3))}, "w0 has shape"),
    ({"seed": -1}, "seed=-1"),
])
def test_bad_arguments_are_named(bad, message):
    kw = {"lr": 0.1, "momentum": 0.0, "batch_size": 4, "steps": 50, "burn_in": 0, "w0": np.zeros((2, 8)), "seed": 0}
    with pytest.raises(ValueError, match=message):
        gpu.run_reference(make_data(), **{**kw, **bad})


def test_two_outputs_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="n_outputs=2.*CPU engine"):
        gpu.run_reference(make_data(n_outputs=2), lr=0.1, momentum=0.0, batch_size=4, steps=5, burn_in=0,
                          w0=np.zeros((2, 16)), seed=0)


def test_run_cupy_without_a_device_says_so():
    if gpu.cupy_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="CuPy and a CUDA device"):
        gpu.run_cupy(make_data(), lr=0.1, momentum=0.0, batch_size=4, steps=5, burn_in=0,
                     w0=np.zeros((2, 8)), seed=0)


@pytest.mark.skipif(not gpu.cupy_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("n, s, momentum", [(40, 6, 0.0), (100, 10, 0.6), (33, 1, 0.3)])
def test_cupy_kernel_equals_reference(n, s, momentum):
    """Same indices, same arithmetic up to rounding; N = 33 leaves 31 padding components."""
    data = make_data(n=n, p=300)
    w0 = np.random.default_rng(1).standard_normal((37, data.n_inputs))
    kw = {"lr": 0.5, "momentum": momentum, "batch_size": s, "steps": 300, "burn_in": 100, "w0": w0, "seed": 5}
    ref, dev = gpu.run_reference(data, **kw), gpu.run_cupy(data, **kw)
    np.testing.assert_allclose(dev.w_final, ref.w_final, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.sq_dev, ref.sq_dev, rtol=1e-9)


@pytest.mark.skipif(not gpu.cupy_available(), reason="needs CuPy and a CUDA device")
def test_cupy_ensemble_in_pieces_equals_one_run():
    data = make_data()
    kw = {"lr": 0.3, "momentum": 0.5, "batch_size": 4, "burn_in": 20, "w0": np.zeros((9, data.n_inputs)), "seed": 4}
    ens = gpu.CupyEnsemble(data, **kw)
    for steps in (7, 30, 13):
        ens.advance(steps)
    whole = gpu.run_cupy(data, steps=50, **kw)
    np.testing.assert_array_equal(ens.result().w_final, whole.w_final)
    np.testing.assert_allclose(ens.result().sq_dev, whole.sq_dev, rtol=1e-12)
