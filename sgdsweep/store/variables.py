"""The catalogue of the ensemble's variables: what each one is called, its units, its dimensions.

The one place that names every variable a point store or the ensemble may hold
(:data:`VARIABLES`, and :data:`POINT_ARRAYS` for the matrices only point stores hold), the
ensemble's coordinates (:data:`COORDS`), which point-store arrays aggregation copies and along
which dimension (:data:`REPLICA_ARRAYS`, :data:`VECTOR_ARRAYS`,
:data:`LAYER_VECTORS`), and which theory each ``*_theory`` column holds (:data:`THEORY_COLUMNS`,
:func:`theory_source`). It imports neither xarray nor Zarr: simulation workers use it to
describe the arrays they store (:func:`point_array_attrs`, which refuses a name no table holds).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sgdsweep.models.predict import theory_name

#: (long_name, units in the model, description) of every variable the ensemble may hold. Units:
#: weights and losses are in the model's own units (label units for regression); times in SGD
#: steps. The ensemble's ``units`` attribute is their CF form (:func:`cf_units_of`).
VARIABLES: dict[str, tuple[str, str | None, str]] = {
    "weight_var": ("weight variance", "weight²",
                   ("mean per-coordinate stationary variance Tr E[(w-w*)(w-w*)ᵀ]/d after burn-in (around each "
                    "replica's own time mean when minima form a manifold), averaged over time and non-diverged "
                    "replicas")),
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
                     "‖ΣxxΣ_WW + Σ_WWΣxx − λD(0)‖/‖λD(0)‖ (Frobenius), estimators of Han et al. (docs/physics.md §3)"),
    "fdr_residual_se": ("standard error of fdr_residual", "1",
                        "delete-a-group jackknife over the replicas (32 groups at most)"),
    "fdr_residual_theory": ("predicted fluctuation–dissipation residual", "1",
                            ("the residual the papers' relation must leave at the exact stationary Σ_WW: "
                            "‖λE[Σxx⁽ⁿ⁾Σ_WWΣxx⁽ⁿ⁾]‖/‖λD(0)‖")),
    "q_ratio": ("antisymmetric ratio", "1",
                "max|Q|/max|D_sym|, Q = (ΣxxΣ_WW − Σ_WWΣxx)/2, D_sym its symmetric partner"),
    "fdr_fourier_mismatch": ("Fourier mismatch of the FDR", "1",
                             ("max over k_x of the difference between the normalised Fourier profiles "
                             "|Â(k_x,0)|/|Â(0,0)| of ΣxxΣ_WW + Σ_WWΣxx and of D(0), the inputs seen as image "
                             "pixels (Han et al. 2021 Fig. 2)")),
    "noise_whiteness": ("gradient-noise whiteness", "1", "max over lags m ≠ 0 of ‖D(m)‖/‖D(0)‖"),
    "joint_eigenvalue": ("joint fluctuation eigenvalue", "weight²",
                         ("mean eigenvalue of the joint (W1, W2) covariance projected on the range of Γ (the "
                         "N_o·N_i stiff directions of the loss Hessian at the replica's mean weights; two_layer)")),
    "joint_eigenvalue_se": ("standard error of joint_eigenvalue", "weight²", "spread of replicas"),
    "joint_eigenvalue_theory": ("predicted joint eigenvalue", "weight²", "λ⟨r²⟩/(2S) (docs/physics.md §4)"),
    "joint_anisotropy": ("joint anisotropy", "1",
                         ("per replica std/mean of the covariance eigenvalues on the range of Γ, averaged "
                          "(0 = isotropic)")),
    "missing_because": ("why a theory value is missing", None,
                        ("per point and theory column (coordinate theory_column): why the point has no value of "
                         "that column (the theory does not apply, or its solver failed); empty where it has one")),
    "escape_time": ("mean escape time", "steps",
                    "exponential maximum-likelihood estimate with censoring: Σ times / number escaped"),
    "escape_time_se": ("standard error of escape_time", "steps", "escape_time/√(number escaped)"),
    "escaped_fraction": ("escaped fraction", "1", "fraction of non-diverged replicas that escaped within steps"),
    "escape_censored": ("censored replicas", "1", "replicas that did not escape within steps (kept as censored)"),
    "escape_time_theory_arrhenius": ("Kramers escape time", "steps", "Arrhenius/Kramers law (docs/physics.md §6)"),
    "escape_time_theory_powerlaw": ("power-law escape time", "steps",
                                    "Mori's state-dependent law (docs/physics.md §6)"),
    "escape_time_theory_exact": ("exact escape time of the discrete chain", "steps",
                                 ("mean first-passage time of the SGD chain itself at any λ, solved on a grid "
                                  "(theory/escape_exact.py; 'formula' names each point's grid)")),
    "escape_time_theory_exact_matched": ("Gaussian-matched escape time (approximation)", "steps",
                                         ("the exact discrete-chain escape time of N(0, C(w)) noise standing in for "
                                          "sampled minibatch noise of the same covariance")),
    "lr_curvature": ("λh", "1", "learning rate times the largest Hessian eigenvalue at the starting minimum"),
    "diverged": ("diverged", "1", ("1 if any replica of the point diverged (|w−w*|² beyond the bound "
                 "or not finite), else 0 (a flag: see flag_meanings; a bool in ensembles written before); such "
                 "replicas are excluded from every average")),
    "diverged_replicas": ("diverged replicas", "1", "number of replicas that diverged"),
    "lyapunov": ("top Lyapunov exponent", "1/step",
                 ("mean over replicas of each replica's growth rate of log‖z‖, z a tangent vector of SGD linearised "
                  "about the minimum, renormalised every step, after the burn-in (points of an edge search; "
                  "sgdsweep.sim.tangent)")),
    "lyapunov_se": ("standard error of lyapunov", "1/step", "spread of the replicas' exponents over √replicas"),
    "burn_in": ("burn-in", "steps", "updates discarded before measuring"),
    "burn_in_relaxations": ("burn-in in relaxation times", "1",
                            ("burn_in over the slowest relaxation time 1/(1 − ρ) of the noise-free update at the "
                             "minimum (for method sde, of its Euler step; docs/physics.md §8); below SHORT_BURN_IN (4) "
                             "the point's averages may still hold the relaxation from its start; NaN where that "
                             "update is unstable, and for a point whose store predates this variable")),
    "measured_steps": ("measured steps", "steps", "updates averaged per replica after burn-in"),
    "simulation_seconds": ("simulation time", "s", "wall-clock seconds spent simulating the point"),
    # per replica
    "lyapunov_replica": ("top Lyapunov exponent per replica", "1/step",
                         ("each replica's estimate of the exponent (sgdsweep.sim.tangent); −inf where its tangent "
                          "vanished")),
    "weight_var_replica": ("weight variance per replica", "weight²",
                           "per-replica time average of |w−w*|²/d; NaN for diverged or absent replicas"),
    "loss_replica": ("training loss per replica", "loss", "per-replica time average; NaN for diverged replicas"),
    "test_loss_replica": ("test loss per replica", "loss", "per-replica time average; NaN for diverged replicas"),
    "loss_autocorr_time_replica": ("loss autocorrelation time per replica", "steps", "τ_int per replica"),
    "diverged_step": ("divergence step", "steps",
                      "step at which the replica diverged; missing (the fill value, read as NaN) if it did not"),
    "escape_step": ("escape step", "steps",
                    "step at which the replica escaped; missing (the fill value, read as NaN) if censored"),
    "escape_time_replica": ("escape time per replica", "steps",
                            ("SGD steps until the replica escaped, or the cap (steps) when censored "
                             "(escape_step = -1); NaN for diverged replicas")),
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
#: (long_name, units, description) of the arrays that only point stores hold (matrices).
POINT_ARRAYS: dict[str, tuple[str, str, str]] = {
    "weight_mean": ("mean of w − w*", "weight", "time- and replica-averaged deviation from the reference point"),
    "weight_cov": ("weight covariance", "weight²", ("stationary E[(w−w*)(w−w*)ᵀ] (around each replica's mean when "
                   "minima form a manifold), averaged over non-diverged replicas")),
    "weight_cov_theory": ("predicted weight covariance", "weight²", "the theory's Σ (see the summary's formulas)"),
    "weight_var_diag": ("weight variances", "weight²", ("diagonal of the covariance (kept instead of it beyond "
                        "cov_max_dim)")),
    "weight_cov_eigenvectors": ("leading covariance eigenvectors", "1", "from the streaming Nyström sketch"),
    "sigma_ww": ("Σ_WW", "weight²", "mean W̄ᵀW̄ around the minimum (Han et al.)"),
    "noise_cov_lag": ("D(m)", "gradient²", "mean b_{t+m}ᵀ b_t of the gradient noise at the minimum"),
    "lag": ("lag m", "steps", "lags of D(m)"),
}
#: Per-replica arrays copied from the point stores (padded with NaN or −1).
REPLICA_ARRAYS = ("weight_var_replica", "loss_replica", "test_loss_replica", "loss_autocorr_time_replica",
                  "diverged_step", "escape_step", "escape_time_replica", "lyapunov_replica")
#: Per-point vectors copied when present (dimension name, padded with NaN).
VECTOR_ARRAYS = {"weight_cov_eigenvalues": "mode", "weight_cov_eigenvalues_theory": "mode",
                 "weight_cov_eigenvalues_theory_continuous": "mode",
                 "weight_cov_eigenvalues_theory_detailed_balance": "mode",
                 "q_eigenvalues": "q_mode", "q_eigenvalues_theory": "q_mode",
                 "q_eigenvalues_theory_continuous": "q_mode",
                 "mode_curvature": "mode", "mode_curvature_theory": "mode", "noise_cov_ratio": "lag",
                 "range_cov_eigenvalues": "range_mode",
                 "fdr_fourier_lhs": "fourier_k", "fdr_fourier_noise": "fourier_k"}
#: (long_name, units in the model, description) of the coordinates; units None for text.
COORDS: dict[str, tuple[str, str | None, str]] = {
    "point": ("point hash", None, "content hash of the point's fully resolved parameters"),
    "replica": ("replica index", "1", "index of the independent replica"),
    "mode": ("mode index", "1", "covariance eigenmode, largest eigenvalue first"),
    "lag": ("lag m", "steps", "lag of the gradient-noise covariance D(m)"),
    "theory_column": ("theory column", None, "name of a theory column of the ensemble (*_theory*)"),
    "q_mode": ("Q mode index", "1", "singular value of the antisymmetric matrix Q, largest first (they come in pairs)"),
    "shard": ("shard id", None, "the shard (group of points sharing data) that simulated the point"),
    "lr": ("learning rate λ", "1", "SGD step size"),
    "batch_size": ("batch size S", "samples", "samples per gradient step"),
    "momentum": ("momentum μ", "1", "heavy-ball momentum"),
    "samples_per_param": ("samples per parameter P/N", "1", "data-set size over input dimension"),
    "hidden_width": ("hidden width N_h", "units", "hidden width of a two-layer network"),
    "noise": ("noise type", None, "how the gradient noise is generated (docs/physics.md §7)"),
    "n_inputs": ("input dimension N", "1", "number of inputs"),
    "label_noise": ("label noise σ_ε", "label", "standard deviation of the label noise"),
    "steps": ("steps", "steps", "updates per replica"),
    "replicas": ("replicas", "1", "replicas per point"),
    "time_after_burn_in": ("time after burn-in", None,
                           ("the time a mean over time is taken over (cell_methods): the measured_steps updates "
                            "that follow burn_in, of every replica")),
    "replicas_not_diverged": ("replicas not diverged", None,
                              "the replicas a mean over replicas is taken over (cell_methods): diverged ones excluded"),
}
#: The ensemble's theory columns, in the order of the coordinate ``theory_column``. Each holds the
#: theory quantity its name says without ``_theory`` (:func:`sgdsweep.models.predict.theory_name`:
#: ``escape_time_theory_arrhenius`` holds ``escape_time_arrhenius``, the Prediction field and the
#: key of its formula and reason in the point summaries), or one computed from another
#: (:data:`DERIVED_THEORY`).
THEORY_COLUMNS = ("weight_var_theory", "weight_cov_eigenvalues_theory", "mode_curvature_theory", "loss_theory",
                  "escape_time_theory_arrhenius", "escape_time_theory_powerlaw", "escape_time_theory_exact",
                  "escape_time_theory_exact_matched", "joint_eigenvalue_theory", "weight_var_theory_continuous",
                  "weight_cov_eigenvalues_theory_continuous", "weight_cov_eigenvalues_theory_detailed_balance",
                  "q_eigenvalues_theory", "q_eigenvalues_theory_continuous", "layer_cov_eigenvalues_W2_theory",
                  "test_loss_theory", "fdr_residual_theory")
#: Theory columns computed from a covariance the theory predicts rather than predicted themselves
#: (Tr Σ/d, its eigenvalues, the curvatures along its modes, the Q of the exact Σ): column → that
#: covariance, whose formula and reason they carry.
DERIVED_THEORY = {"weight_var_theory": "weight_cov", "weight_cov_eigenvalues_theory": "weight_cov",
                  "mode_curvature_theory": "weight_cov", "q_eigenvalues_theory": "weight_cov",
                  "weight_var_theory_continuous": "weight_cov_continuous",
                  "weight_cov_eigenvalues_theory_continuous": "weight_cov_continuous"}
#: Keys under which point stores written before recorded three formulas and reasons: old key →
#: the quantity's name (:func:`theory_entries` reads them so).
EARLIER_THEORY_KEYS = {"weight_cov_detailed_balance": "weight_cov_eigenvalues_detailed_balance",
                       "q_continuous": "q_eigenvalues_continuous", "w2_covariance": "layer_cov_eigenvalues_W2"}


def theory_source(column: str) -> str:
    """The quantity whose formula and reason (in a point summary's ``theory_formulas`` and
    ``theory_reasons``) the theory column ``column`` carries: :data:`DERIVED_THEORY`'s, else the
    column's own (its name without ``_theory``)."""
    return DERIVED_THEORY.get(column) or theory_name(column)


