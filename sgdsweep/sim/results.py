"""From one point's lane accumulators to its stored arrays and scalar summary.

Estimators (docs/physics.md §8): every per-point number is a mean over the point's non-diverged
replicas of that replica's time average after burn-in; its standard error comes from the
spread of the replicas (independent), never from correlated time steps. Diverged replicas are
flagged and excluded, never averaged in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sgdsweep.models import base, escape
from sgdsweep.models.predict import theory_column
from sgdsweep.sim import observables as obs
from sgdsweep.theory import fdr

#: Groups of the delete-a-group jackknife (:func:`jackknife_se`): its cost is this many
#: evaluations of the statistic, whatever the number of replicas.
JACKKNIFE_GROUPS = 32


def finite_or_none(value: Any) -> float | None:
    """JSON-friendly float: None for NaN/inf."""
    return float(value) if value is not None and math.isfinite(value) else None


def mean_se(values: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of the finite entries (NaN when undefined)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan
    se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else math.nan
    return float(np.mean(v)), se


@dataclass(frozen=True)
class Moments:
    """One point's per-replica weight moments, without a per-replica copy of an N×N matrix.

    ``mean`` (R, d): each replica's time-mean δ; ``ok`` (R,): replicas that did not diverge and
    measured at least one step; ``trace`` (R,): tr of each ok replica's second moment (NaN for
    the others); ``ok_mean``: the second moment (d, d), or its diagonal (d,) when only that is
    accumulated, averaged over the ok replicas (NaN when there are none); :meth:`replica`: one
    replica's matrix (or diagonal).
    ``centred``: around each replica's own time mean (models without a unique minimum)."""

    lanes: Mapping[str, np.ndarray]
    centred: bool
    mean: np.ndarray
    ok: np.ndarray
    trace: np.ndarray
    ok_mean: np.ndarray

    @property
    def full(self) -> bool:
        """Whether the whole N×N matrix is accumulated (else its diagonal)."""
        return "sum_dd" in self.lanes

    def replica(self, r: int) -> np.ndarray:
        """Replica r's second moment: its (d, d) matrix, or its diagonal (d,)."""
        return _replica_moment(self.lanes, r, self.mean[r], self.centred)


def _replica_moment(lanes: Mapping[str, np.ndarray], r: int, mean: np.ndarray, centred: bool) -> np.ndarray:
    """Σδδᵀ/n (or Σδ²/n) of replica r, minus meanmeanᵀ (mean²) when ``centred``."""
    n = float(lanes["n"][r])
    if "sum_dd" in lanes:
        m = lanes["sum_dd"][r] / n
        return m - np.outer(mean, mean) if centred else m
    m = lanes["sum_d2"][r] / n
    return m - mean**2 if centred else m


