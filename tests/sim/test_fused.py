"""The compiled kernels (sgdsweep.sim.kernels) against the numpy engine on the same random numbers.

Both paths consume the same per-lane uniform and normal streams, so for every supported model,
noise type and observable every accumulator must agree to floating-point rounding — including
lanes that diverge mid-block, per-lane burn-in and loss strides, momentum, the N×N second moment
(flushed from the kernel's δ buffer) and the diagonal + Nyström sketch beyond cov_max_dim. A
wrong sample selection, gradient, update or accumulator in either path fails these tests; the
physics of the shared path is tested against theory in test_engine_statistics.py.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest

from sgdsweep.models import get_model
from sgdsweep.sim import engine, kernels, pcg64
from sgdsweep.sim.kernels import affine, common
from sgdsweep.sim.observables import ObserveSpec
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.sweep.config import build_sweep


def _problem(model: dict[str, Any]):
    model = dict(model)
    grid = {"lr": 0.1, "batch_size": 5}
    if model["kind"] != "digits":
        grid["samples_per_param"] = model.pop("samples_per_param", 5)
    point = build_sweep({"sweep": "t", "model": model, "grid": grid, "dynamics": {"burn_in": 0}}).points[0]
    m = get_model(model["kind"])
    return m.make_problem(m.data_params(point.params))


def _run(problem, noise: str, *, lr, momentum, observe: ObserveSpec, steps: int = 700,
         batch_size: int = 5, threads: int = 1, use_fused: bool, monkeypatch,
         dynamics: engine.Dynamics = engine.Dynamics(),  # noqa: B008 - a frozen dataclass
         w0: np.ndarray | None = None) -> dict[str, np.ndarray]:
    n = len(lr)
    streams = [g[:2] for g in replica_streams(3, "00112233445566778899aabbccddeeff", n)]
    monkeypatch.setenv(kernels.THREADS_ENV, str(threads))
    if not use_fused:
        monkeypatch.setattr(kernels, "supports", lambda *a: False)
    out = engine.run_lanes(problem, noise=noise, batch_size=batch_size, steps=steps, lr=np.array(lr),
                           momentum=np.array(momentum), burn_in=np.arange(n) * 37 % 200,
                           bound=np.full(n, 1e6 * problem.divergence_scale()),
                           w0=np.zeros((n, problem.dim)) + (0.0 if w0 is None else w0), streams=streams,
                           observe=observe,
                           loss_stride=1 + np.arange(n) % 3, dynamics=dynamics)
    monkeypatch.undo()
    return out


CASES = {
    # model, noise, lr (the last lanes diverge), momentum
    "linear minibatch": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5}, "minibatch",
                         [0.1, 0.5, 1.0, 9.0], [0.0, 0.0, 0.0, 0.0]),
    "linear N = 40": (
        {"kind": "linear", "n_inputs": 40, "samples_per_param": 5}, "minibatch", [0.1, 0.5, 1.0, 40.0],
        [0.0, 0.5, 0.0, 0.0]),
    "linear momentum": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5}, "minibatch",
                        [0.1, 0.3, 0.2, 9.0], [0.0, 0.5, 0.9, 0.5]),
    # inputs padded to a multiple of kernels.PAD_INPUTS in the gradient
    "linear N = 10, padded": ({"kind": "linear", "n_inputs": 10, "samples_per_param": 5}, "minibatch",
                              [0.1, 0.3, 0.2, 9.0], [0.0, 0.5, 0.9, 0.5]),
    "linear label, N = 7, padded": ({"kind": "linear", "n_inputs": 7, "samples_per_param": 5, "label_noise": 0.3},
                                    "label", [0.1, 0.5, 0.3, 9.0], [0.0, 0.0, 0.6, 0.0]),
    "linear epoch": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5.25}, "epoch",
                     [0.1, 0.5, 1.0, 9.0], [0.0, 0.3, 0.0, 0.0]),
    "linear replace": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5}, "minibatch_replace",
                       [0.1, 0.5, 1.0, 9.0], [0.0, 0.0, 0.6, 0.0]),
    # correlated inputs: the test loss's quadratic form is a full matrix (isotropic: its diagonal)
    "linear wishart inputs": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5, "inputs": "wishart",
                               "wishart_ratio": 2.0}, "minibatch", [0.1, 0.5, 1.0, 9.0], [0.0, 0.3, 0.0, 0.0]),
    "linear label, two outputs": ({"kind": "linear", "n_inputs": 8, "n_outputs": 2, "samples_per_param": 5,
                                   "label_noise": 0.3}, "label", [0.1, 0.5, 1.0, 9.0], [0.0, 0.2, 0.0, 0.0]),
    "matrix (metric, offsets)": ({"kind": "matrix", "targets": [1.0, 0.5, 0.25], "injected_noise": 0.3},
                                 "minibatch", [0.05, 0.1, 0.2, 40.0], [0.0, 0.5, 0.0, 0.0]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_equals_numpy_engine(name, monkeypatch):
    model, noise, lr, mom = CASES[name]
    problem = _problem(model)
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8)
    a = _run(problem, noise, lr=lr, momentum=mom, observe=observe, use_fused=True, monkeypatch=monkeypatch)
    b = _run(problem, noise, lr=lr, momentum=mom, observe=observe, use_fused=False, monkeypatch=monkeypatch)
    assert kernels.supports(problem, noise, "sgd", [], False)
    rows = kernels.prepare(problem, noise, 5, 1.0, 1.0, np.zeros((0, 0)), True, False, False).data.rows
    assert (rows.shape != problem.x.shape) == name.endswith("padded")  # the padded gradient runs where it should
    assert a.keys() == b.keys()
    assert (a["diverged_step"][-1] > 0) and (a["diverged_step"][:-1] == -1).all()  # the last lane diverges
    assert a["n"][:-1].min() > 100 and a["loss_count"][:-1].min() > 30
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


DATA_ADDED = {
    # model, noise, lr (the last lane diverges), dynamics
    "linear gaussian": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5}, "gaussian",
                        [0.1, 0.5, 1.0, 20.0], engine.Dynamics()),
    "linear gaussian_matched": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5}, "gaussian_matched",
                                [0.1, 0.5, 1.0, 20.0], engine.Dynamics()),
    "linear student_t, two outputs": ({"kind": "linear", "n_inputs": 6, "n_outputs": 2, "samples_per_param": 5},
                                      "student_t", [0.1, 0.5, 1.0, 20.0], engine.Dynamics()),
    "matrix gaussian (metric, offsets)": ({"kind": "matrix", "targets": [1.0, 0.5, 0.25], "injected_noise": 0.3},
                                          "gaussian", [0.05, 0.1, 0.2, 40.0], engine.Dynamics()),
    "matrix student_t (metric, offsets)": ({"kind": "matrix", "targets": [1.0, 0.5, 0.25], "injected_noise": 0.3},
                                           "student_t", [0.05, 0.1, 0.2, 40.0], engine.Dynamics()),
    "linear gaussian_matched sde, dt = lr/4": ({"kind": "linear", "n_inputs": 12, "samples_per_param": 5},
                                               "gaussian_matched", [0.1, 0.5, 1.0, 80.0], engine.Dynamics("sde", 0.25)),
}


@pytest.mark.parametrize("name", list(DATA_ADDED))
def test_added_noise_on_data_equals_numpy_engine(name, monkeypatch):
    """Added noise on a data set: the full gradient plus isotropic, matched-covariance or Student-t
    noise (the kernel's weighted sum over every sample), under SGD and the SDE."""
    model, noise, lr, dyn = DATA_ADDED[name]
    problem = _problem(model)
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8)
    kw = dict(lr=lr, momentum=[0.0, 0.5, 0.0, 0.0], observe=observe, dynamics=dyn, monkeypatch=monkeypatch)
    a = _run(problem, noise, use_fused=True, **kw)
    b = _run(problem, noise, use_fused=False, **kw)
    assert kernels.supports(problem, noise, dyn.kind, [], False)
    assert (a["diverged_step"][-1] > 0) and (a["diverged_step"][:-1] == -1).all()
    assert a["n"][:-1].min() > 100 and a["loss_count"][:-1].min() > 30
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