def theory_entries(recorded: Mapping[str, str]) -> dict[str, str]:
    """A point summary's ``theory_formulas`` or ``theory_reasons`` keyed by quantity, the keys of
    stores written before (:data:`EARLIER_THEORY_KEYS`) read as the quantities' names."""
    return {EARLIER_THEORY_KEYS.get(k, k): v for k, v in recorded.items()}


INT_SCALARS = ("diverged_replicas", "burn_in", "measured_steps", "escape_censored", "loss_autocorr_truncated")


#: Per-layer vectors (one value per eigenmode of a layer's covariance): prefix → (long name, units, description).
LAYER_VECTORS = {
    "layer_cov_eigenvalues_": ("covariance eigenvalues of {layer}", "weight²",
                               ("eigenvalues of the stationary covariance of the weights of {layer} alone, descending, "
                               "per replica around its own mean, averaged over replicas; when the minima form a "
                               "manifold (two_layer) the covariance is first projected on the Hessian's range, so "
                               "drift along flat directions is not counted")),
    "layer_mode_curvature_": ("loss curvature along the covariance modes of {layer}", "loss/weight²",
                              ("vᵢᵀ H vᵢ for the eigenvectors vᵢ of {layer}'s covariance (descending eigenvalue), "
                               "H the Hessian block of {layer} at the replica's mean weights, averaged over replicas")),
}


