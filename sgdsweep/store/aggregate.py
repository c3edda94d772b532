"""Aggregate a sweep's point stores into ``ensemble.zarr`` (an xarray dataset).

Layout: dimension ``point`` (coordinate = point hash) with one coordinate per axis of the
sweep (``lr``, ``batch_size``, ``momentum``, ``samples_per_param``, ``noise``, …) along it,
and dimension ``replica`` for per-replica values. Measured values sit next to their theory
(``<name>``, ``<name>_se``, ``<name>_theory``). Every variable and coordinate carries
``long_name``, ``units`` and ``description``. The dataset attributes hold the provenance.

Points are read one at a time (only scalars and per-replica vectors are kept in memory), their
arrays straight from their chunk files where the layout allows (:func:`read_point_arrays`).

Integrity: every chunk of the ensemble ends with its CRC-32C (Zarr's ``crc32c`` codec, after
``zstd``), which Zarr checks on every read, also when the ensemble is opened with plain xarray;
every chunk is written, even one that holds only the fill value (``write_empty_chunks``), so
:func:`check_ensemble` can tell a deleted chunk file from an empty one. :func:`load_ensemble` and
:func:`open_ensemble` run that check and name the array (and chunk) that fails it.
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import shutil
import time
import uuid
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from sgdsweep.errors import StoreError
from sgdsweep.store import points as point_store
from sgdsweep.store.provenance import provenance

#: (long_name, units, description) of every variable the ensemble may hold. Units: weights
#: and losses are in the model's own units (label units for regression); times in SGD steps.
VARIABLES: dict[str, tuple[str, str, str]] = {
    "weight_var": ("weight variance", "weight²",
                   ("mean per-coordinate stationary variance Tr E[(w-w*)(w-w*)ᵀ]/d after burn-in (around each "
                   "replica's own time mean when minima form a manifold), averaged over time and non-diverged replicas")),
    "weight_var_se": ("standard error of weight_var", "weight²",
                      "standard error from the spread of independent replicas' time averages"),
    "weight_var_theory": ("predicted weight variance", "weight²", "Tr(Σ)/d of the theory named in 'formula'"),
    "loss": ("training loss", "loss", "time- and replica-averaged training loss after burn-in"),
    "loss_se": ("standard error of loss", "loss", "standard error from the spread of replicas"),
    "loss_theory": ("predicted training loss", "loss", "stationary E[L] of the theory named in 'formula'"),
    "test_loss": ("test loss", "loss", "time- and replica-averaged expected loss on fresh data (or held-out data)"),
    "test_loss_se": ("standard error of test_loss", "loss", "standard error from the spread of replicas"),
    "test_loss_theory": ("predicted test loss", "loss", "stationary E[test loss] of the theory named in 'formula'"),
    "loss_autocorr_time": ("integrated autocorrelation time of the loss", "steps",
                           ("τ_int = 1 + 2Σρ(m) with Sokal's window, per replica, averaged; the effective number of "
                           "samples of a replica is measured_steps/τ_int")),
    "loss_autocorr_time_se": ("standard error of loss_autocorr_time", "steps", "spread of replicas"),
    "loss_autocorr_truncated": ("replicas with truncated autocorrelation window", "1",
                                "replicas whose τ_int is only a lower bound (stored lags too short)"),
    "fdr_residual": ("fluctuation–dissipation residual", "1",
                     "‖ΣxxΣ_WW + Σ_WWΣxx − λD(0)‖/‖λD(0)‖ (Frobenius), estimators of Han et al. (physics.md §3)"),
    "fdr_residual_se": ("standard error of fdr_residual", "1",
                        "delete-a-group jackknife over the replicas (32 groups at most)"),
    "fdr_residual_theory": ("predicted fluctuation–dissipation residual", "1",
                            ("the residual the papers' relation must leave at the exact stationary Σ_WW: "
                            "‖λE[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾]‖/‖λD(0)‖")),
    "q_ratio": ("antisymmetric ratio", "1", "max|Q|/max|D_sym|, Q = (ΣxxΣ_WW − Σ_WWΣxx)/2, D_sym its symmetric partner"),
    "fdr_fourier_mismatch": ("Fourier mismatch of the FDR", "1",
                             ("max over k_x of the difference between the normalised Fourier profiles "
                             "|Â(k_x,0)|/|Â(0,0)| of ΣxxΣ_WW + Σ_WWΣxx and of D(0), the inputs seen as image "
                             "pixels (Han et al. 2021 Fig. 2)")),
    "noise_whiteness": ("gradient-noise whiteness", "1", "max over lags m ≠ 0 of ‖D(m)‖/‖D(0)‖"),
    "joint_eigenvalue": ("joint fluctuation eigenvalue", "weight²",
                         ("mean eigenvalue of the joint (W1, W2) covariance projected on the range of Γ (the "
                         "N_o·N_i stiff directions of the loss Hessian at the replica's mean weights; two_layer)")),
    "joint_eigenvalue_se": ("standard error of joint_eigenvalue", "weight²", "spread of replicas"),
    "joint_eigenvalue_theory": ("predicted joint eigenvalue", "weight²", "λ⟨r²⟩/(2S) (physics.md §4)"),
    "joint_anisotropy": ("joint anisotropy", "1",
                         "per replica std/mean of the covariance eigenvalues on the range of Γ, averaged (0 = isotropic)"),
    "escape_time": ("mean escape time", "steps",
                    "exponential maximum-likelihood estimate with censoring: Σ times / number escaped"),
    "escape_time_se": ("standard error of escape_time", "steps", "escape_time/√(number escaped)"),
    "escaped_fraction": ("escaped fraction", "1", "fraction of non-diverged replicas that escaped within steps"),
    "escape_censored": ("censored replicas", "1", "replicas that did not escape within steps (kept as censored)"),
    "escape_time_theory_arrhenius": ("Kramers escape time", "steps", "Arrhenius/Kramers law (physics.md §6)"),
    "escape_time_theory_powerlaw": ("power-law escape time", "steps", "Mori's state-dependent law (physics.md §6)"),
    "escape_time_theory_exact": ("exact escape time of the discrete chain", "steps",
                                 ("mean first-passage time of the SGD chain itself at any λ, solved on a grid "
                                  "(theory/escape_exact.py; 'formula' names each point's grid)")),
    "escape_time_theory_exact_matched": ("Gaussian-matched escape time (approximation)", "steps",
                                         ("the exact discrete-chain escape time of N(0, C(w)) noise standing in for "
                                          "sampled minibatch noise of the same covariance")),
    "lr_curvature": ("λh", "1", "learning rate times the largest Hessian eigenvalue at the starting minimum"),
    "diverged": ("diverged", "1", ("True if any replica of the point diverged (|w−w*|² beyond the bound "
                 "or not finite); such replicas are excluded from every average")),
    "diverged_replicas": ("diverged replicas", "1", "number of replicas that diverged"),
    "burn_in": ("burn-in", "steps", "updates discarded before measuring"),
    "measured_steps": ("measured steps", "steps", "updates averaged per replica after burn-in"),
    "simulation_seconds": ("simulation time", "s", "wall-clock seconds spent simulating the point"),
    # per replica
    "weight_var_replica": ("weight variance per replica", "weight²",
                           "per-replica time average of |w−w*|²/d; NaN for diverged or absent replicas"),
    "loss_replica": ("training loss per replica", "loss", "per-replica time average; NaN for diverged replicas"),
    "test_loss_replica": ("test loss per replica", "loss", "per-replica time average; NaN for diverged replicas"),
    "loss_autocorr_time_replica": ("loss autocorrelation time per replica", "steps", "τ_int per replica"),
    "diverged_step": ("divergence step", "steps", "step at which the replica diverged; -1 if it did not"),
    "escape_step": ("escape step", "steps", "step at which the replica escaped; -1 if censored (did not escape)"),
    "escape_time_replica": ("escape time per replica", "steps",
                            ("SGD steps until the replica escaped, or the cap (steps) when censored (escape_step = -1); "
                            "NaN for diverged replicas")),
    # per mode
    "weight_cov_eigenvalues": ("weight covariance eigenvalues", "weight²",
                               ("eigenvalues of the stationary weight covariance, descending (per replica and "
                               "averaged when minima form a manifold)")),
    "weight_cov_eigenvalues_theory": ("predicted covariance eigenvalues", "weight²", "eigenvalues of the theory's Σ"),
    "weight_cov_eigenvalues_theory_continuous": (
        "continuous-time covariance eigenvalues", "weight²",
        "eigenvalues of the solution of HM + MH = λC (leading order in λ, additive noise; the papers' theory)"),
    "weight_cov_eigenvalues_theory_detailed_balance": (
        "detailed-balance covariance eigenvalues", "weight²",
        "eigenvalues of (λ/2)H⁻¹C (Gross 2024 Eq. 2.33), exact only when H and C commute"),
    "q_eigenvalues": ("|eig Q| measured", "gradient²",
                      ("singular values of Q = (HM − MH)(1−μ)/λ from the measured second moment M (the antisymmetric "
                      "part of HM = (λ/2)(C + Q), Gross 2024 Eq. 2.30), descending, in pairs")),
    "q_eigenvalues_theory": ("|eig Q| of the exact theory", "gradient²",
                             "the same estimator applied to the exact stationary second moment"),
    "q_eigenvalues_theory_continuous": ("|eig Q| of the continuous theory", "gradient²",
                                        "Q_ij = (ω_i − ω_j)/(ω_i + ω_j)(VᵀCV)_ij (Gross 2024 Eq. 2.31)"),
    "weight_var_theory_continuous": ("continuous-time weight variance", "weight²",
                                     ("Tr M / d with HM + MH = λC (leading order in λ; misses the discrete "
                                     "2/(2 − λω) and the multiplicative noise)")),
    "mode_curvature": ("loss curvature along covariance modes", "loss/weight²",
                       "vᵢᵀ H vᵢ for the covariance eigenvectors vᵢ, H the loss Hessian at the replica's mean weights"),
    "mode_curvature_theory": ("loss curvature along the theory's covariance modes", "loss/weight²",
                              "vᵢᵀ H vᵢ for the eigenvectors vᵢ of the exact theory covariance, H the loss Hessian"),
    "range_cov_eigenvalues": ("covariance eigenvalues on the range of Γ", "weight²",
                              "eigenvalues of the joint covariance projected on the Hessian's range, descending"),
    "fdr_fourier_lhs": ("Fourier profile of ΣxxΣ_WW + Σ_WWΣxx", "1",
                        "|Â(k_x,0)|/|Â(0,0)| at k_x = 2πj/(number of image pixels), the inputs seen as pixels"),
    "fdr_fourier_noise": ("Fourier profile of D(0)", "1",
                          "|D̂(k_x,0)|/|D̂(0,0)| at k_x = 2πj/(number of image pixels), the inputs seen as pixels"),
    "noise_cov_ratio": ("‖D(m)‖/‖D(0)‖", "1", "Frobenius norm of the lag-m gradient-noise covariance over lag 0"),
}
#: Per-replica arrays copied from the point stores (padded with NaN or −1).
REPLICA_ARRAYS = ("weight_var_replica", "loss_replica", "test_loss_replica", "loss_autocorr_time_replica",
                  "diverged_step", "escape_step", "escape_time_replica")
#: Per-point vectors copied when present (dimension name, padded with NaN).
VECTOR_ARRAYS = {"weight_cov_eigenvalues": "mode", "weight_cov_eigenvalues_theory": "mode",
                 "weight_cov_eigenvalues_theory_continuous": "mode",
                 "weight_cov_eigenvalues_theory_detailed_balance": "mode",
                 "q_eigenvalues": "q_mode", "q_eigenvalues_theory": "q_mode",
                 "q_eigenvalues_theory_continuous": "q_mode",
                 "mode_curvature": "mode", "mode_curvature_theory": "mode", "noise_cov_ratio": "lag", "range_cov_eigenvalues": "range_mode",
                 "fdr_fourier_lhs": "fourier_k", "fdr_fourier_noise": "fourier_k"}
COORDS: dict[str, tuple[str, str, str]] = {
    "point": ("point hash", "1", "content hash of the point's fully resolved parameters"),
    "replica": ("replica index", "1", "index of the independent replica"),
    "mode": ("mode index", "1", "covariance eigenmode, largest eigenvalue first"),
    "lag": ("lag m", "steps", "lag of the gradient-noise covariance D(m)"),
    "q_mode": ("Q mode index", "1", "singular value of the antisymmetric matrix Q, largest first (they come in pairs)"),
    "shard": ("shard id", "1", "the shard (group of points sharing data) that simulated the point"),
    "lr": ("learning rate λ", "1", "SGD step size"),
    "batch_size": ("batch size S", "samples", "samples per gradient step"),
    "momentum": ("momentum μ", "1", "heavy-ball momentum"),
    "samples_per_param": ("samples per parameter P/N", "1", "data-set size over input dimension"),
    "hidden_width": ("hidden width N_h", "units", "hidden width of a two-layer network"),
    "noise": ("noise type", "1", "how the gradient noise is generated (physics.md §7)"),
    "n_inputs": ("input dimension N", "1", "number of inputs"),
    "label_noise": ("label noise σ_ε", "label", "standard deviation of the label noise"),
    "steps": ("steps", "steps", "updates per replica"),
    "replicas": ("replicas", "1", "replicas per point"),
}
#: theory column → the key of its formula (and of the reason when it is missing) in the point summaries
THEORY_SOURCES = {"weight_var_theory": "weight_cov", "weight_cov_eigenvalues_theory": "weight_cov",
                  "mode_curvature_theory": "weight_cov",
                  "loss_theory": "loss", "escape_time_theory_arrhenius": "escape_time_arrhenius",
                  "escape_time_theory_powerlaw": "escape_time_powerlaw",
                  "escape_time_theory_exact": "escape_time_exact",
                  "escape_time_theory_exact_matched": "escape_time_exact_matched",
                  "joint_eigenvalue_theory": "joint_eigenvalue",
                  "weight_var_theory_continuous": "weight_cov_continuous",
                  "weight_cov_eigenvalues_theory_continuous": "weight_cov_continuous",
                  "weight_cov_eigenvalues_theory_detailed_balance": "weight_cov_detailed_balance",
                  "q_eigenvalues_theory": "weight_cov", "q_eigenvalues_theory_continuous": "q_continuous",
                  "layer_cov_eigenvalues_W2_theory": "w2_covariance",
                  "test_loss_theory": "test_loss", "fdr_residual_theory": "fdr_residual"}
INT_SCALARS = ("diverged_replicas", "burn_in", "measured_steps", "escape_censored", "loss_autocorr_truncated")


#: Per-layer vectors (one value per eigenmode of a layer's covariance): prefix → (long name, units, description).
LAYER_VECTORS = {
    "layer_cov_eigenvalues_": ("covariance eigenvalues of {layer}", "weight²",
                               ("eigenvalues of the stationary covariance of the weights of {layer} alone, descending, "
                               "per replica around its own mean, averaged over replicas; when the minima form a "
                               "manifold (two_layer) the covariance is first projected on the Hessian's range, so "
                               "drift along flat directions is not counted")),
    "layer_mode_curvature_": ("loss curvature along the covariance modes of {layer}", "loss/weight²",
                              ("vᵢᵀ H vᵢ for the eigenvectors vᵢ of {layer}'s covariance (descending eigenvalue), H the "
                              "Hessian block of {layer} at the replica's mean weights, averaged over replicas")),
}


def layer_vector(name: str) -> tuple[str, str, bool] | None:
    """(prefix, layer, is_theory) of a per-layer vector name such as ``layer_cov_eigenvalues_W2_theory``."""
    for prefix in LAYER_VECTORS:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            theory = rest.endswith("_theory")
            return prefix, rest[: -len("_theory")] if theory else rest, theory
    return None


def _attrs(table: dict[str, tuple[str, str, str]], name: str) -> dict[str, str]:
    lv = layer_vector(name)
    if lv is not None:
        prefix, layer, theory = lv
        long_name, units, description = (t.format(layer=layer) for t in LAYER_VECTORS[prefix])
        if theory:
            return {"long_name": "predicted " + long_name, "units": units,
                    "description": "theory of " + long_name + " for each replica's own weights, averaged over "
                                   "replicas (see 'formula')"}
        return {"long_name": long_name, "units": units, "description": description}
    if name.startswith("singular_values_"):
        layer = name[len("singular_values_"):]
        return {"long_name": f"singular values of {layer}", "units": "weight",
                "description": f"final singular values of the weight matrix {layer} per replica, descending"}
    long_name, units, description = table[name]
    return {"long_name": long_name, "units": units, "description": description}


def _pad(rows: list[np.ndarray], fill: float) -> np.ndarray:
    width = max((r.shape[-1] for r in rows), default=0)
    out = np.full((len(rows), width), fill, dtype=np.float64 if fill != -1 else np.int64)
    for i, r in enumerate(rows):
        out[i, : r.shape[-1]] = r
    return out


#: Zarr v3 ``data_type`` names read directly (fixed size, one NumPy type each).
_FIXED_DTYPES = {"bool": "?", "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8", "uint8": "u1",
                 "uint16": "u2", "uint32": "u4", "uint64": "u8", "float16": "f2", "float32": "f4",
                 "float64": "f8", "complex64": "c8", "complex128": "c16"}
_ENDIAN = {"little": "<", "big": ">", None: "|"}


def _single_chunk(meta: dict[str, Any]) -> tuple[np.dtype, tuple[int, ...], str] | None:
    """(dtype, shape, chunk key) of a Zarr v3 array stored as one uncompressed chunk.

    That is the layout :func:`sgdsweep.store.points.write_point` writes: a regular chunk grid whose
    only chunk is the whole array, the ``bytes`` codec alone, the default chunk-key encoding,
    no storage transformer and a fixed-size numeric type. Its chunk file is the C-order array
    in the codec's byte order (Zarr v3 core specification). None for any other layout.
    """
    try:
        shape = tuple(int(d) for d in meta["shape"])
        grid, codecs, keys = meta["chunk_grid"], meta["codecs"], meta["chunk_key_encoding"]
        if (meta.get("zarr_format") != 3 or meta.get("node_type") != "array" or meta.get("storage_transformers")
                or grid.get("name") != "regular"
                or tuple(grid.get("configuration", {}).get("chunk_shape", ())) != shape or 0 in shape
                or len(codecs) != 1 or codecs[0].get("name") != "bytes" or keys.get("name") != "default"):
            return None
        endian = codecs[0].get("configuration", {}).get("endian")
        dtype = np.dtype(_ENDIAN[endian] + _FIXED_DTYPES[meta["data_type"]])
        separator = keys.get("configuration", {}).get("separator", "/")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if separator not in ("/", ".") or (dtype.itemsize > 1 and endian is None):
        return None
    return dtype, shape, separator.join(["c"] + ["0"] * len(shape))


@functools.lru_cache(maxsize=1024)
def _layout(meta_text: bytes) -> tuple[np.dtype, tuple[int, ...], str] | None:
    """:func:`_single_chunk` of an array's ``zarr.json`` text (cached: point stores of one sweep
    repeat the same few metadata documents); None when it is not a JSON object."""
    try:
        meta = json.loads(meta_text)
    except ValueError:
        return None
    return _single_chunk(meta) if isinstance(meta, dict) else None


def _read_fast(files: point_store.PointFiles, name: str, meta_text: bytes) -> np.ndarray | None:
    """Array ``name`` of a point store decoded from its one uncompressed chunk, or None when the
    layout is another one (:func:`_single_chunk`), the chunk is absent (Zarr then reads the fill
    value) or its size is wrong (Zarr then reports the error)."""
    layout = _layout(meta_text)
    if layout is None:
        return None
    dtype, shape, key = layout
    try:
        raw = files[f"{name}/{key}"]
    except (KeyError, OSError, zipfile.BadZipFile):
        return None
    if len(raw) != dtype.itemsize * math.prod(shape):
        return None
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def read_point_arrays(path: str | Path, names: list[str], prefixes: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the point store at ``path`` (zip or directory) that it holds
    (absent ones are left out), in the order of ``names``, then every other array whose name
    starts with one of ``prefixes``, in name order.

    Zarr 3 spends milliseconds of Python per array opened, which makes reading thousands of
    point stores the bulk of an aggregation. Arrays in the layout point stores are written in
    (:func:`_single_chunk`) are therefore decoded straight from their chunk; any other
    layout, a missing chunk or a damaged file goes through Zarr (:func:`sgdsweep.store.points.read_array`),
    which gives the same values or raises the same :class:`~sgdsweep.errors.StoreError`.
    """
    out: dict[str, np.ndarray] = {}
    try:
        files = point_store.PointFiles(path)
    except FileNotFoundError:
        return out
    except (OSError, zipfile.BadZipFile) as exc:
        raise StoreError(f"point store {path} is unreadable ({exc}); delete it and rerun the workflow") from None
    with files:
        arrays = {key.split("/")[0] for key in files if key.endswith("/zarr.json")}
        for name in dict.fromkeys([*names, *sorted(a for a in arrays if a.startswith(prefixes))]):
            try:
                meta_text = files[f"{name}/zarr.json"]
            except KeyError:
                continue  # not an array of this store
            except (OSError, zipfile.BadZipFile):
                meta_text = b""  # unreadable: Zarr raises the error
            arr = _read_fast(files, name, meta_text)
            out[name] = arr if arr is not None else np.asarray(point_store.read_array(path, name))
    return out