@pytest.mark.parametrize("name", ["linear minibatch", "linear epoch", "linear label, two outputs",
                                  "matrix (metric, offsets)"])
def test_gradient_noise_lags_equal_numpy_engine(name, monkeypatch):
    """Han's D(m): the gradient noise at the minimum of each step's batch, its lagged sums and
    the Gram sum of δ, fed from the kernel as from the numpy engine."""
    model, noise, lr, mom = CASES[name]
    problem = _problem(model)
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8, noise_lags=(1, 2, 5))
    a = _run(problem, noise, lr=lr, momentum=mom, observe=observe, use_fused=True, monkeypatch=monkeypatch)
    b = _run(problem, noise, lr=lr, momentum=mom, observe=observe, use_fused=False, monkeypatch=monkeypatch)
    assert kernels.supports(problem, noise, "sgd", [0, 1, 2, 5], False)
    assert (np.abs(a["noise_lag"][:-1]).max(axis=(2, 3)) > 0).all() and (a["sum_gram"][:-1] != 0).any()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


def test_fused_sketch_beyond_cov_max_dim_and_threads(monkeypatch):
    """digits (d = 610 > cov_max_dim): diagonal + sketch + held-out test loss, two threads."""
    problem = _problem({"kind": "digits"})
    observe = ObserveSpec(cov_max_dim=64, n_eigenpairs=4, autocorr_lags=4)
    lr, mom = [0.01, 0.02, 0.05, 0.05, 0.01], [0.0, 0.0, 0.5, 0.0, 0.9]
    a = _run(problem, "minibatch", lr=lr, momentum=mom, observe=observe, steps=300, threads=2,
             use_fused=True, monkeypatch=monkeypatch)
    b = _run(problem, "minibatch", lr=lr, momentum=mom, observe=observe, steps=300, use_fused=False,
             monkeypatch=monkeypatch)
    assert "sketch" in a and "sum_test_loss" in a and "sum_dd" not in a
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


