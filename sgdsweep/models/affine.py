"""A single linear layer trained on a finite data set: the problem behind ``linear``,
``digits`` and ``matrix``.

Weights ``W`` (n_out × n_in, flattened row-major into ``w``), samples ``(x_μ, y_μ)``, an optional
symmetric positive-definite output metric ``M`` (``ZᵀZ`` of the matrix model; identity
otherwise) and optional fixed per-sample gradient offsets ``a_μ`` (the matrix model's injected
noise). Per-sample gradient and loss::

    g_μ(W) = M (W x_μ − y_μ) x_μᵀ − a_μ
    L(W)   = 1/(2P) Σ_μ (W x_μ − y_μ)ᵀ M (W x_μ − y_μ) − ⟨ā, W⟩

so ∇L = M (W Σxx − Σyx) − ā with the uncentred moments Σxx = XᵀX/P, Σyx = YᵀX/P. The loss is
exactly quadratic: ``L(W) = L(W*) + ½ tr(δᵀ M δ Σxx)`` with δ = W − W* and the unique minimiser
``W* = (Σyx + M⁻¹ā) Σxx⁻¹`` (Σxx must be invertible: P ≥ n_in and no constant-zero input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sgdsweep.core.noise_types import ALL
from sgdsweep.models.base import Layer, Problem


class AffineProblem(Problem):
    """See the module docstring. ``test_quadratic`` is the optional test loss as a quadratic
    form ``(A, B, c)``: ``L_test(W) = c + ½ Σ_o W_o A W_oᵀ − ⟨B, W⟩`` with A (n_in × n_in) and B
    (n_out × n_in) — the expected loss on fresh data, or the loss on a held-out set."""

    linear_in_w = True
    kernel = "affine"

    def __init__(self, kind: str, x: np.ndarray, y: np.ndarray, *, metric: np.ndarray | None = None,
                 offsets: np.ndarray | None = None, noise_types: tuple[str, ...] = (),
                 label_noise: float = 0.0,
                 test_quadratic: tuple[np.ndarray, np.ndarray, float] | None = None) -> None:
        self.kind = kind
        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.y = np.ascontiguousarray(y.reshape(len(y), -1), dtype=np.float64)
        p, n_in = self.x.shape
        n_out = self.y.shape[1]
        self.n_samples, self.n_inputs, self.n_outputs = p, n_in, n_out
        self.dim = n_in * n_out
        self.layers = (Layer("W", 0, n_out, n_in),)
        self.metric = None if metric is None else np.asarray(metric, dtype=np.float64)
        self.offsets = None if offsets is None else np.asarray(offsets, dtype=np.float64)
        self.noise_types = noise_types
        self.label_noise = float(label_noise)
        self.test_quadratic = None if test_quadratic is None else (
            np.ascontiguousarray(test_quadratic[0], dtype=np.float64),
            np.ascontiguousarray(test_quadratic[1], dtype=np.float64).reshape(n_out, n_in),
            float(test_quadratic[2]))
        self.sxx = self.x.T @ self.x / p
        self.syx = self.y.T @ self.x / p
        self.a_mean = np.zeros((n_out, n_in)) if self.offsets is None else self.offsets.mean(axis=0)
        minv_a = self.a_mean if self.metric is None else np.linalg.solve(self.metric, self.a_mean)
        self.W_min = np.linalg.solve(self.sxx, (self.syx + minv_a).T).T
        self.w_min = self.W_min.ravel().copy()
        self.residual = self.y - self.x @ self.W_min.T  # (P, n_out)
        self.loss_min = float(self._loss_full(self.W_min[None])[0])
        self.input_eigenvalues = np.linalg.eigvalsh(self.sxx)
        metric_eig = np.ones(n_out) if self.metric is None else np.linalg.eigvalsh(self.metric)
        self._curv = np.sort(np.outer(metric_eig, self.input_eigenvalues).ravel())
        for arr in (self.x, self.y, self.sxx, self.syx, self.W_min, self.w_min, self.residual):
            arr.setflags(write=False)

    # -- helpers -------------------------------------------------------------------------------
    def _mat(self, w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], self.n_outputs, self.n_inputs)

    def _apply_metric(self, e: np.ndarray) -> np.ndarray:
        return e if self.metric is None else e @ self.metric  # metric symmetric

    def _loss_full(self, wm: np.ndarray) -> np.ndarray:
        e = np.einsum("pi,loi->lpo", self.x, wm) - self.y[None]
        val = 0.5 * np.einsum("lpo,lpo->l", self._apply_metric(e), e) / self.n_samples
        return val - np.einsum("oi,loi->l", self.a_mean, wm)

    # -- Problem interface --------------------------------------------------------------------
    def grad(self, w, idx=None, label_eps=None):
        wm = self._mat(w)
        if idx is None:
            g = np.einsum("loi,ij->loj", wm, self.sxx) - self.syx[None]
            if self.metric is not None:
                g = np.einsum("ok,lkj->loj", self.metric, g)
            return (g - self.a_mean).reshape(w.shape[0], -1)
        if self.metric is None:
            from sgdsweep.models._compiled import (
                batch_grad,  # numba: imported when simulating, not when planning
            )

            eps = np.zeros((0, 0, 0)) if label_eps is None else np.ascontiguousarray(label_eps)
            # contiguous arguments: one compiled version (the layout is part of numba's type)
            g = batch_grad(self.x, self.y, np.ascontiguousarray(wm), np.ascontiguousarray(idx), eps)
        else:
            xb = self.x[idx]  # (L, S, n_in)
            yb = self.y[idx]  # (L, S, n_out)
            if label_eps is not None:
                yb = yb + label_eps
            e = self._apply_metric(np.einsum("lsi,loi->lso", xb, wm) - yb)
            g = np.einsum("lso,lsi->loi", e, xb) / idx.shape[1]
        if self.offsets is not None:
            g -= self.offsets[idx].mean(axis=1)
        return g.reshape(w.shape[0], -1)

    def sample_grads(self, w):
        wm = self._mat(w)
        e = self._apply_metric(np.einsum("pi,loi->lpo", self.x, wm) - self.y[None])
        g = e[:, :, :, None] * self.x[None, :, None, :]
        if self.offsets is not None:
            g = g - self.offsets[None]
        return g.reshape(w.shape[0], self.n_samples, -1)

    def loss(self, w):
        d = self._mat(w) - self.W_min[None]
        md = d if self.metric is None else np.einsum("ok,lki->loi", self.metric, d)
        return self.loss_min + 0.5 * np.einsum("loj,loj->l", md @ self.sxx, d)

    def test_loss(self, w):
        if self.test_quadratic is None:
            return None
        a, b, c = self.test_quadratic
        wm = self._mat(w)
        return c + 0.5 * np.einsum("loj,loj->l", wm @ a, wm) - np.einsum("loi,oi->l", wm, b)

    def curvatures(self):
        return self._curv

    def describe(self) -> dict[str, Any]:
        return {"loss_min": self.loss_min, "n_samples": self.n_samples,
                "curvature_min": float(self._curv[0]), "curvature_max": float(self._curv[-1])}


#: every noise type an affine problem with a teacher supports
AFFINE_NOISE = ALL