def build_ensemble(sweep_spec: dict[str, Any]) -> xr.Dataset:
    """The ensemble dataset of the points listed in ``sweep_spec`` (``plan/sweep.json``).

    Points are read one at a time; only scalars, per-replica and per-mode vectors are kept.

    Raises:
        StoreError: a point store is missing or incomplete.
    """
    points_dir = sweep_spec["points_dir"]
    entries = sweep_spec["points"]
    n = len(entries)
    summaries: list[dict[str, Any]] = []
    coords: dict[str, list[Any]] = {c: [] for c in sweep_spec["coords"]}
    seconds: list[float] = []
    formulas: dict[str, set[str]] = {}
    reasons: dict[str, set[str]] = {}
    per_replica: dict[str, list[np.ndarray]] = {}
    vectors: dict[str, list[np.ndarray]] = {}
    sv_dims: dict[str, str] = {}
    lag_values = None
    for i, entry in enumerate(entries):
        path = point_store.point_path(points_dir, entry["hash"])
        attrs = point_store.read_attrs(path)
        summary = attrs["summary"]
        summaries.append(summary)
        for k, v in summary.get("theory_formulas", {}).items():
            formulas.setdefault(k, set()).add(v)
        for k, v in summary.get("theory_reasons", {}).items():
            reasons.setdefault(k, set()).add(v)
        for c, values in coords.items():
            values.append(attrs["params"].get(c))
        seconds.append(attrs.get("simulation_seconds", np.nan))
        arrays = read_point_arrays(path, [*REPLICA_ARRAYS, *VECTOR_ARRAYS, *([] if lag_values is not None else ["lag"])],
                                   prefixes=("singular_values_", *LAYER_VECTORS))
        if "lag" in arrays:
            lag_values = arrays.pop("lag")
        for name, arr in arrays.items():
            if name.startswith("singular_values_"):
                sv_dims[name] = "sv_" + name[len("singular_values_"):]
                per_replica.setdefault(name, [None] * n)[i] = arr
            elif name in VECTOR_ARRAYS or layer_vector(name):
                vectors.setdefault(name, [np.zeros(0)] * n)[i] = arr
            else:
                per_replica.setdefault(name, [np.zeros(0)] * n)[i] = arr

    data_vars: dict[str, Any] = {}
    scalar_names = [k for k in VARIABLES if any(k in s for s in summaries)]
    for k in scalar_names:
        values = [s.get(k) for s in summaries]
        if k == "diverged":
            arr = np.asarray([bool(v) for v in values])
        elif k in INT_SCALARS:
            arr = np.asarray([-1 if v is None else v for v in values], dtype=np.int64)
        else:
            arr = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        data_vars[k] = ("point", arr, _attrs(VARIABLES, k))
    data_vars["simulation_seconds"] = ("point", np.asarray(seconds, float), _attrs(VARIABLES, "simulation_seconds"))
    n_rep = 0
    for name, rows in per_replica.items():
        if name in sv_dims:
            width = max((r.shape[1] for r in rows if r is not None), default=0)
            reps = max((r.shape[0] for r in rows if r is not None), default=0)
            arr = np.full((n, reps, width), np.nan)
            for i, r in enumerate(rows):
                if r is not None:
                    arr[i, : r.shape[0], : r.shape[1]] = r
            data_vars[name] = (("point", "replica", sv_dims[name]), arr, _attrs(VARIABLES, name))
            continue
        fill = -1 if name in ("diverged_step", "escape_step") else np.nan
        arr = _pad(rows, fill)
        n_rep = max(n_rep, arr.shape[1])
        data_vars[name] = (("point", "replica"), arr, _attrs(VARIABLES, name))
    for name, rows in vectors.items():
        dim = VECTOR_ARRAYS.get(name) or "mode_" + layer_vector(name)[1]
        data_vars[name] = (("point", dim), _pad(rows, np.nan), _attrs(VARIABLES, name))
    for name, (dims, arr, attrs) in list(data_vars.items()):
        if "replica" in dims and arr.shape[dims.index("replica")] < n_rep:
            pad = [(0, 0)] * arr.ndim
            pad[dims.index("replica")] = (0, n_rep - arr.shape[dims.index("replica")])
            data_vars[name] = (dims, np.pad(arr, pad, constant_values=-1 if arr.dtype.kind == "i" else np.nan), attrs)
    for k, source in THEORY_SOURCES.items():
        if k in data_vars:
            attrs = data_vars[k][2]
            if source in formulas:
                attrs["formula"] = " | ".join(sorted(formulas[source]))
            if source in reasons:
                attrs["missing_because"] = " | ".join(sorted(reasons[source]))

    coord_vars: dict[str, Any] = {
        "point": ("point", np.array([e["hash"] for e in entries], dtype=object), _attrs(COORDS, "point")),
        "replica": ("replica", np.arange(n_rep), _attrs(COORDS, "replica")),
        "shard": ("point", np.array([e["shard"] for e in entries], dtype=object), _attrs(COORDS, "shard")),
    }
    for c, values in coords.items():
        arr = np.asarray(values)
        if arr.dtype.kind in "OU":
            arr = arr.astype(object)  # variable-length UTF-8 strings in Zarr 3
        coord_vars[c] = ("point", arr, _attrs(COORDS, c))
    ds = xr.Dataset(data_vars=data_vars, coords=coord_vars)
    for dim in ("mode", "q_mode"):
        if dim in ds.dims:
            ds = ds.assign_coords({dim: (dim, np.arange(ds.sizes[dim]), _attrs(COORDS, dim))})
    if "lag" in ds.dims and lag_values is not None and lag_values.size == ds.sizes["lag"]:
        ds = ds.assign_coords(lag=("lag", lag_values, _attrs(COORDS, "lag")))
    ds.attrs.update({
        "title": f"sgdsweep ensemble of sweep '{sweep_spec['sweep']}'",
        "sweep": sweep_spec["sweep"],
        "sweep_hash": sweep_spec["sweep_hash"],
        "config": json.dumps(sweep_spec["simulation_config"], sort_keys=True),
        "swept_axes": json.dumps([c for c in sweep_spec["coords"] if len(set(map(str, coords[c]))) > 1]),
    })
    prov = provenance()
    ds.attrs.update({k: json.dumps(v) if isinstance(v, dict) else v for k, v in prov.items()})
    return ds


