"""The ensemble follows the CF conventions (docs/outputs.md): the IOOS compliance checker finds
no high or medium priority error in a netCDF copy of the ensemble of every model family, every
``units`` parses with cf-units, cf_xarray finds each measurement's standard error and theory
through the attributes alone; ``sgdsweep export --format netcdf`` writes a file xarray opens;
text is stored in Zarr's ``string`` data type with the ``vlen-utf8`` codec; ensembles written
before all this still open."""

from __future__ import annotations

import collections
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import REPO, cli, make_finished_sweep, tiny_config, write_yaml

import sgdsweep
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store.aggregate import build_ensemble, load_ensemble, write_ensemble
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan

cf_units = pytest.importorskip("cf_units")
cf_xarray = pytest.importorskip("cf_xarray")
pytest.importorskip("netCDF4")
checker_runner = pytest.importorskip("compliance_checker.runner")

SHORT = {"steps": 400, "replicas": 3, "burn_in": 100}
#: one tiny sweep of each model family (and the default model, linear, with its default noise)
FAMILIES = {
    "default": ({"kind": "linear", "n_inputs": 3}, {"lr": [0.2, 0.4], "batch_size": 2, "samples_per_param": 4}),
    "quadratic": ({"kind": "quadratic"}, {"lr": [0.2, 0.4], "batch_size": 1, "noise": ["gaussian", "student_t"]}),
    "linear": ({"kind": "linear", "n_inputs": 3}, {"lr": 0.2, "batch_size": 2, "samples_per_param": 4,
                                                    "noise": ["epoch", "label"]}),
    "two_layer": ({"kind": "two_layer", "n_inputs": 3}, {"lr": 0.05, "batch_size": 2, "samples_per_param": 20,
                                                         "hidden_width": [1, 2]}),
    "matrix": ({"kind": "matrix"}, {"lr": 0.1, "batch_size": [2, 4], "samples_per_param": 50}),
    "landscape": ({"kind": "landscape", "noise_std": 3.0}, {"lr": [0.1, 0.2], "batch_size": 1, "noise": "gaussian"}),
    "digits": ({"kind": "digits"}, {"lr": 0.002, "batch_size": 5}),
}
OLD = {"linear": REPO / "tests" / "data" / "linear_ensemble_before_cf.zarr.zip",
       "two_layer": REPO / "tests" / "data" / "two_layer_ensemble_before_cf.zarr.zip"}


def _ensemble(kind: str, root: Path) -> Path:
    model, grid = FAMILIES[kind]
    dynamics = dict(SHORT, observe={"gradient_noise": True, "cov_max_dim": 16}) if kind == "digits" else SHORT
    sweep = build_sweep({"sweep": kind, "results_dir": str(root), "model": model, "dynamics": dynamics, "grid": grid})
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 4):
        simulate_points(batch, str(files.points_dir))
    write_ensemble(build_ensemble(json.loads(files.sweep_spec.read_text())), files.ensemble)
    return files.ensemble


def cf_errors(nc: Path) -> dict[int, list[str]]:
    """The compliance checker's failed cf:1.11 checks on ``nc``: priority (3 high, 2 medium,
    1 low) → messages."""
    suite = checker_runner.CheckSuite()
    suite.load_all_available_checkers()
    results = suite.run_all(suite.load_dataset(str(nc)), ["cf:1.11"], skip_checks=[])["cf:1.11"][0]
    out: dict[int, list[str]] = collections.defaultdict(list)
    for r in results:
        value = r.value
        if value is None or (value if isinstance(value, bool) else value[0] == value[1]):
            continue
        out[r.weight] += [f"{r.name}: {m}" for m in r.msgs] or [r.name]
    return out


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_every_family_passes_the_cf_checker_and_links_its_columns(kind, tmp_path):
    ds = sgdsweep.open_ensemble(_ensemble(kind, tmp_path)).load()
    for name in ds.variables:
        if "units" in ds[name].attrs:
            cf_units.Unit(ds[name].attrs["units"])  # raises on a unit UDUNITS does not know
        else:
            assert ds[name].dtype.kind in "OTU", name  # only text has no units
    nc = tmp_path / "ensemble.nc"
    ds.to_netcdf(nc)
    errors = cf_errors(nc)
    assert not errors[3] and not errors[2], {w: errors[w] for w in (3, 2)}
    back = xr.open_dataset(nc)
    assert back.attrs["Conventions"].startswith("CF-1.11") and back.attrs["references"]
    assert "sgdsweep aggregate" in back.attrs["history"] and sgdsweep.__version__ in back.attrs["source"]
    for dim in back.dims:
        assert dim in back.coords, dim
    # every measurement's standard error and theory columns, found through the attributes alone
    for name in back.data_vars:
        if name.endswith("_se") or "_theory" in name:
            continue
        partners = {k for k in back.data_vars if k == f"{name}_se" or k.startswith(f"{name}_theory")}
        found = set(back.cf.get_associated_variable_names(name).get("ancillary_variables", []))
        assert found == partners, name
    if "weight_var" in back:
        assert back["weight_var"].attrs["model_units"] == "weight²"
        assert back["weight_var"].attrs["cell_methods"] == "time_after_burn_in: mean replicas_not_diverged: mean"