def layer_vector(name: str) -> tuple[str, str, bool] | None:
    """(prefix, layer, is_theory) of a per-layer vector name such as ``layer_cov_eigenvalues_W2_theory``."""
    for prefix in LAYER_VECTORS:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            theory = rest.endswith("_theory")
            return prefix, rest[: -len("_theory")] if theory else rest, theory
    return None


#: Units of the ensemble that UDUNITS (cf-units) knows: kept as they are. Every other unit of the
#: catalogue is a number in the model's own units (weight, loss, gradient, label) or a count (SGD
#: steps, samples, hidden units): its CF ``units`` is ``"1"`` and the attribute ``model_units``
#: keeps what it counts (:data:`MODEL_UNITS`, once for the whole dataset).
CF_UNITS = frozenset({"1", "s"})
#: The dataset attribute ``model_units``: how to read a variable whose ``units`` is ``"1"``.
MODEL_UNITS = ("Quantities of the model are dimensionless numbers in the model's own units: weights in weight "
               "units, losses in loss units, gradients in gradient units, labels in label units (for regression "
               "the unit of the labels y); times and counts are numbers of SGD steps (an SDE step for "
               "dynamics.method sde), samples or hidden units. Such a variable has units '1' and says which in "
               "its attribute model_units (weight², loss, loss/weight², gradient², steps, 1/step, samples, units, "
               "label); simulation_seconds is in seconds.")