ADDITIVE = {
    # model, noise, lr (the last lane diverges), momentum, dynamics
    "quadratic gaussian, non-commuting C": (
        {"kind": "quadratic", "curvatures": [1.0, 0.3, 0.1], "noise_cov": [[1.0, 0.6, 0.1], [0.6, 2.0, 0.3],
                                                                          [0.1, 0.3, 0.5]]},
        "gaussian", [0.2, 1.0, 1.5, 2.5], [0.0, 0.5, 0.0, 0.0], engine.Dynamics()),
    "quadratic student_t": ({"kind": "quadratic", "curvatures": [1.0, 0.3], "noise_cov": [1.0, 2.0]},
                            "student_t", [0.2, 1.0, 0.5, 2.5], [0.0, 0.0, 0.7, 0.0], engine.Dynamics()),
    "quadratic sde, dt = lr/4": ({"kind": "quadratic", "curvatures": [1.0, 0.3], "noise_cov": [1.0, 2.0]},
                                 "gaussian", [0.2, 1.0, 0.5, 12.0], [0.0, 0.0, 0.0, 0.0], engine.Dynamics("sde", 0.25)),
}


@pytest.mark.parametrize("name", list(ADDITIVE))
@pytest.mark.parametrize("cov_max_dim", [64, 2], ids=["full", "diagonal beyond d = 2"])
def test_additive_kernel_equals_numpy_engine(name, cov_max_dim, monkeypatch):
    model, noise, lr, mom, dyn = ADDITIVE[name]
    point = build_sweep({"sweep": "t", "model": model, "grid": {"lr": 0.1, "batch_size": 2, "noise": noise},
                         "dynamics": {"burn_in": 0}}).points[0]
    problem = get_model("quadratic").make_problem(get_model("quadratic").data_params(point.params))
    observe = ObserveSpec(cov_max_dim=cov_max_dim, n_eigenpairs=1, autocorr_lags=8, test_loss=False)
    kw = dict(lr=lr, momentum=mom, observe=observe, batch_size=2, dynamics=dyn, monkeypatch=monkeypatch)
    a = _run(problem, noise, use_fused=True, **kw)
    b = _run(problem, noise, use_fused=False, **kw)
    assert kernels.supports(problem, noise, dyn.kind, [], False)
    assert (a["diverged_step"][-1] > 0) and (a["diverged_step"][:-1] == -1).all()
    assert a["n"][:-1].min() > 100
    assert ("sum_dd" in a) == (problem.dim <= cov_max_dim) and ("sketch" in a) == (problem.dim > cov_max_dim)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