def test_flag_and_fill_value(tmp_path):
    """``diverged`` is a CF flag of its flag_values' type; a step that did not happen is the
    declared fill value on disk, NaN when read, never −1."""
    root = make_finished_sweep(tmp_path, grid={"lr": [0.2, 30.0], "batch_size": 2, "samples_per_param": 10})
    ds = sgdsweep.open_ensemble(root / "ensemble.zarr").load()
    flag = ds["diverged"]
    assert flag.dtype == np.int64 and flag.attrs["flag_values"] == [0, 1]
    assert flag.attrs["flag_meanings"].split() == ["no_replica_diverged", "some_replica_diverged"]
    assert flag.values.tolist() == [0, 1]  # lr = 30 diverges (λ times the largest curvature beyond 2)
    step = ds["diverged_step"]
    assert step.encoding["_FillValue"] == -1 and not (step.values == -1).any()
    assert np.isnan(step.values[flag.values == 0]).all() and (step.values[flag.values == 1] >= 0).any()


def test_text_is_zarr_string_with_vlen_utf8_readable_without_zarr(tmp_path):
    """Each text array is declared as Zarr's ``string`` data type with the ``vlen-utf8`` codec,
    and its chunk decodes with those codecs alone (numcodecs, no Zarr, no NumPy StringDType)."""
    import numcodecs

    ensemble = _ensemble("linear", tmp_path)
    texts = []
    for meta in sorted(ensemble.glob("*/zarr.json")):
        doc = json.loads(meta.read_text())
        if doc["data_type"] in ("string", "fixed_length_utf32") or "vlen" in json.dumps(doc["codecs"]):
            texts.append(meta.parent.name)
            assert doc["data_type"] == "string", meta
            assert [c["name"] for c in doc["codecs"]] == ["vlen-utf8", "zstd", "crc32c"], meta
    assert {"point", "shard", "noise", "missing_because", "theory_column"} <= set(texts)
    raw = (ensemble / "noise" / "c" / "0").read_bytes()[:-4]  # the CRC-32C trails the chunk
    values = numcodecs.VLenUTF8().decode(numcodecs.Zstd().decode(raw))
    assert set(values) - {""} == {"epoch", "label"} and values.dtype == object  # "": padding of the chunk


def test_export_netcdf_writes_a_file_xarray_opens_with_the_configs_metadata(tmp_path):
    root = make_finished_sweep(tmp_path, metadata={"institution": "Example Lab", "creator": "A. Person",
                                                   "creator_email": "a.person@example.org"})
    dest = tmp_path / "out" / "tiny.nc"
    proc = cli("export", str(root), str(dest), "--format", "netcdf")
    assert proc.returncode == 0, proc.stderr
    assert str(dest) in proc.stdout
    with xr.open_dataset(dest) as nc:
        original = load_ensemble(root / "ensemble.zarr")
        assert nc.sizes == original.sizes
        np.testing.assert_array_equal(nc["weight_var"].values, original["weight_var"].values)
        assert nc.attrs["institution"] == "Example Lab" and nc.attrs["creator_name"] == "A. Person"
        assert nc.attrs["creator_email"] == "a.person@example.org"
        history = nc.attrs["history"].splitlines()
        assert "sgdsweep aggregate" in history[0] and "sgdsweep export --format netcdf" in history[-1]
    errors = cf_errors(dest)
    assert not errors[3] and not errors[2], {w: errors[w] for w in (3, 2)}
    # never overwritten; a name that is not .nc refused; both exit 2 with a message, no traceback
    before = dest.read_bytes()
    again = cli("export", str(root), str(dest), "--format", "netcdf")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    assert dest.read_bytes() == before
    wrong = cli("export", str(root), str(tmp_path / "tiny.zip.nc4"), "--format", "netcdf")
    assert wrong.returncode == 2 and "must end in .nc" in wrong.stderr and "Traceback" not in wrong.stderr
    assert not list(dest.parent.glob(".*tmp-*"))


def test_metadata_keys_are_checked(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", tiny_config(metadata={"creator_email": "not an address"}))
    proc = cli("validate", str(cfg))
    assert proc.returncode == 2 and "metadata.creator_email" in proc.stderr and "Traceback" not in proc.stderr
    cfg = write_yaml(tmp_path / "d.yaml", tiny_config(metadata={"creatr": "x"}))
    proc = cli("validate", str(cfg))
    assert proc.returncode == 2 and "metadata.creatr" in proc.stderr and "creator" in proc.stderr


@pytest.mark.parametrize("kind", list(OLD))
def test_ensembles_of_the_previous_layout_still_open(kind, tmp_path):
    """Ensembles written before the CF layout (bool ``diverged``, −1 for a step that did not
    happen, model units in ``units``) open, load and fit as before."""
    from sgdsweep.analysis.fit import fit_ensemble

    path = tmp_path / "ensemble.zarr"
    with zipfile.ZipFile(OLD[kind]) as zf:
        zf.extractall(path)
    ds = sgdsweep.open_ensemble(path)
    assert "Conventions" not in ds.attrs and ds["diverged"].dtype == bool
    assert (ds["diverged_step"].values == -1).all()
    loaded = load_ensemble(path)
    assert loaded.sizes == ds.sizes
    fits = fit_ensemble(loaded, build_sweep(tiny_config(results_dir=str(tmp_path))).config["fit"])
    assert "skipped" in fits