#: Scalar (label) coordinates that name what a mean is taken over, for ``cell_methods`` (CF
#: §7.3: a collapsed axis is named by a scalar coordinate) → their value; described in :data:`COORDS`.
SCALAR_COORDS: dict[str, str] = {"time_after_burn_in": "the SGD steps after burn-in",
                                 "replicas_not_diverged": "the replicas of the point that did not diverge"}
#: cell_methods of the means over the time after burn-in and over the non-diverged replicas.
TIME_AND_REPLICA_MEANS = "time_after_burn_in: mean replicas_not_diverged: mean"
#: Replica means of per-replica statistics (a covariance's eigenvalues, an autocorrelation time).
REPLICA_MEAN = "replicas_not_diverged: mean"
#: cell_methods of each variable that is such a mean (per-replica values: over time only).
CELL_METHODS: dict[str, str] = {
    **dict.fromkeys(("weight_var", "loss", "test_loss"), TIME_AND_REPLICA_MEANS),
    **dict.fromkeys(("loss_autocorr_time", "joint_eigenvalue", "joint_anisotropy", "lyapunov"), REPLICA_MEAN),
    **dict.fromkeys(("weight_var_replica", "loss_replica", "test_loss_replica"), "time_after_burn_in: mean"),
}
#: Flag variables: flag_values and flag_meanings (CF §3.5).
FLAGS: dict[str, dict[str, object]] = {
    "diverged": {"flag_values": [0, 1], "flag_meanings": "no_replica_diverged some_replica_diverged"},
}
#: Per-replica step arrays whose "did not happen" is the fill value (written as _FillValue; read
#: back through xarray as NaN). Ensembles written before hold −1 there without a _FillValue.
FILL_VALUES: dict[str, int] = {"diverged_step": -1, "escape_step": -1}
#: Index coordinates of the dimensions the tables do not name: prefix → (long_name, description).
DIMENSION_INDEXES: dict[str, tuple[str, str]] = {
    "sv_": ("singular value index of {layer}", "singular value of the weight matrix {layer}, largest first"),
    "mode_": ("mode index of {layer}", "covariance eigenmode of the weights of {layer}, largest eigenvalue first"),
    "range_mode": ("range mode index", "covariance eigenmode on the range of Γ, largest eigenvalue first"),
    "fourier_k": ("Fourier index j", "k_x = 2πj/(number of image pixels)"),
    "lag": ("lag index", "index of the lags of the gradient-noise covariance D(m)"),
}