def test_double_well_escapes_stop_lanes(monkeypatch):
    """Lanes that escape are stopped at the same step, with the same accumulators, by both paths."""
    point = build_sweep({"sweep": "t", "model": {"kind": "landscape", "landscape": "double_well", "barrier": 0.3},
                         "grid": {"lr": 0.1, "batch_size": 1, "noise": "gaussian"},
                         "dynamics": {"burn_in": 0}}).points[0]
    m = get_model("landscape")
    problem = m.make_problem(m.data_params(point.params))
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8, test_loss=False, escape=True)
    kw = dict(lr=[0.1] * 12, momentum=[0.0] * 12, observe=observe, batch_size=1, steps=3000, monkeypatch=monkeypatch)
    a = _run(problem, "gaussian", use_fused=True, **kw)
    b = _run(problem, "gaussian", use_fused=False, **kw)
    assert kernels.supports(problem, "gaussian", "sgd", [], True)
    assert 0 < (a["escape_step"] >= 0).sum() < 12  # some escape, some stay
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the diverging lane, numpy path
@pytest.mark.parametrize("noise, cov_max_dim", [("minibatch", 64), ("minibatch_replace", 64), ("epoch", 64),
                                                ("minibatch", 1)])
def test_thesis_kernel_equals_numpy_engine(noise, cov_max_dim, monkeypatch):
    """The thesis landscape from its spurious minimum: escapes, momentum, a diverging lane; with
    the full second moment and (cov_max_dim 1 < d = 2) its diagonal and the sketch."""
    point = build_sweep({"sweep": "t", "model": {"kind": "landscape", "landscape": "thesis", "start": "spurious"},
                         "grid": {"lr": 3e-3, "batch_size": 3, "noise": noise}, "dynamics": {"burn_in": 0}}).points[0]
    m = get_model("landscape")
    problem = m.make_problem(m.data_params(point.params))
    observe = ObserveSpec(cov_max_dim=cov_max_dim, n_eigenpairs=1, autocorr_lags=8, escape=True)
    lr = [3e-3, 4e-3, 5e-3, 3e-3, 0.5]
    kw = dict(lr=lr, momentum=[0.0, 0.0, 0.0, 0.5, 0.0], observe=observe, batch_size=3, steps=1500,
              w0=problem.w_min, monkeypatch=monkeypatch)
    a = _run(problem, noise, use_fused=True, **kw)
    b = _run(problem, noise, use_fused=False, **kw)
    assert kernels.supports(problem, noise, "sgd", [], True)
    assert (a["escape_step"] >= 0).any() and (a["escape_step"] < 0).any() and a["diverged_step"][-1] >= 0
    assert ("sum_dd" in a) == (cov_max_dim >= 2) and ("sketch" in a) == (cov_max_dim < 2)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the diverging lane, numpy path
@pytest.mark.parametrize("noise, dyn", [("gaussian", engine.Dynamics()), ("gaussian_matched", engine.Dynamics()),
                                        ("student_t", engine.Dynamics()),
                                        ("gaussian_matched", engine.Dynamics("sde", 0.5))])
def test_thesis_added_noise_equals_numpy_engine(noise, dyn, monkeypatch):
    """The thesis landscape at its real minimum with added noise (vescovi_sde_vs_sgd's SDE is
    gaussian_matched): the full gradient over all 600 samples plus the noise, a diverging lane."""
    point = build_sweep({"sweep": "t", "model": {"kind": "landscape", "landscape": "thesis", "start": "real"},
                         "grid": {"lr": 1e-3, "batch_size": 10, "noise": noise}, "dynamics": {"burn_in": 0}}).points[0]
    m = get_model("landscape")
    problem = m.make_problem(m.data_params(point.params))
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8)
    kw = dict(lr=[1e-3, 4e-3, 1e-2, 4e-3, 0.5], momentum=[0.0, 0.0, 0.0, 0.5, 0.0], observe=observe,
              batch_size=10, steps=400, w0=problem.w_min, dynamics=dyn, monkeypatch=monkeypatch)
    a = _run(problem, noise, use_fused=True, **kw)
    b = _run(problem, noise, use_fused=False, **kw)
    assert kernels.supports(problem, noise, dyn.kind, [], False)
    assert (a["diverged_step"][-1] >= 0) and (a["diverged_step"][:-1] == -1).all()
    assert a["n"][:-1].min() > 100
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