#: Codecs after the ``bytes`` serialiser of every ensemble array: zstd (Zarr's default) and
#: the CRC-32C of the compressed chunk, which Zarr verifies whenever it reads the chunk.
ENSEMBLE_COMPRESSORS = (zarr.codecs.ZstdCodec(level=0), zarr.codecs.Crc32cCodec())
#: Name patterns of what a killed :func:`write_ensemble` leaves beside ``<name>``.
_TEMPORARY_TAGS = (".tmp-", ".old-")


def write_ensemble(ds: xr.Dataset, path: str | Path) -> None:
    """Write ``ds`` to ``path`` (Zarr format 3, consolidated) atomically, replacing any old one.

    The new ensemble is written whole into ``.<name>.tmp-*`` beside ``path`` and renamed into
    place; an existing ensemble is kept until then. Every chunk is written with its CRC-32C
    (:data:`ENSEMBLE_COMPRESSORS`), empty ones too. What killed writes left beside ``path``
    (``.<name>.tmp-*``, ``.<name>.old-*``) is removed: before writing, what is older than
    :data:`sgdsweep.store.points.STALE_TEMPORARY_SECONDS` (a younger one may be another write in
    progress), and, once the new ensemble is in place, whatever its age.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphan_temporaries(path, older_than=point_store.STALE_TEMPORARY_SECONDS)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    ds = ds.drop_encoding()
    encoding = {name: {"compressors": ENSEMBLE_COMPRESSORS} for name in ds.variables}
    try:
        with warnings.catch_warnings():  # consolidated metadata: not in the v3 spec, read by xarray
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            ds.to_zarr(tmp, mode="w", zarr_format=3, consolidated=True, encoding=encoding,
                       write_empty_chunks=True)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    remove_orphan_temporaries(path, older_than=0.0)


def remove_orphan_temporaries(path: str | Path, older_than: float) -> list[Path]:
    """Remove the temporaries of :func:`write_ensemble` beside ``path`` (``.<name>.tmp-*``,
    ``.<name>.old-*``) last modified ``older_than`` seconds ago or earlier; return them."""
    path = Path(path)
    cutoff = time.time() - older_than
    removed = []
    for tag in _TEMPORARY_TAGS:
        for leftover in path.parent.glob(f".{glob.escape(path.name)}{tag}*"):
            try:
                if leftover.lstat().st_mtime > cutoff:
                    continue
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
            except FileNotFoundError:  # removed meanwhile
                continue
            removed.append(leftover)
    return removed


def check_ensemble(path: str | Path) -> None:
    """Check that every array of the ensemble at ``path`` has all its chunks in the store.

    Zarr reads a missing chunk as the fill value (NaN), silently; :func:`write_ensemble` writes
    every chunk, so one missing is a lost file. Cost: one listing of each array's chunks (the
    chunks' CRC-32C is checked by Zarr when they are read). Arrays without the CRC-32C codec come
    from ensembles written before these checks, which skipped chunks holding only the fill value:
    they are not checked (a rerun of the sweep rewrites them with checksums).

    Raises:
        StoreError: naming the array and how many of its chunks are missing.
        zarr.errors.NodeNotFoundError: no Zarr group at ``path``.
    """
    try:
        group = zarr.open_group(str(path), mode="r")
        arrays = list(group.arrays())
    except zarr.errors.NodeNotFoundError:  # not an ensemble at all: the caller says what is there
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise StoreError(f"ensemble {path} is unreadable ({exc}); delete it and rerun the workflow "
                         "(the aggregate step rebuilds it from the point stores)") from None
    for name, arr in arrays:
        if not any(isinstance(c, zarr.codecs.Crc32cCodec) for c in arr.compressors):
            continue  # written before ensembles carried checksums: all-fill chunks were not written
        present = arr.nchunks_initialized
        if present < arr.nchunks:
            raise StoreError(f"ensemble {path}: array '{name}' has {arr.nchunks - present} of its "
                             f"{arr.nchunks} chunk file(s) missing under {Path(path) / name}; delete the "
                             "ensemble and rerun the workflow (the aggregate step rebuilds it from the "
                             "point stores)")


def _damaged_chunk(path: str | Path) -> str:
    """Where the ensemble at ``path`` fails to read: ``array 'x' chunk (i, ...)`` and Zarr's
    error, for the first chunk that does (called after a read failed, so its cost is moot)."""
    group = zarr.open_group(str(path), mode="r")
    for name, arr in group.arrays():
        for coords in np.ndindex(*arr.cdata_shape):
            try:
                arr.get_block_selection(coords)
            except Exception as exc:  # noqa: BLE001 - Zarr's codecs raise several types
                return f"array '{name}' chunk {coords} under {Path(path) / name} ({exc})"
    return "no single chunk fails on its own"


def load_ensemble(path: str | Path) -> xr.Dataset:
    """The whole ensemble read into memory as NumPy arrays (the fits and the report use all of
    it: opening it without Dask chunks skips building and computing a task graph).

    Raises:
        StoreError: a chunk is missing (:func:`check_ensemble`) or fails its CRC-32C, naming it.
    """
    check_ensemble(path)
    try:
        return xr.open_zarr(path, chunks=None).load()
    except ValueError as exc:  # Zarr: "Stored and computed checksum do not match", or a bad chunk
        raise StoreError(f"ensemble {path} is damaged: {_damaged_chunk(path)}; delete it and rerun "
                         "the workflow (the aggregate step rebuilds it from the point stores)") from exc


def open_ensemble(path: str | Path, grid: bool = False) -> xr.Dataset:
    """Open an ensemble lazily (its chunks listed first: :func:`check_ensemble`; each chunk's
    CRC-32C is checked by Zarr when it is read); with ``grid=True`` unstack ``point`` into the
    swept axes."""
    check_ensemble(path)
    ds = xr.open_zarr(path)
    if not grid:
        return ds
    axes = json.loads(ds.attrs.get("swept_axes", "[]"))
    if not axes:
        return ds
    others = [c for c in ds.coords if ds[c].dims == ("point",) and c not in axes and c != "point"]
    return ds.reset_coords(others, drop=True).set_index(point=axes).unstack("point")