def cf_units_of(units: str | None) -> dict[str, str]:
    """The ``units`` (and, for a number in the model's units, ``model_units``) attributes of a
    catalogue unit: see :data:`CF_UNITS`; nothing for text (``None``)."""
    if units is None:
        return {}
    if units in CF_UNITS:
        return {"units": units}
    return {"units": "1", "model_units": units}


def describe(name: str, table: Mapping[str, tuple[str, str | None, str]] = VARIABLES) -> dict[str, object]:
    """The attributes of the variable ``name``: ``long_name``, ``description``, ``units`` in CF
    form (:func:`cf_units_of`; none for text) and ``model_units``, plus ``cell_methods``
    (:data:`CELL_METHODS`), flags (:data:`FLAGS`) and, for ``replica``, the standard name
    ``realization``. From ``table`` (:data:`VARIABLES` by default; :data:`COORDS` for
    coordinates), or generated for a per-layer vector (:data:`LAYER_VECTORS`) or a layer's
    singular values (``singular_values_<layer>``).

    Raises: KeyError for a name none of these describe.
    """
    lv = layer_vector(name)
    if lv is not None:
        prefix, layer, theory = lv
        long_name, units, description = (t.format(layer=layer) for t in LAYER_VECTORS[prefix])
        if theory:
            return {"long_name": "predicted " + long_name, **cf_units_of(units),
                    "description": "theory of " + long_name + " for each replica's own weights, averaged over "
                                   "replicas (see 'formula')"}
        return {"long_name": long_name, **cf_units_of(units), "description": description,
                "cell_methods": REPLICA_MEAN}
    if name.startswith("singular_values_"):
        layer = name[len("singular_values_"):]
        return {"long_name": f"singular values of {layer}", **cf_units_of("weight"),
                "description": f"final singular values of the weight matrix {layer} per replica, descending"}
    long_name, units, description = table[name]
    out: dict[str, object] = {"long_name": long_name, **cf_units_of(units), "description": description}
    if table is COORDS and name == "replica":
        out["standard_name"] = "realization"
    elif table is not COORDS:
        if name in CELL_METHODS:
            out["cell_methods"] = CELL_METHODS[name]
        out.update(FLAGS.get(name, {}))
    return out