@pytest.mark.parametrize("noise, dyn", [("minibatch", engine.Dynamics()), ("label", engine.Dynamics()),
                                        ("epoch", engine.Dynamics()), ("gaussian_matched", engine.Dynamics()),
                                        ("student_t", engine.Dynamics()),
                                        ("gaussian_matched", engine.Dynamics("sde", 0.5))])
def test_two_layer_kernel_equals_numpy_engine(noise, dyn, monkeypatch):
    """two_layer (per-lane reference, |w|² bound, test loss against the teacher), two outputs;
    sampled noise, and added noise under SGD and the SDE."""
    point = build_sweep({"sweep": "t", "model": {"kind": "two_layer", "n_inputs": 6, "n_outputs": 2,
                                                 "labels": "teacher", "label_noise": 0.5},
                         "grid": {"lr": 0.05, "batch_size": 4, "samples_per_param": 10, "hidden_width": 3,
                                  "noise": noise}, "dynamics": {"burn_in": 0}}).points[0]
    m = get_model("two_layer")
    problem = m.make_problem(m.data_params(point.params))
    w0 = np.random.default_rng(5).standard_normal(problem.dim) * 0.3
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8)
    kw = dict(lr=[0.05, 0.1, 0.05, 30.0], momentum=[0.0, 0.0, 0.5, 0.0], observe=observe, batch_size=4,
              w0=w0, dynamics=dyn, monkeypatch=monkeypatch)
    a = _run(problem, noise, use_fused=True, **kw)
    b = _run(problem, noise, use_fused=False, **kw)
    assert kernels.supports(problem, noise, dyn.kind, [], False)
    assert (a["diverged_step"][-1] > 0) and (a["diverged_step"][:-1] == -1).all()
    assert a["n"][:-1].min() > 100 and np.isfinite(a["reference"][:-1]).all()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(b[k]), initial=1.0), err_msg=k)


