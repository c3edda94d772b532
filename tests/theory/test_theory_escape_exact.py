"""The exact escape time of the discrete SGD chain (sgdsweep.theory.escape_exact) against
independent numerics, never against itself: Monte Carlo of the chain written here with its own
loop (fixed seeds, tolerance from the standard error), the quadrature MFPT of the overdamped
Langevin equation in the limit λ → 0 at fixed λσ²/S (docs/physics.md §6), and finer grids."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.integrate

from sgdsweep.models.landscape import make_problem
from sgdsweep.theory import escape_exact
from sgdsweep.theory.escape import kramers_steps

# docs/physics.md §6's example: ΔL = 0.25, k_a = 2, k_b = 1, S = 4, σ² = 8/9
BARRIER, K_A, K_B, S = 0.25, 2.0, 1.0, 4


def _well(noise_std: float):
    return make_problem({"landscape": "double_well", "barrier": BARRIER, "curvature_min": K_A,
                         "curvature_saddle": K_B, "noise_std": noise_std})


def _quartic():
    """U(w) = ½k_a w² + c₃w³ + c₄w⁴ with barrier ΔL at s and curvatures k_a, −k_b (written out here,
    not taken from the model), and the second minimum where the measurement counts escape."""
    s = math.sqrt(12 * BARRIER / (K_A + K_B))
    c3, c4 = -(2 * K_A - K_B) / (3 * s), (K_A - K_B) / (4 * s * s)
    return (lambda w: 0.5 * K_A * w**2 + c3 * w**3 + c4 * w**4,
            lambda w: K_A * w + 3 * c3 * w**2 + 4 * c4 * w**3, s * K_A / (K_A - K_B))


def _first_passage(step_fn, w0: np.ndarray, escaped_fn, max_steps: int) -> np.ndarray:
    """Steps until each replica first satisfies ``escaped_fn`` (every replica must escape)."""
    w = w0.copy()
    times = np.zeros(len(w), dtype=np.int64)
    alive = np.ones(len(w), dtype=bool)
    for t in range(1, max_steps + 1):
        w[alive] = step_fn(w[alive])
        done = alive.copy()
        done[alive] = escaped_fn(w[alive])
        times[done] = t
        alive &= ~done
        if not alive.any():
            return times
    raise AssertionError(f"{alive.sum()} replicas did not escape in {max_steps} steps")


def _agrees(times: np.ndarray, tau: float) -> tuple[bool, str]:
    mean, se = times.mean(), times.std(ddof=1) / math.sqrt(len(times))
    return abs(mean - tau) < 3 * se, f"Monte Carlo {mean:.1f} ± {se:.1f}, exact {tau:.1f}"


@pytest.mark.parametrize("noise,lr", [("gaussian", 0.45), ("gaussian", 0.3), ("student_t", 0.45)])
def test_double_well_matches_monte_carlo_of_the_chain(noise, lr):
    """At T = λσ²/(2S) = 0.05 (ΔL/T = 5) and λk_a = 0.9 (docs/physics.md §6's example, τ ≈ 735 where
    Kramers says 1,465) and 0.6; Student-t noise (ν = 4) of the same variance escapes ~4× faster."""
    sigma = math.sqrt(0.4 / lr)
    _, du, threshold = _quartic()
    std = sigma / math.sqrt(S)
    rng = np.random.default_rng(7)

    def step(w):
        z = rng.standard_normal(len(w))
        if noise == "student_t":  # z √((ν−2)/χ²_ν): Student-t of unit variance
            z = z * np.sqrt(2.0 / rng.chisquare(4, len(w)))
        return w - lr * (du(w) + std * z)

    times = _first_passage(step, np.zeros(5000), lambda w: w >= threshold, 100_000)
    res = escape_exact.double_well(_well(sigma), lr, sigma**2 / S, noise)
    ok, msg = _agrees(times, res.steps)
    assert ok, msg
    if noise == "gaussian" and lr == 0.45:
        assert res.steps < 0.6 * kramers_steps(BARRIER, K_A, K_B, lr, sigma**2 / S)


def _continuous_mfpt(temperature: float) -> float:
    """(1/T)∫_0^b dy e^{U(y)/T} ∫_{−∞}^y dz e^{−U(z)/T}: the overdamped Langevin MFPT from the
    minimum to the second minimum b (continuous time t = λ·steps)."""
    u, _, b = _quartic()
    z = np.linspace(-1.5, b, 400_001)
    inner = scipy.integrate.cumulative_trapezoid(np.exp(-u(z) / temperature), z, initial=0.0)
    outer = np.exp(u(z) / temperature) * inner / temperature
    start = np.searchsorted(z, 0.0)
    return float(np.trapezoid(outer[start:], z[start:]))


def test_continuous_time_limit_is_the_langevin_mfpt():
    """λ → 0 at fixed T = λσ²/(2S) = 0.05 (ΔL/T = 5): λτ tends to the quadrature MFPT (within the
    grid's 1 %), monotonically from below; at λk_a = 0.4 the chain escapes ≥ 5 % sooner; Kramers
    differs from both by its O(T/ΔL) leading-order error (~10 %)."""
    temperature = 0.05
    mfpt = _continuous_mfpt(temperature)
    ratios = []
    for lr in (0.2, 0.05, 0.01):
        sigma2 = 2 * temperature * S / lr
        res = escape_exact.double_well(_well(math.sqrt(sigma2)), lr, sigma2 / S)
        ratios.append(lr * res.steps / mfpt)
    assert abs(ratios[-1] - 1) < 0.01, ratios
    assert ratios[0] < 0.95 and ratios[0] < ratios[1] < ratios[2], ratios
    kramers = 2 * math.pi / math.sqrt(K_A * K_B) * math.exp(BARRIER / temperature)
    assert 0.05 < 1 - kramers / mfpt < 0.2, (kramers, mfpt)


@pytest.mark.parametrize("noise", ["gaussian", "student_t"])
def test_double_well_grid_error_is_below_the_reported_one(noise):
    sigma = math.sqrt(8 / 9)
    problem = _well(sigma)
    res = escape_exact.double_well(problem, 0.45, sigma**2 / S, noise)
    assert res.error < 0.01
    (cells,) = res.nodes
    lo = problem.escape_threshold - cells * res.spacing[0]
    fine = escape_exact.solve_1d(problem.grad, 0.45, sigma / math.sqrt(S), noise, lo,
                                 problem.escape_threshold, 0.0, 4 * cells)
    wider = escape_exact.double_well(problem, 0.45, sigma**2 / S, noise, lo=2 * lo)
    assert abs(fine - res.steps) / fine < max(res.error, 1e-3), (fine, res)
    assert abs(wider.steps - res.steps) / res.steps < 0.01, (wider, res)


# ---- the thesis landscape (2-D, state-dependent kernel) ------------------------------------------

def _thesis():
    return make_problem({"landscape": "thesis", "start": "spurious", "seed": 1})


def _per_sample_gradients(problem, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """∇_w (f(a, b; x_μ) − y_μ)², f = a² + x(1 + b/(1 + e^{−ax})), written out here: its a and b
    components, (L, P) each."""
    a, b = w[:, :1], w[:, 1:]
    x, y = problem.x[None, :], problem.y[None, :]
    sig = 1.0 / (1.0 + np.exp(-a * x))
    r = 2.0 * (a * a + x * (1.0 + b * sig) - y)
    return r * (2 * a + b * x * x * sig * (1 - sig)), r * x * sig


@pytest.mark.parametrize("noise,lr", [("gaussian_matched", 3.5e-3), ("gaussian", 3.5e-3)])
def test_thesis_matches_monte_carlo_of_the_chain(noise, lr):
    """S = 1 at λh = 1.0: N(0, C(w)) noise with the per-sample covariance at w (or
    isotropic noise of the minimum's trace), escape over the saddle's linearised separatrix."""
    problem = _thesis()
    rng = np.random.default_rng(11)
    p = problem.n_samples
    iso = math.sqrt(problem.gaussian_noise_var(1))

    def step(w):
        g = _per_sample_gradients(problem, w)
        mean = np.stack([c.mean(axis=1) for c in g], axis=1)
        if noise == "gaussian":
            xi = iso * rng.standard_normal(w.shape)
        else:  # Σ_μ z_μ (g_μ − ḡ)/√P = (Σ_μ z_μ g_μ − ḡ Σ_μ z_μ)/√P has covariance C(w) (S = 1: f = 1)
            z = rng.standard_normal((len(w), p))
            xi = (np.stack([np.einsum("lp,lp->l", z, c) for c in g], axis=1)
                  - z.sum(axis=1)[:, None] * mean) / math.sqrt(p)
        return w - lr * (mean + xi)

    normal, saddle = problem.normal, problem.saddle_point
    times = _first_passage(step, np.tile(problem.w_min, (2500, 1)), lambda w: (w - saddle) @ normal > 0, 20_000)
    chain = escape_exact.thesis_chain(problem, lr, 1, "gaussian" if noise == "gaussian" else "matched")
    res = escape_exact.chain_escape(chain, escape_exact.box_2d(chain, problem.hessian(problem.w_min)))
    ok, msg = _agrees(times, res.steps)
    assert ok, msg


#: the thesis landscape's point (seed 1, start spurious) at λ = 2.5e-3, S = 1, SGD
BASE_2_5E3 = {"lr": 2.5e-3, "batch_size": 1, "momentum": 0.0, "method": "sgd", "dt_over_lr": 1.0}


@pytest.fixture(scope="module")
def matched_2_5e3():
    """exact_escape of BASE_2_5E3 with minibatch noise: the matched chain at λ = 2.5e-3, S = 1
    (f = 1 with or without replacement), solved once for the tests that read it."""
    return _thesis().exact_escape({**BASE_2_5E3, "noise": "minibatch"})


def test_thesis_grid_error_is_below_one_percent(matched_2_5e3):
    """A finer grid on a wider box agrees with the returned τ within 1 %."""
    problem = _thesis()
    chain = escape_exact.thesis_chain(problem, 2.5e-3, 1, "matched")
    _, res, note = matched_2_5e3
    assert res is not None, note
    assert res.error < 0.01
    wide = escape_exact.box_2d(chain, problem.hessian(problem.w_min), width=11.0)
    n_u = round(-wide[0] / (0.8 * res.spacing[0]))
    n_v = round((wide[2] - wide[1]) / (0.8 * res.spacing[1]))
    fine = escape_exact.solve_2d(chain, wide, n_u, n_v)
    assert abs(fine - res.steps) / fine < 0.01, (fine, res)


def test_thesis_kernel_far_outside_the_box_keeps_the_escape_time():
    """Data seed 5, λ = 3.2e-3, S = 2, isotropic noise: from some nodes at the box's edge one
    update lands so far outside it that every node's density is below the smallest float; the
    kernel is normalised in log space, so the escape time exists (τ ≈ 7,160 steps) and does not
    move when the grid is refined (it was absent, "linear system is singular")."""
    problem = make_problem({"landscape": "thesis", "start": "spurious", "seed": 5})
    base = {"lr": 3.2e-3, "batch_size": 2, "momentum": 0.0, "method": "sgd", "noise": "gaussian"}
    column, res, note = problem.exact_escape(base)
    assert column == "exact" and res is not None, note
    assert 7150 < res.steps < 7180 and res.error < 0.01, res
    chain = escape_exact.thesis_chain(problem, 3.2e-3, 2, "gaussian")
    box = escape_exact.box_2d(chain, problem.hessian(problem.w_min))
    n_u, n_v = (round(n * math.sqrt(2.0)) for n in res.nodes)
    fine = escape_exact.solve_2d(chain, box, n_u, n_v)
    assert 7150 < fine < 7180 and abs(fine - res.steps) / fine < 0.01, (fine, res)


def test_a_kernel_far_narrower_than_the_cells_is_refused_before_any_solve(capfd):
    """At λ = 1e-4 (matched noise, S = 1) the step kernel near the spurious minimum is far narrower
    than the grid's cells: those nodes keep all their probability, and I − K has zero rows. The
    solver says so and hands no LU the singular system (SuperLU and OpenBLAS printed "On entry to
    DGEMV parameter number 2 had an illegal value" on it); a step unstable at the minimum is named
    as such, not as a float conversion."""
    problem = _thesis()
    chain = escape_exact.thesis_chain(problem, 1e-4, 1, "matched")
    with pytest.raises(escape_exact.ResolutionError, match="cannot leave"):
        escape_exact.chain_escape(chain, escape_exact.box_2d(chain, problem.hessian(problem.w_min)))
    out, err = capfd.readouterr()
    assert "illegal value" not in out + err, out + err
    base = {"lr": 1e-2, "batch_size": 1, "momentum": 0.0, "method": "sgd", "dt_over_lr": 1.0, "noise": "minibatch"}
    column, res, note = problem.exact_escape(base)
    assert column == "matched" and res is None, note
    assert "unstable at the start's minimum" in note and re.search(r"is 2\.9\d*, at least 2", note), note


def test_an_escape_time_that_rounding_could_spoil_is_refused():
    """The solve's rounding error bound, ε‖I − K‖∞(max τ)²/τ_start (I − K is an M-matrix, so
    ‖(I − K)⁻¹‖∞ = max τ), is checked against 10⁻³, and every τ must be at least 1. On the thesis
    landscape (seed 1, start real, S = 8, Gaussian noise, λ = 0.002305; barrier/T ≈ 2.7·10⁴, so the
    true τ is beyond any float) the chain's system is singular to working precision and gave
    τ = 7.2·10¹³; it is refused (with the kernel rows that keep their dropped mass, as nodes that
    cannot leave). On the double well the bound passes at T = 0.012 (τ ≈ 5.4·10¹⁰,
    within 3 % of Kramers) and refuses at T = 0.009; at T = 0.0007 the solve gave τ = −1.3·10¹⁷
    (or a huge positive τ, with other BLAS threads), refused either way."""
    problem = make_problem({"landscape": "thesis", "start": "real", "seed": 1})
    params = {"lr": 0.002305, "batch_size": 8, "momentum": 0.0, "method": "sgd", "dt_over_lr": 1.0,
              "noise": "gaussian"}
    column, res, note = problem.exact_escape(params)
    assert column == "exact" and res is None, res
    assert "singular" in note, note
    lr = 0.09
    for temp, given in ((0.012, True), (0.009, False)):
        noise_var = 2 * temp / lr  # the double well's T = λ·noise_var/2
        well = _well(math.sqrt(noise_var * S))
        if given:
            tau = escape_exact.double_well(well, lr, noise_var).steps
            assert 1e10 < tau < 1e12
            assert abs(tau / kramers_steps(BARRIER, K_A, K_B, lr, noise_var) - 1) < 0.03
        else:
            with pytest.raises(escape_exact.ResolutionError, match=r"could change the start's by a relative "
                                                                    r"0\.0\d+, above 0\.001"):
                escape_exact.double_well(well, lr, noise_var)
    column, res, note = _well(0.335).exact_escape({**params, "lr": 0.05, "batch_size": 4})
    assert res is None and "no exact escape time" in note, (res, note)
    # the bound itself, with ‖I − K‖∞ = 2 and τ_start = top: 2ε·(max τ)²/top, 10⁻³ at max τ = top
    top = 1e-3 / (2 * np.finfo(float).eps)
    escape_exact._check_precision(2.0, np.array([top / 2, top * 0.999]), top, "test")
    with pytest.raises(escape_exact.ResolutionError, match="too close to singular"):
        escape_exact._check_precision(2.0, np.array([top / 2, top * 1.01]), top, "test")
    with pytest.raises(escape_exact.ResolutionError, match="below one update"):
        escape_exact._check_precision(2.0, np.array([-1e17, 5.0]), 3.0, "test")


def test_a_chain_without_noise_has_no_escape_time():
    """With batch_size equal to the number of samples (600 on the thesis landscape) every update is
    the full gradient: the step noise is zero, and the chain never escapes. Its kernel rows were
    NaN and then empty, so K = 0 gave every node τ = 1, which was accepted."""
    problem = _thesis()
    assert problem.n_samples == 600
    for noise in ("gaussian", "minibatch", "gaussian_matched"):
        _, res, note = problem.exact_escape({"lr": 0.003, "batch_size": 600, "momentum": 0.0,
                                            "method": "sgd", "dt_over_lr": 1.0, "noise": noise})
        assert res is None and "step noise is zero" in note, (noise, res, note)


def test_the_mass_a_kernel_row_drops_stays_in_the_basin():
    """Each 2-D kernel row sums to the exact probability of not escaping (what the row without a
    cutoff sums to), also after its entries below the cutoff are dropped: that mass does not
    leak as a spurious escape, which capped τ near 1/(dropped mass). Thesis landscape (seed 1,
    start spurious, S = 8, Gaussian noise) at λ = 0.00378: the chain's τ ≈ 4.7·10¹⁰ is within 15
    % of Eyring–Kramers (5.4·10¹⁰, which holds at this small λ·h); with the leak the grid did
    not converge within 9,000 nodes."""
    problem = _thesis()
    params = {"lr": 0.00378, "batch_size": 8, "momentum": 0.0, "method": "sgd", "dt_over_lr": 1.0,
              "noise": "gaussian", "observe": {"escape": True}}
    chain = escape_exact.thesis_chain(problem, params["lr"], 8, "gaussian")
    box = escape_exact.box_2d(chain, problem.hessian(problem.w_min))
    u = np.linspace(box[0], 0, 30)[:-1]
    v = np.linspace(box[1], box[2], 40)
    uv = np.stack(np.meshgrid(u, v, indexing="ij"), -1).reshape(-1, 2)
    points = chain.from_uv(uv)
    kept = np.asarray(escape_exact._rows(chain, points, uv).sum(axis=1)).ravel()
    every = np.asarray(escape_exact._rows(chain, points, uv, cutoff=0.0).sum(axis=1)).ravel()
    np.testing.assert_allclose(kept, every, rtol=1e-14, atol=0)  # with the leak: 0.8–1.6e-12 lower
    from sgdsweep.models.predict import Prediction

    pred = Prediction()
    problem.escape_theory({**params, "model": "landscape"}, pred)
    assert pred.escape_time_exact is not None, pred.reasons
    assert abs(pred.escape_time_exact / pred.escape_time_arrhenius - 1) < 0.15, (
        pred.escape_time_exact, pred.escape_time_arrhenius)


def test_the_box_holds_the_way_out_of_the_basin():
    """The 2-D box from the quadratic approximation at the start can be too small for a
    state-dependent noise: on the thesis landscape (seed 1, start spurious) with the
    Gaussian-matched chain at S = 4, λ = 0.0023 it cut τ to 1.723·10¹⁰, 2.9 % above the value
    on a box 1.6 times longer per axis about the saddle (1.6745·10¹⁰, ``solve_2d`` on 113 × 108
    cells; 1.6773·10¹⁰ on 59 × 56), while the grid refinement said 0.24 %. The box is grown
    until growing it changes τ by less than a quarter of the tolerance."""
    problem = _thesis()
    chain = escape_exact.thesis_chain(problem, 0.0023, 4, "matched")
    res = escape_exact.chain_escape(chain, escape_exact.box_2d(chain, problem.hessian(problem.w_min)), rtol=0.03)
    assert abs(res.steps / 1.6745e10 - 1) < 0.015, res
    assert res.box_change is not None and res.box_change < 0.03 / 4
    assert "a box 1.3 times longer per axis by" in res.describe()


def test_exact_escape_labels_columns_and_refuses_momentum(matched_2_5e3):
    problem = _thesis()
    base = BASE_2_5E3
    column, res, note = matched_2_5e3
    assert column == "matched" and res is not None and note.startswith("approximation")
    column, res, note = problem.exact_escape({**base, "noise": "gaussian_matched", "momentum": 0.5})
    assert column == "exact" and res is None and "momentum" in note
    column, res, note = problem.exact_escape({**base, "noise": "epoch"})
    assert res is None and "epoch" in note


def test_escape_fit_tabulates_the_exact_theory_and_says_which_law_it_follows():
    """The double well at fixed T = 0.05: the exact τ is within 20 % of Kramers at small λk_a and
    not at λk_a = 0.9; the fit's table carries each λ's measured, exact and Kramers τ."""
    from sgdsweep.analysis.fit.escape import fit_escape, follows_sentence

    lrs = np.array([0.0225, 0.09, 0.45])
    exact, kramers = [], []
    for lr, s in zip(lrs, (1, 4, 20)):
        sigma2 = 2 * 0.05 * s / lr
        exact.append(escape_exact.double_well(_well(math.sqrt(sigma2)), lr, sigma2 / s).steps)
        kramers.append(kramers_steps(BARRIER, K_A, K_B, lr, sigma2 / s))
    tau = np.array(exact) * 1.02
    res = fit_escape(lrs, tau, tau / 16, theory_arrhenius=np.array(kramers), theory_exact=np.array(exact),
                     lr_h=K_A * lrs)
    assert [r["lr"] for r in res["table"]] == list(lrs) and res["exact_agreement"] < 1
    assert res["exact_follows"] == [{"laws": ["arrhenius"], "lr_h": [0.045, 0.18]},
                                    {"laws": [], "lr_h": [0.9, 0.9]}], res["exact_follows"]
    assert "λh 0.9: neither law" in follows_sentence(res["exact_follows"])