def second_moments(lanes: Mapping[str, np.ndarray], centred: bool) -> Moments:
    """The :class:`Moments` of one point's lanes, one replica's matrix at a time: the memory
    beyond the accumulators is one (d, d) matrix, not one per replica."""
    n = lanes["n"].astype(float)
    ok = (lanes["diverged_step"] < 0) & (n > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = lanes["sum_d"] / n[:, None]
    trace = np.full(n.size, np.nan)
    total = None
    for r in np.flatnonzero(ok):
        m = _replica_moment(lanes, r, mean[r], centred)
        trace[r] = np.trace(m) if m.ndim == 2 else m.sum()
        if total is None:
            total = m
        else:
            total += m
    d = mean.shape[1]
    ok_mean = total / int(ok.sum()) if total is not None else np.full((d, d) if "sum_dd" in lanes else d, np.nan)
    return Moments(lanes, centred, mean, ok, trace, ok_mean)


def escape_summary(escape_step: np.ndarray, cap: int, step_unit: float) -> dict[str, Any]:
    """Mean escape time (in SGD steps) by the exponential maximum-likelihood estimator with
    censoring: τ = (Σ escape times + Σ censoring times) / (number escaped), SE = τ/√k.

    Replicas that did not escape within ``cap`` integrator steps are censored at the cap (kept,
    not dropped). ``step_unit`` converts integrator steps to SGD steps (dt/λ for the SDE).
    """
    escaped = escape_step >= 0
    k = int(escaped.sum())
    times = np.where(escaped, escape_step + 1, cap).astype(float) * step_unit
    total = float(times.sum())
    tau = total / k if k else math.inf
    return {"escape_time": finite_or_none(tau), "escape_time_se": finite_or_none(tau / math.sqrt(k)) if k else None,
            "escaped_fraction": k / max(1, escape_step.size), "escape_censored": int((~escaped).sum())}


def jackknife_se(statistic: Callable[..., float], per_replica: Sequence[np.ndarray],
                 max_groups: int = JACKKNIFE_GROUPS) -> float:
    """Delete-a-group jackknife standard error of ``statistic(*means)``, where ``means`` are the
    replica means of the arrays in ``per_replica`` (each with replicas on axis 0).

    For a statistic that is a nonlinear function of replica means (a norm of a matrix
    difference, a ratio), which no per-replica value has. Replicas go round-robin into
    ``min(R, max_groups)`` groups; each group is left out once, and the SE is
    √((G−1)/G · Σ_g (θ₋g − θ̄)²). NaN with fewer than 2 replicas. Units: those of the statistic.
    """
    r = per_replica[0].shape[0]
    g = min(r, max_groups)
    if g < 2:
        return math.nan
    totals = [a.sum(axis=0) for a in per_replica]
    theta = np.array([statistic(*[(t - a[k::g].sum(axis=0)) / (r - len(range(k, r, g)))
                                  for t, a in zip(totals, per_replica)]) for k in range(g)])
    return float(np.sqrt((g - 1) / g * np.sum((theta - theta.mean()) ** 2)))


def autocorr_times(lanes: Mapping[str, np.ndarray], ok: np.ndarray, stride: int) -> tuple[np.ndarray, int]:
    """Per replica integrated autocorrelation time of the loss in steps; and how many are
    truncated (lower bounds: the stored lags did not reach the window)."""
    if "loss_lag" not in lanes:
        return np.full(ok.size, np.nan), 0
    taus = np.full(ok.size, np.nan)
    measured = np.flatnonzero(ok)
    tau, truncated = obs.integrated_autocorr_times(lanes, measured)
    taus[measured] = tau * stride
    return taus, int(truncated.sum())


def fluctuation_dissipation(problem, lanes: Mapping[str, np.ndarray], ok: np.ndarray, lr: float,
                            lags: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Han et al.'s estimators (docs/physics.md §3) pooled over the point's replicas.

    Σ_WW = mean δᵀδ, D(m) = mean b_{t+m}ᵀ b_t; residual ‖ΣxxΣ_WW + Σ_WWΣxx − λD(0)‖/‖λD(0)‖
    (Frobenius); Q = (ΣxxΣ_WW − Σ_WWΣxx)/2 and max|Q|/max|D_sym| with D_sym = (ΣxxΣ_WW +
    Σ_WWΣxx)/2; whiteness max over m ≠ 0 of ‖D(m)‖/‖D(0)‖.
    """
    n = lanes["n"][ok].astype(float)
    if n.size == 0:
        return {}, {}
    sww_r = lanes["sum_gram"][ok] / n[:, None, None]
    sww = sww_r.mean(axis=0)
    pairs = np.array([np.maximum(n - m, 1) for m in lags]).T  # (R, lags)
    dm_r = lanes["noise_lag"][ok] / pairs[:, :, None, None]
    dm = dm_r.mean(axis=0)
    d0 = dm[0]
    d0_r = dm_r[:, 0]
    norms = [np.linalg.norm(dm[j]) / np.linalg.norm(d0) for j in range(1, len(lags))]
    residual_se = jackknife_se(lambda s, d: fdr.fdr_residual(problem.sxx, s, d, lr), (sww_r, d0_r))
    summary = {"fdr_residual": finite_or_none(fdr.fdr_residual(problem.sxx, sww, d0, lr)),
               "fdr_residual_se": finite_or_none(residual_se),
               "q_ratio": finite_or_none(fdr.q_ratio(problem.sxx, sww)),
               "noise_whiteness": finite_or_none(max(norms)) if norms else None}
    arrays = {"sigma_ww": (("input", "input_t"), sww), "noise_cov_lag": (("lag", "input", "input_t"), dm),
              "lag": (("lag",), np.asarray(lags, dtype=np.int64)),
              "noise_cov_ratio": (("lag",), np.array([1.0] + norms))}
    if getattr(problem, "pixels", None) is not None:  # image inputs: Han et al.'s Fourier comparison
        lhs = fdr.fourier_profile(problem.sxx @ sww + sww @ problem.sxx, problem.pixels, problem.n_pixels)
        noise = fdr.fourier_profile(d0, problem.pixels, problem.n_pixels)
        arrays["fdr_fourier_lhs"] = (("fourier_k",), lhs)
        arrays["fdr_fourier_noise"] = (("fourier_k",), noise)
        summary["fdr_fourier_mismatch"] = finite_or_none(float(np.max(np.abs(lhs - noise))))
    return summary, arrays


def _layer_arrays(problem, lanes, ok) -> dict[str, Any]:
    """Final singular values of every weight matrix, per replica (NaN for diverged ones)."""
    arrays: dict[str, Any] = {}
    w = lanes["w_final"]
    for layer in problem.layers:
        mats = layer.take(w)
        sv = np.full((w.shape[0], min(layer.rows, layer.cols)), np.nan)
        good = ok & np.all(np.isfinite(w), axis=1)
        if good.any():
            sv[good] = np.linalg.svd(mats[good], compute_uv=False)
        arrays[f"singular_values_{layer.name}"] = (("replica", f"sv_{layer.name}"), sv)
    return arrays


def mode_curvature(cov: np.ndarray, hessian: np.ndarray) -> np.ndarray:
    """Loss curvature vᵢᵀHvᵢ (loss/weight²) along the eigenvectors vᵢ of ``cov``, in the order of
    descending eigenvalue (Gross et al. 2024 Fig. 6: δL(θvᵢ) = θ²vᵢᵀHvᵢ/2)."""
    vals, vecs = np.linalg.eigh(cov)
    vecs = vecs[:, np.argsort(vals)[::-1]]
    return np.einsum("dk,de,ek->k", vecs, hessian, vecs)


def _hessian_fd(problem, w: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """Loss Hessian at w (d,) by central differences of the full gradient."""
    d = w.size
    plus = w[None, :] + h * np.eye(d)
    minus = w[None, :] - h * np.eye(d)
    hess = (problem.grad(plus) - problem.grad(minus)) / (2 * h)
    return 0.5 * (hess + hess.T)


def _spectra_per_replica(problem, params, lanes, moments: Moments) -> tuple[dict[str, Any], dict[str, Any]]:
    """Models without a unique minimum: covariance spectra per replica (around each replica's own
    time mean), averaged over replicas; per layer too; and the loss curvature vᵢᵀ H vᵢ along the
    covariance eigenvectors, H the Hessian at the replica's mean weights."""
    rep = np.flatnonzero(moments.ok)
    mean = moments.mean
    d = mean.shape[1]
    eig = np.full((rep.size, d), np.nan)
    curv = np.full((rep.size, d), np.nan)
    per_layer: dict[str, list[np.ndarray]] = {layer.name: [] for layer in problem.layers}
    layer_curv: dict[str, list[np.ndarray]] = {layer.name: [] for layer in problem.layers}
    layer_theory: dict[str, list[np.ndarray]] = {}  # the problem's per-layer theory, per replica
    k_range = problem.hessian_rank if hasattr(problem, "hessian_rank") else d
    on_range = np.full((rep.size, k_range), np.nan)
    for j, r in enumerate(rep):
        m2 = moments.replica(r)
        vals, vecs = np.linalg.eigh(m2)
        order = np.argsort(vals)[::-1]
        vals, vecs = vals[order], vecs[:, order]
        eig[j] = vals
        centre = lanes["reference"][r] + mean[r]
        hess = _hessian_fd(problem, centre)
        curv[j] = np.einsum("dk,de,ek->k", vecs, hess, vecs)
        hv, hu = np.linalg.eigh(hess)
        u = hu[:, np.argsort(hv)[::-1][:k_range]]  # range of the Hessian (of Γ)
        on_range[j] = np.sort(np.linalg.eigvalsh(u.T @ m2 @ u))[::-1]
        # per layer: the fluctuations on the Hessian's range (drift along the flat directions of a
        # minimum manifold, e.g. W1 → AW1, W2 → W2A⁻¹, grows with the window and is not a fluctuation)
        m_range = m2 if k_range == d else u @ (u.T @ m2 @ u) @ u.T
        for layer in problem.layers:
            sl = slice(layer.start, layer.start + layer.size)
            lv, lu = np.linalg.eigh(m_range[sl, sl])
            order = np.argsort(lv)[::-1]
            lv, lu = lv[order], lu[:, order]
            per_layer[layer.name].append(lv)
            layer_curv[layer.name].append(np.einsum("dk,de,ek->k", lu, hess[sl, sl], lu))
        for name, vals in problem.layer_cov_theory(centre, params).items():
            layer_theory.setdefault(name, []).append(vals)
    arrays: dict[str, Any] = {
        "weight_cov_eigenvalues": (("mode",), eig.mean(axis=0) if rep.size else np.full(d, np.nan)),
        "mode_curvature": (("mode",), curv.mean(axis=0) if rep.size else np.full(d, np.nan)),
        "range_cov_eigenvalues": (("range_mode",), on_range.mean(axis=0) if rep.size else np.full(k_range, np.nan)),
    }
    for layer in problem.layers:
        vals = np.mean(per_layer[layer.name], axis=0) if rep.size else np.full(layer.size, np.nan)
        arrays[f"layer_cov_eigenvalues_{layer.name}"] = ((f"mode_{layer.name}",), vals)
        curv_l = np.mean(layer_curv[layer.name], axis=0) if rep.size else np.full(layer.size, np.nan)
        arrays[f"layer_mode_curvature_{layer.name}"] = ((f"mode_{layer.name}",), curv_l)
    for name, vals in layer_theory.items():
        arrays[f"layer_cov_eigenvalues_{name}_theory"] = ((f"mode_{name}",), np.mean(vals, axis=0))
    summary: dict[str, Any] = {}
    if problem.isotropic_on_range and rep.size:
        top = on_range.mean(axis=1)
        summary["joint_eigenvalue"], summary["joint_eigenvalue_se"] = map(finite_or_none, mean_se(top))
        spread = on_range.std(axis=1) / on_range.mean(axis=1)
        summary["joint_anisotropy"] = finite_or_none(float(np.mean(spread)))
    return arrays, summary


def _q_magnitudes(h: np.ndarray, m: np.ndarray, lr_eff: float) -> np.ndarray:
    """|eig Q| (descending) of Q = (HM − MH)/λ_eff, the antisymmetric part of the stationary
    relation HM = (λ_eff/2)(C + Q) (Gross 2024 Eq. 2.30)."""
    return np.linalg.svd((h @ m - m @ h) / lr_eff, compute_uv=False)


def _approximation_columns(pred, params: Mapping[str, Any], arrays: dict[str, Any], summary: dict[str, Any],
                           cov: np.ndarray | None, d: int) -> None:
    """The papers' approximations next to the exact theory, and the measured Q they predict."""
    if pred.weight_cov_continuous is not None:
        summary["weight_var_theory_continuous"] = finite_or_none(np.trace(pred.weight_cov_continuous) / d)
        arrays["weight_cov_eigenvalues_theory_continuous"] = (
            ("mode",), np.sort(np.linalg.eigvalsh(pred.weight_cov_continuous))[::-1])
        arrays["weight_cov_eigenvalues_theory_detailed_balance"] = (
            ("mode",), pred.weight_cov_eigenvalues_detailed_balance)
        arrays["q_eigenvalues_theory_continuous"] = (("q_mode",), pred.q_eigenvalues_continuous)
    if pred.hessian is None or cov is None:
        return
    lr_eff = params["lr"] / (1 - params["momentum"])
    arrays["q_eigenvalues"] = (("q_mode",), _q_magnitudes(pred.hessian, cov, lr_eff))
    if pred.weight_cov is not None and np.all(np.isfinite(pred.weight_cov)):
        arrays["q_eigenvalues_theory"] = (("q_mode",), _q_magnitudes(pred.hessian, pred.weight_cov, lr_eff))


def point_result(problem, params: Mapping[str, Any], burn_in: int, lanes: Mapping[str, np.ndarray],
                 pred, stride: int, substeps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Arrays (name → (dims, values)) and JSON summary of one point from its lanes."""
    centred = problem.w_min is None
    moments = second_moments(lanes, centred)
    mean, ok = moments.mean, moments.ok
    n = lanes["n"].astype(float)
    full = moments.full
    d = problem.dim
    var_rep = np.where(ok, moments.trace / d, np.nan)
    arrays: dict[str, Any] = {"weight_var_replica": (("replica",), var_rep),
                              "diverged_step": (("replica",), lanes["diverged_step"].astype(np.int64))}
    summary: dict[str, Any] = {}
    wv, wv_se = mean_se(var_rep)
    summary.update(weight_var=finite_or_none(wv), weight_var_se=finite_or_none(wv_se))
    n_ok = int(ok.sum())
    arrays["weight_mean"] = (("param",), mean[ok].mean(axis=0) if n_ok else np.full(d, np.nan))
    if full:
        cov = moments.ok_mean
        arrays["weight_cov"] = (("param", "param_t"), cov)
        if centred:
            spec_arrays, spec_summary = _spectra_per_replica(problem, params, lanes, moments)
            arrays.update(spec_arrays)
            summary.update(spec_summary)
        elif n_ok:
            arrays["weight_cov_eigenvalues"] = (("mode",), np.sort(np.linalg.eigvalsh(cov))[::-1])
            if pred.hessian is not None and pred.hessian.shape == cov.shape:
                arrays["mode_curvature"] = (("mode",), mode_curvature(cov, pred.hessian))
    else:
        arrays["weight_var_diag"] = (("param",), moments.ok_mean)
        if "sketch" in lanes and n_ok:
            k_sketch = lanes["sketch"].shape[2]
            y = (lanes["sketch"][ok] / n[ok, None, None]).mean(axis=0)
            if centred:
                y = y - (mean[ok][:, :, None] * (mean[ok] @ obs.sketch_matrix(d, k_sketch))[:, None, :]).mean(axis=0)
            k = int(params["observe"]["n_eigenpairs"])
            vals, vecs = obs.nystrom_eigenpairs(y, obs.sketch_matrix(d, k_sketch), k)
            arrays["weight_cov_eigenvalues"] = (("mode",), vals)
            arrays["weight_cov_eigenvectors"] = (("param", "mode"), vecs)
    summary["weight_var_theory"] = None
    if pred.weight_cov is not None:
        arrays["weight_cov_theory"] = (("param", "param_t"), pred.weight_cov)
        finite = bool(np.all(np.isfinite(pred.weight_cov)))
        summary["weight_var_theory"] = finite_or_none(np.trace(pred.weight_cov) / d) if finite else None
        if finite:
            arrays["weight_cov_eigenvalues_theory"] = (("mode",), np.sort(np.linalg.eigvalsh(pred.weight_cov))[::-1])
            if pred.hessian is not None and pred.hessian.shape == pred.weight_cov.shape:
                arrays["mode_curvature_theory"] = (("mode",), mode_curvature(pred.weight_cov, pred.hessian))
    _approximation_columns(pred, params, arrays, summary, cov if full and n_ok else None, d)
    summary["loss_theory"] = finite_or_none(pred.loss)
    if pred.test_loss is not None:
        summary["test_loss_theory"] = finite_or_none(pred.test_loss)
    for name in ("loss", "test_loss"):
        key = f"sum_{name}"
        if key in lanes and (name != "test_loss" or problem.test_loss(problem_probe(problem)) is not None):
            with np.errstate(invalid="ignore", divide="ignore"):
                per = np.where(ok, lanes[key] / lanes["loss_count"], np.nan)
            arrays[f"{name}_replica"] = (("replica",), per)
            m, se = mean_se(per)
            summary[name], summary[f"{name}_se"] = finite_or_none(m), finite_or_none(se)
    taus, truncated = autocorr_times(lanes, ok, stride)
    if "loss_lag" in lanes:
        arrays["loss_autocorr_time_replica"] = (("replica",), taus / substeps)
        m, se = mean_se(taus / substeps)
        summary.update(loss_autocorr_time=finite_or_none(m), loss_autocorr_time_se=finite_or_none(se),
                       loss_autocorr_truncated=truncated)
    if "noise_lag" in lanes:
        from sgdsweep.sim.observables import ObserveSpec, noise_lag_list

        lags = noise_lag_list(ObserveSpec(noise_lags=tuple(params["observe"]["noise_lags"])))
        fdr_summary, fdr_arrays = fluctuation_dissipation(problem, lanes, ok, params["lr"], lags)
        summary.update(fdr_summary)
        arrays.update(fdr_arrays)
        summary["fdr_residual_theory"] = finite_or_none(pred.fdr_residual)
    if params["observe"]["escape"]:
        arrays["escape_step"] = (("replica",), lanes["escape_step"].astype(np.int64))
        cap = int(params["steps"]) * substeps
        alive = lanes["diverged_step"] < 0
        summary.update(escape_summary(lanes["escape_step"][alive], cap, 1.0 / substeps))
        times = np.where(lanes["escape_step"] >= 0, lanes["escape_step"] + 1, cap) / substeps
        arrays["escape_time_replica"] = (("replica",), np.where(alive, times, np.nan))
        for law in escape.LAWS:
            summary[theory_column("escape_time", law)] = finite_or_none(getattr(pred, f"escape_time_{law}"))
        summary["lr_curvature"] = float(params["lr"] * np.max(problem.curvatures()))
    if pred.joint_eigenvalue is not None:
        summary["joint_eigenvalue_theory"] = finite_or_none(pred.joint_eigenvalue)
    arrays.update(_layer_arrays(problem, lanes, ok))
    div = lanes["diverged_step"]
    summary.update(
        diverged=bool(np.any(div >= 0)), diverged_replicas=int(np.sum(div >= 0)),
        measured_steps=int(n[ok].max()) // substeps if n_ok else 0, burn_in=int(burn_in),
        burn_in_relaxations=burn_in_relaxations(problem, params, burn_in),
        n_samples=problem.n_samples, autocorr_stride=int(stride),
        theory_formulas=pred.formulas, theory_reasons=pred.reasons,
        problem=problem.describe())
    return arrays, summary


def burn_in_relaxations(problem, params: Mapping[str, Any], burn_in: int) -> float | None:
    """The point's burn-in (SGD steps) in slowest relaxation times of its noise-free update at the
    minimum (:func:`sgdsweep.models.base.burn_in_relaxations`: SGD's map, or the SDE's Euler step
    for ``method: sde``); None where that update is unstable."""
    dt = float(params["dt_over_lr"]) if params.get("method") == "sde" else math.nan
    value = float(base.burn_in_relaxations(problem.curvatures(), np.array([params["lr"]]),
                                           np.array([params.get("momentum", 0.0)]), np.array([burn_in]),
                                           np.array([dt]))[0])
    return value if math.isfinite(value) else None


def problem_probe(problem) -> np.ndarray:
    """One lane at the minimum (or zero), to ask a problem whether it defines an observable."""
    w = problem.w_min if problem.w_min is not None else np.zeros(problem.dim)
    return w[None, :]