def test_wrong_update_is_caught(monkeypatch):
    """The comparison is not vacuous: another sample stream (one more draw per step) differs."""
    problem = _problem(CASES["linear minibatch"][0])
    observe = ObserveSpec(cov_max_dim=64, autocorr_lags=8)
    lr, mom = [0.1, 0.5, 1.0], [0.0, 0.0, 0.0]
    a = _run(problem, "minibatch", lr=lr, momentum=mom, observe=observe, use_fused=True, monkeypatch=monkeypatch)
    b = _run(problem, "minibatch", lr=lr, momentum=mom, observe=observe, batch_size=6, use_fused=False,
             monkeypatch=monkeypatch)
    assert not np.allclose(a["sum_dd"], b["sum_dd"], rtol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
def test_uniform_generators_continue_after_the_kernels(threads, monkeypatch):
    """The kernels draw the uniforms from copies of the generators' PCG64 states; afterwards
    each generator that ran every step (across several blocks and chunks) stands where it
    would after the numpy engine's draws: steps × S numbers on."""
    problem = _problem(CASES["linear minibatch"][0])
    n, steps, s = 40, engine.BLOCK_STEPS + 100, 5
    streams = [g[:2] for g in replica_streams(3, "00112233445566778899aabbccddeeff", n)]
    twins = [g[0] for g in replica_streams(3, "00112233445566778899aabbccddeeff", n)]
    assert kernels.supports(problem, "minibatch", "sgd", [], False) and all(pcg64.is_pcg64(g) for g, _ in streams)
    monkeypatch.setenv(kernels.THREADS_ENV, str(threads))
    engine.run_lanes(problem, noise="minibatch", batch_size=s, steps=steps, lr=np.full(n, 0.1),
                     momentum=np.zeros(n), burn_in=np.zeros(n), bound=np.full(n, 1e6 * problem.divergence_scale()),
                     w0=np.zeros((n, problem.dim)), streams=streams, observe=ObserveSpec(autocorr_lags=8))
    for (gen, _), twin in zip(streams, twins):
        twin.random(steps * s)
        assert gen.bit_generator.state == twin.bit_generator.state


@pytest.mark.parametrize("n_in", [7, kernels.EIGHT_ROWS_MIN])
@pytest.mark.parametrize("has_label", [False, True])
def test_plain_gradient_every_batch_size(has_label, n_in):
    """The inlined data sum of one output (rows eight, four, two and one at a time) against the
    formula Σ_k w_k (x_k·w − y_ko − ε_ko) x_k, for every remainder of S modulo 8 and each of 3
    outputs, below and at the input count from which rows go eight at a time."""
    rng = np.random.default_rng(5)
    x, y, wm = rng.standard_normal((30, n_in)), rng.standard_normal((30, 3)), rng.standard_normal((3, n_in))
    for s in range(1, 18):
        idx = rng.integers(0, 30, s)
        weight, z = rng.random(s), rng.standard_normal((2, 3, s * 3))  # normals of 2 lanes × 3 steps
        zl = z[1, 2].reshape(s, 3)  # lane 1's at step 2, the ones used
        for o in range(3):
            g = np.full((3, n_in), np.nan)
            affine.plain_grad(wm.ravel(), x, y, o, idx, weight, 0.3, z, 1, 2, has_label, g.ravel())
            resid = x[idx] @ wm[o] - y[idx, o] - (0.3 * zl[:, o] if has_label else 0.0)
            np.testing.assert_allclose(g[o], (weight * resid) @ x[idx], rtol=1e-12, atol=1e-12)
            assert np.isnan(np.delete(g, o, axis=0)).all()  # the other outputs' entries untouched


@pytest.mark.parametrize("has_label", [False, True])
@pytest.mark.parametrize("extras", ["none", "metric", "offsets", "both"])
def test_affine_gradient_is_the_formula(extras, has_label):
    """The affine gradient Σ_k w_k [M (W x_k − y_k − ε_k) x_kᵀ − a_k] with several outputs, the
    metric applied after the sum and the offsets: against the formula per sample (a metric that
    is not symmetric catches M applied transposed)."""
    rng = np.random.default_rng(11)
    n_out, n_in, p, s = 3, 5, 20, 7
    x, y = rng.standard_normal((p, n_in)), rng.standard_normal((p, n_out))
    wm = rng.standard_normal((n_out, n_in))
    # models' metrics are symmetric (ZᵀZ), where M e = (eᵀM)ᵀ as the numpy engine computes it;
    # a non-symmetric one here pins down the side the kernel applies it on
    metric = rng.standard_normal((n_out, n_out)) if extras in ("metric", "both") else np.zeros((0, 0))
    offsets = rng.standard_normal((p, n_out * n_in)) if extras in ("offsets", "both") else np.zeros((0, 0))
    idx, weight, z = rng.integers(0, p, s), rng.random(s), rng.standard_normal((3, 2, s * n_out))
    zl = z[2, 1].reshape(s, n_out)  # lane 2's normals at step 1, the ones used
    g = np.empty(n_out * n_in)
    affine.affine_grad(wm.ravel(), x, y, idx, weight, metric, offsets, 0.4, z, 2, 1, has_label,
                       np.empty(n_out * n_in), g)
    want = np.zeros((n_out, n_in))
    for k in range(s):
        e = wm @ x[idx[k]] - y[idx[k]] - (0.4 * zl[k] if has_label else 0.0)
        if metric.size:
            e = metric @ e
        want += weight[k] * np.outer(e, x[idx[k]])
        if offsets.size:
            want -= weight[k] * offsets[idx[k]].reshape(n_out, n_in)
    np.testing.assert_allclose(g, want.ravel(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 5, 10, 40, 77])
def test_second_moment_flush_is_the_rank_k_update(d):
    """The flush of the δ buffer, a partial buffer included, adds the lower triangle of
    Σ_b δ_b δ_bᵀ to its lane's sum and leaves the upper triangle and the other lanes alone (odd d:
    the blocked loop's last row; fewer than four steps: its remainder loop)."""
    rng = np.random.default_rng(d)
    for nbuf in (1, 3, 4, 5, kernels.DELTA_BUFFER):
        dbuf = rng.standard_normal((kernels.DELTA_BUFFER, d))  # δ_b, one row per buffered step
        before = rng.standard_normal((3, d, d))  # three lanes' sums; the middle one is flushed
        out = before.copy()
        common.flush(dbuf, nbuf, out, 1)
        want = before[1] + dbuf[:nbuf].T @ dbuf[:nbuf]
        np.testing.assert_allclose(np.tril(out[1]), np.tril(want), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.triu(out[1], 1), np.triu(before[1], 1))
        np.testing.assert_array_equal(out[[0, 2]], before[[0, 2]])


def test_threads_env_is_checked(monkeypatch):
    monkeypatch.setenv(kernels.THREADS_ENV, "two")
    with pytest.raises(ValueError, match="SGDSWEEP_THREADS='two'"):
        kernels.threads()


def test_vectorisable_exp_is_within_two_ulp():
    """sgdsweep.sim.vecmath.exp against np.exp on its whole range [−708, 709] and densely near 0
    (dropping a Taylor term or the low part of ln 2 breaks the bound), clamped beyond it."""
    from sgdsweep.sim.vecmath import exp

    @numba.njit
    def each(x, out):  # pragma: no cover - compiled
        for k in range(x.shape[0]):
            out[k] = exp(x[k])

    x = np.concatenate([np.linspace(-708.0, 709.0, 400_001), np.random.default_rng(3).uniform(-2.0, 2.0, 100_000)])
    got = np.empty_like(x)
    each(x, got)
    want = np.exp(x)
    np.testing.assert_array_less(np.abs(got - want), 2 * np.spacing(want))
    beyond, ends = np.empty(2), np.empty(2)
    each(np.array([-1000.0, 1000.0]), beyond)
    each(np.array([-708.0, 709.0]), ends)
    np.testing.assert_array_equal(beyond, ends)



def test_a_family_s_kernel_gets_one_argument_type_whatever_the_problem_s_arrays():
    """Numba compiles a kernel once per argument type, and an array's writability and layout are
    part of it: inputs padded for the gradient (a fresh array) or not (the problem's own,
    read-only), a strided separatrix normal or a contiguous one, reach the kernel as one type,
    so a sweep over them compiles each kernel once."""
    def data_type(problem, noise="minibatch"):
        k = kernels.prepare(problem, noise, 2, 1.0, 1.0, np.zeros((0, 0)), True, False, False)
        return numba.typeof(k.data)

    padded, plain = (_problem({"kind": "linear", "n_inputs": n}) for n in (10, 12))
    assert affine.padded_inputs(padded.x).size and not affine.padded_inputs(plain.x).size
    assert data_type(padded) == data_type(plain)
    m = get_model("landscape")
    thesis = m.make_problem(m.data_params(build_sweep({
        "sweep": "t", "model": {"kind": "landscape", "landscape": "thesis"}, "grid": {"lr": 3e-3, "batch_size": 3},
        "dynamics": {"burn_in": 0}}).points[0].params))
    strided = np.repeat(np.asarray(thesis.normal, float), 2)[::2]  # the same values, a strided array
    assert not strided.flags.c_contiguous
    before = data_type(thesis)
    thesis.normal = strided
    assert data_type(thesis) == before


def test_every_kernel_family_a_problem_can_name_has_its_plug_in():
    """The families a problem class can name (models.base.KERNELS) are the dispatch table's, and
    each plug-in has what kernels.supports and kernels.prepare call."""
    from sgdsweep.models.base import KERNELS

    assert set(kernels.FAMILIES) == set(KERNELS)
    for name, plug in kernels.FAMILIES.items():
        for attr in ("supports", "amplitude", "data", "block", "KERNELS"):
            assert callable(getattr(plug, attr, None)) or attr == "KERNELS", (name, attr)
        assert len(plug.KERNELS) == 2, name


def test_the_cache_digest_follows_the_code_into_other_modules():
    """Each family's digest covers the modules its compiled code comes from, found by following
    it: the PCG64 stream, the noise helpers, the observables, the vectorisable exp."""
    from sgdsweep.sim.kernels import additive, digest, thesis, two_layer

    common_modules = {"sgdsweep.sim.kernels.common", "sgdsweep.sim.kernels.loop", "sgdsweep.sim.pcg64",
                      "sgdsweep.sim.noise"}
    files, constants = digest.compiled_sources(thesis)
    assert common_modules | {"sgdsweep.sim.kernels.thesis", "sgdsweep.sim.vecmath"} <= set(files)
    assert constants["sgdsweep.sim.kernels.common.STUDENT_NU"] == "4"  # a constant read from another module
    assert "sgdsweep.sim.observables" in digest.compiled_sources(affine)[0]
    assert "sgdsweep.sim.kernels.affine" in digest.compiled_sources(two_layer)[0]  # its plain_grad
    assert "sgdsweep.sim.vecmath" not in digest.compiled_sources(additive)[0]
    assert len({digest.source_digest(f) for f in (affine, additive, thesis, two_layer)}) == 4

CACHE_PROBE = """
import json, sys
import numpy as np
import sgdsweep
from sgdsweep.models import get_model
from sgdsweep.sim import engine
from sgdsweep.sim.kernels import additive
from sgdsweep.sim.observables import ObserveSpec
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.sweep.config import build_sweep

assert sgdsweep.__file__.startswith(sys.argv[1]), sgdsweep.__file__
point = build_sweep({"sweep": "t", "model": {"kind": "quadratic", "curvatures": [1.0, 0.3], "noise_cov": [1.0, 2.0]},
                     "grid": {"lr": 0.1, "batch_size": 2, "noise": "gaussian"}, "dynamics": {"burn_in": 0}}).points[0]
model = get_model("quadratic")
problem = model.make_problem(model.data_params(point.params))
out = engine.run_lanes(problem, noise="gaussian", batch_size=2, steps=50, lr=np.full(2, 0.1), momentum=np.zeros(2),
                       burn_in=np.zeros(2, np.int64), bound=np.full(2, 1e6), w0=np.zeros((2, problem.dim)),
                       streams=[g[:2] for g in replica_streams(3, "0" * 32, 2)],
                       observe=ObserveSpec(cov_max_dim=64, autocorr_lags=8, test_loss=False))
stats = additive.KERNELS[0].stats  # the kernel that keeps Σδδᵀ
print(json.dumps({"w": out["w_final"].tolist(), "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
"""


def test_cached_kernels_are_compiled_again_when_a_helper_module_changes(tmp_path):
    """A kernel is cached by Numba: of two processes that start it at once with nothing compiled,
    one compiles it and the other waits and loads it (``compiling.ensure_compiled``); and an edit to a
    compiled helper in another module than the kernel's own (the heavy-ball update in
    kernels/common.py) makes the next process compile it again rather than load stale machine
    code: real processes on a copy of the package."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import sgdsweep

    repo = Path(sgdsweep.__file__).parent.parent
    shutil.copytree(repo / "sgdsweep", tmp_path / "sgdsweep", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Snakefile", "workflow"):  # the config schema
        (tmp_path / name).symlink_to(repo / name)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}

    def probes(n: int = 1) -> list[dict]:
        procs = [subprocess.Popen([sys.executable, "-c", CACHE_PROBE, str(tmp_path)], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
        outs = [proc.communicate(timeout=600) for proc in procs]
        for proc, (_, err) in zip(procs, outs, strict=True):
            assert proc.returncode == 0, err[-3000:]
        return [json.loads(out.splitlines()[-1]) for out, _ in outs]

    def probe() -> dict:
        return probes()[0]

    first, again = sorted(probes(2), key=lambda p: p["hits"])  # started together
    assert first["misses"] == 1 and again["hits"] == 1 and again["misses"] == 0  # compiled once, then loaded
    assert again["w"] == first["w"]
    common_py = tmp_path / "sgdsweep" / "sim" / "kernels" / "common.py"
    source = common_py.read_text(encoding="utf-8")
    assert source.count("wl[i] -= dt * g[i]") == 1
    common_py.write_text(source.replace("wl[i] -= dt * g[i]", "wl[i] -= 0.5 * dt * g[i]"), encoding="utf-8")
    edited = probe()
    assert edited["misses"] == 1 and edited["hits"] == 0  # compiled again, not loaded
    assert edited["w"] != first["w"]  # and the edit is in the machine code that ran