def point_array_attrs(name: str) -> dict[str, object]:
    """The attributes of the point-store array ``name``: those of :data:`POINT_ARRAYS` for the
    arrays only point stores hold, else of the ensemble variable of that name (:func:`describe`).

    Raises: KeyError naming ``name`` for an array no table describes (a misspelt or new array is
    refused, never stored without its attributes): add it to :data:`POINT_ARRAYS` or
    :data:`VARIABLES`.
    """
    if name in POINT_ARRAYS:
        return describe(name, POINT_ARRAYS)
    try:
        return describe(name)
    except KeyError:
        raise KeyError(f"point-store array {name!r} is not in the catalogue sgdsweep.store.variables (neither "
                       "VARIABLES nor POINT_ARRAYS, nor a per-layer or singular-value name): add it there with "
                       "its long name, units and description") from None


def describe_dimension(dim: str) -> dict[str, object]:
    """The attributes of the index coordinate (0, 1, …) of a dimension that has no values of
    its own (``sv_<layer>``, ``mode_<layer>``, ``range_mode``, ``fourier_k``, ``lag`` without
    its lags): see :data:`DIMENSION_INDEXES`.

    Raises: KeyError for a dimension they do not name.
    """
    for prefix, (long_name, description) in DIMENSION_INDEXES.items():
        if dim == prefix or (prefix.endswith("_") and dim.startswith(prefix)):
            layer = dim[len(prefix):]
            return {"long_name": long_name.format(layer=layer), "units": "1",
                    "description": description.format(layer=layer)}
    raise KeyError(dim)


def ancillary_variables(name: str, names: Collection[str]) -> list[str]:
    """The variables of ``names`` that go with the measurement ``name`` (CF
    ``ancillary_variables``): its standard error ``<name>_se`` and its theory columns
    ``<name>_theory`` and ``<name>_theory_<approximation>``; none for a standard error, a
    theory column or ``missing_because``."""
    if name.endswith("_se") or "_theory" in name or name == "missing_because":
        return []
    se = [name + "_se"] if name + "_se" in names else []
    return se + sorted(k for k in names if k == name + "_theory" or k.startswith(name + "_theory_"))


def ensemble_dims(name: str) -> tuple[str, ...] | None:
    """The dimensions of the point-store array ``name`` once aggregated into the ensemble: per
    replica ``("point", "replica")`` (:data:`REPLICA_ARRAYS`), a layer's singular values
    ``("point", "replica", "sv_<layer>")``, a per-point vector ``("point", <its dimension>)``
    (:data:`VECTOR_ARRAYS`, :data:`LAYER_VECTORS`: ``mode_<layer>``); None for an array the
    ensemble does not hold (matrices stay in the point stores). Scalars of a point's summary
    (the names of :data:`VARIABLES` not listed here) lie along ``("point",)``."""
    if name in REPLICA_ARRAYS:
        return ("point", "replica")
    if name == "missing_because":  # written by aggregation itself, from the points' theory reasons
        return ("point", "theory_column")
    if name.startswith("singular_values_"):
        return ("point", "replica", "sv_" + name[len("singular_values_"):])
    if name in VECTOR_ARRAYS:
        return ("point", VECTOR_ARRAYS[name])
    lv = layer_vector(name)
    return ("point", "mode_" + lv[1]) if lv is not None else None
