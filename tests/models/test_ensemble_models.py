"""Every model's observables land in the ensemble with units and a description, theory columns
name their formula (or why there is none), and the fit and the report handle every model."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
import xarray as xr

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.report import build_report
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store.aggregate import build_ensemble, write_ensemble
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan

SHORT = {"steps": 600, "replicas": 3, "burn_in": 100}
CASES = {
    "quadratic": ({"kind": "quadratic"}, {"lr": [0.2, 0.4], "batch_size": [1, 2], "noise": ["gaussian", "student_t"]}),
    "linear": ({"kind": "linear", "n_inputs": 3}, {"lr": [0.2, 0.4], "batch_size": 2, "samples_per_param": 4,
                                                    "noise": ["epoch", "label"]}),
    "two_layer": ({"kind": "two_layer", "n_inputs": 3}, {"lr": 0.05, "batch_size": 2, "samples_per_param": 20,
                                                         "hidden_width": [1, 2]}),
    "matrix": ({"kind": "matrix"}, {"lr": 0.1, "batch_size": [2, 4], "samples_per_param": 50}),
    "landscape": ({"kind": "landscape", "noise_std": 3.0}, {"lr": [0.1, 0.2], "batch_size": 1, "noise": "gaussian"}),
    "digits": ({"kind": "digits"}, {"lr": 0.002, "batch_size": [5, 10]}),
}


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])


@pytest.mark.parametrize("kind", list(CASES))
def test_model_lands_in_ensemble_fit_and_report(kind, tmp_path):
    model, grid = CASES[kind]
    dynamics = dict(SHORT)
    if kind == "digits":
        dynamics["observe"] = {"gradient_noise": True, "cov_max_dim": 16}
    sweep = build_sweep({"sweep": kind, "results_dir": str(tmp_path), "model": model, "dynamics": dynamics,
                         "grid": grid})
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 4):
        simulate_points(batch, str(files.points_dir))
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    back = xr.open_zarr(files.ensemble).load()
    assert back.sizes["point"] == len(sweep.points)
    for name in list(back.data_vars) + [c for c in back.coords]:
        attrs = back[name].attrs
        assert {"long_name", "description"} <= set(attrs), (name, attrs)
        assert ("units" in attrs) != (back[name].dtype.kind in "OTU"), (name, attrs)  # units for numbers only
    for name in back.data_vars:
        if "_theory" in name:
            assert "formula" in back[name].attrs or "missing_because" in back[name].attrs, name
    expected = {"quadratic": ["weight_var_theory", "loss_theory"], "linear": ["test_loss", "loss_autocorr_time"],
                "two_layer": ["joint_eigenvalue", "joint_eigenvalue_theory", "range_cov_eigenvalues",
                              "mode_curvature", "singular_values_W1", "singular_values_W2",
                              "layer_cov_eigenvalues_W1", "layer_cov_eigenvalues_W2"],
                "matrix": ["singular_values_W"], "landscape": ["escape_time", "escape_step",
                                                               "escape_time_theory_arrhenius"],
                "digits": ["fdr_residual", "q_ratio", "noise_whiteness", "noise_cov_ratio", "test_loss",
                           "weight_cov_eigenvalues"]}[kind]
    for name in expected:
        assert name in back, name
    if kind == "linear":
        assert np.isnan(back["weight_var_theory"].values[back["noise"].values == "epoch"]).all()
        assert np.isfinite(back["weight_var_theory"].values[back["noise"].values == "label"]).all()
        assert "epoch" in back["weight_var_theory"].attrs["missing_because"]
        why = back["missing_because"].sel(theory_column="weight_var_theory").values  # one reason per point
        assert all("epoch" in w for w in why[back["noise"].values == "epoch"])
        assert all(w == "" for w in why[back["noise"].values == "label"])
    fits = fit_ensemble(back, sweep.config["fit"])
    spec = json.loads(files.report_spec.read_text())
    ran = {"quadratic": ["power_law", "linear_scaling"], "linear": [], "two_layer": [],
           "matrix": ["wigner", "wigner_width"], "landscape": [], "digits": []}[kind]
    for name in ran:
        assert name in fits, (name, fits.get("skipped"))
    for name in ("power_law", "linear_scaling", "momentum_scaling", "escape", "wigner", "flatness"):
        assert name in fits or name in fits["skipped"] or name == "wigner" and kind != "matrix", name
    page = build_report(back, fits, spec, figures_dir=tmp_path / "figures")
    parser = _Images()
    parser.feed(page)
    assert parser.images and all(src.startswith("data:image/png;base64,") for src in parser.images)
    written = sorted((tmp_path / "figures").glob("*.png"))
    assert len(written) == len(parser.images)  # every embedded figure is also a file for snakemake --report
    assert "Other observables" in page and "What the fits found" in page


def test_point_store_arrays_are_described(tmp_path):
    from sgdsweep.store import points as point_store
    sweep = build_sweep({"sweep": "d", "results_dir": str(tmp_path), "model": {"kind": "digits"},
                         "dynamics": {**SHORT, "observe": {"gradient_noise": True, "cov_max_dim": 16}},
                         "grid": {"lr": 0.002, "batch_size": 5}})
    simulate_points([sweep.points[0].spec()], str(tmp_path))
    path = point_store.point_path(tmp_path, sweep.points[0].hash)
    with point_store.PointStore(path) as store:
        assert {"sigma_ww", "noise_cov_lag", "weight_var_diag", "weight_cov_eigenvectors"} <= set(store.arrays)
        for name, (_, attrs) in store.arrays.items():
            assert {"long_name", "units", "description"} <= set(attrs), name


def test_a_batch_never_mixes_shards(tmp_path):
    """Points of different shards (here: noise types) are never advanced by one engine call:
    make_batches separates them and simulate_points refuses a mixed batch."""
    sweep = build_sweep({"sweep": "mix", "results_dir": str(tmp_path), "model": {"kind": "linear", "n_inputs": 3},
                         "dynamics": SHORT, "grid": {"lr": [0.1, 0.2], "batch_size": 2, "samples_per_param": 4,
                                                     "noise": ["epoch", "label"]}})
    specs = [p.spec() for p in sweep.points]
    batches = make_batches(specs, 8)
    assert len(batches) == 2 and all(len({b["params"]["noise"] for b in batch}) == 1 for batch in batches)
    with pytest.raises(ValueError, match=r"differ in \['noise'"):
        simulate_points(specs, str(tmp_path))
