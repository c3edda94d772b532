"""The discrete-time fluctuation–dissipation relation of SGD on a linear layer (docs/physics.md §3).

Han, Park, Lee & Han 2021: single linear layer W (n_out × n_in), loss E = 1/(2N) Σ‖y − Wx‖²,
uncentred input moments Σxx (n_in × n_in, units input²), learning rate ε = λ. With W̄ = W − W0
and the per-step noise b⁽ⁿ⁾ = (Σyx⁽ⁿ⁾ − Σyx) − W0(Σxx⁽ⁿ⁾ − Σxx) of minibatch n, the estimators are
Σ_WW = mean W̄ᵀW̄ (weight²) and D(m) = mean b⁽ⁿ⁺ᵐ⁾ᵀb⁽ⁿ⁾ (gradient², summed over outputs).

Exact for i.i.d. minibatches (stationarity of the linear recursion W̄' = W̄(1 − λΣxx⁽ⁿ⁾) + λb⁽ⁿ⁾)::

    Σxx Σ_WW + Σ_WW Σxx − λ E[Σxx⁽ⁿ⁾ Σ_WW Σxx⁽ⁿ⁾] = λ D(0)

The papers' relation drops the last term on the left (their continuous-time version writes
2D). Its residual ‖ΣxxΣ_WW + Σ_WWΣxx − λD(0)‖/‖λD(0)‖ is therefore not zero but, at the exact
Σ_WW, exactly ‖λE[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾]‖/‖λD(0)‖ = O(λ‖Σxx‖): :func:`predicted_residual`.
The antisymmetric part Q = (ΣxxΣ_WW − Σ_WWΣxx)/2 measures broken detailed balance.
"""

from __future__ import annotations

import numpy as np

FORMULA = {
    "relation": "Sxx S_WW + S_WW Sxx - lr E[Sxx_n S_WW Sxx_n] = lr D(0) (exact, i.i.d. minibatches; "
                "Han et al. 2021 drop the E[...] term; docs/physics.md §3)",
    "predicted_residual": "|lr E[Sxx_n S_WW Sxx_n]| / |lr D(0)| at the exact S_WW: the residual of the papers' "
                          "relation Sxx S_WW + S_WW Sxx = lr D(0) (Frobenius norms)",
}


def _square(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {a.shape}")
    return a


def fdr_residual(sxx: np.ndarray, sigma_ww: np.ndarray, d0: np.ndarray, lr: float) -> float:
    """Relative Frobenius residual ‖ΣxxΣ_WW + Σ_WWΣxx − λD(0)‖/‖λD(0)‖ of the papers' relation (1)."""
    sxx, sigma_ww, d0 = (_square(a, n) for a, n in ((sxx, "sxx"), (sigma_ww, "sigma_ww"), (d0, "d0")))
    a = sxx @ sigma_ww
    return float(np.linalg.norm(a + a.T - lr * d0) / np.linalg.norm(lr * d0))


def q_ratio(sxx: np.ndarray, sigma_ww: np.ndarray) -> float:
    """max|Q| / max|D_sym| with Q = (ΣxxΣ_WW − Σ_WWΣxx)/2 and D_sym = (ΣxxΣ_WW + Σ_WWΣxx)/2 (1)."""
    a = _square(sxx, "sxx") @ _square(sigma_ww, "sigma_ww")
    return float(np.abs(a - a.T).max() / np.abs(a + a.T).max())


def relation_lhs(sxx: np.ndarray, sigma_ww: np.ndarray, lr: float, batch_term: np.ndarray) -> np.ndarray:
    """Left side of the exact relation, ΣxxΣ_WW + Σ_WWΣxx − λE[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾] (gradient²);
    ``batch_term`` is E[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾] for the sampling scheme (see theory.linear)."""
    a = _square(sxx, "sxx") @ _square(sigma_ww, "sigma_ww")
    return a + a.T - lr * _square(batch_term, "batch_term")


def predicted_residual(batch_term: np.ndarray, d0: np.ndarray) -> float:
    """The papers' residual at the exact Σ_WW: ‖E[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾]‖/‖D(0)‖ (1)."""
    return float(np.linalg.norm(_square(batch_term, "batch_term")) / np.linalg.norm(_square(d0, "d0")))


def fourier_profile(a: np.ndarray, pixels: np.ndarray, n_pixels: int) -> np.ndarray:
    """Han et al.'s Fig. 2 (bottom): |Â(k_x, 0)|/|Â(0, 0)| of an input × input matrix seen as an
    image, for k_x = 2πj/n_pixels, j = 0 … n_pixels/2.

    Input i is image pixel ``pixels[i]`` (row-major, ``n_pixels`` in all): the matrix is embedded
    in the full n_pixels × n_pixels one (zero at pixels that were dropped), so that the image
    period a (the image width) shows as peaks at multiples of k0 = 2π/a, i.e. j = n_pixels/a.
    k_y = 0 sums over the second index. Dimensionless.
    """
    a = _square(a, "a")
    pixels = np.asarray(pixels, dtype=np.int64)
    if pixels.shape != (a.shape[0],):
        raise ValueError(f"pixels must list the image pixel of each of the {a.shape[0]} inputs, "
                         f"got shape {pixels.shape}")
    column = np.zeros(int(n_pixels))
    column[pixels] = a.sum(axis=1)
    spectrum = np.abs(np.fft.rfft(column))
    return spectrum / spectrum[0]
