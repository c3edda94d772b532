"""The report at many points: figures summarise many groups (a grey cloud of every point and the
extreme groups in colour, the title saying how many groups there are), the tables of points list
at most a set number of rows and sum up the rest, dense figures are rasterised inside their SVG,
and grouping points is vectorised and gives the groups in the order they first occur."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from sgdsweep.analysis import figures, plotting, report
from sgdsweep.analysis.report import build_report

SPEC = {"report": {"title": "many groups"}, "config": {"sweep": "many"}, "config_hash": "abc"}


def _ensemble(tmp_path, n_lr: int = 6, momenta=(0.0, 0.2, 0.4, 0.6), sizes=(2, 4, 8, 16, 32)) -> xr.Dataset:
    """A sweep of λ × μ × S written to a Zarr store under ``tmp_path`` and read back:
    weight_var = theory × (1 + noise), 16 replicas, the theory ∝ λ/((1 − μ) S)."""
    rng = np.random.default_rng(3)
    lr, mu, s = (a.ravel() for a in np.meshgrid(np.geomspace(0.02, 0.3, n_lr), momenta, sizes, indexing="ij"))
    s = s.astype(float)
    theory = 0.3 * lr / ((1 - mu) * s)
    reps = theory[:, None] * rng.gamma(100, 1 / 100, size=(lr.size, 16))
    n = lr.size
    ds = xr.Dataset(
        {"weight_var": ("point", reps.mean(1)), "weight_var_se": ("point", reps.std(1, ddof=1) / 4),
         "weight_var_theory": ("point", theory), "weight_var_replica": (("point", "replica"), reps),
         "diverged": ("point", np.zeros(n, bool)), "diverged_replicas": ("point", np.zeros(n, int)),
         "burn_in": ("point", np.full(n, 100)), "simulation_seconds": ("point", np.full(n, 0.5))},
        coords={"point": [f"p{i}" for i in range(n)], "lr": ("point", lr), "momentum": ("point", mu),
                "batch_size": ("point", s), "shard": ("point", np.array(["shard-a"] * n, dtype=object))},
        attrs={"swept_axes": '["lr", "momentum", "batch_size"]', "sweep": "many", "package_versions": "{}"})
    ds.to_zarr(tmp_path / "ensemble.zarr", mode="w")
    return xr.open_zarr(tmp_path / "ensemble.zarr").load()


def _naive_split(ds, axes):
    keys = list(zip(*(ds[a].values.tolist() for a in axes))) if axes else [()] * ds.sizes["point"]
    return [(key, np.array([k == key for k in keys])) for key in dict.fromkeys(keys)]


def test_grouping_is_vectorised_and_keeps_the_order_of_first_occurrence(tmp_path):
    ds = _ensemble(tmp_path).isel(point=np.random.default_rng(0).permutation(120))
    ds = ds.assign_coords(noise=("point", np.where(ds["lr"].values > 0.1, "gaussian", "minibatch").astype(object)))
    for axes in ([], ["batch_size"], ["momentum", "batch_size"], ["noise", "batch_size"]):
        codes, keys = figures.group_codes(ds, axes)
        expected = _naive_split(ds, axes)
        assert keys == [k for k, _ in expected]
        assert all(type(a) is type(b) for k, (e, _) in zip(keys, expected) for a, b in zip(k, e))
        for (key, mask), (_, want) in zip(figures.split_by(ds, axes), expected):
            assert (mask == want).all() and (codes[want] == keys.index(key)).all()
    assert not figures.coverage_worth_showing(ds)  # a full grid, shuffled
    assert figures.coverage_worth_showing(ds.isel(point=slice(1, None)))


def test_weight_var_figure_summarises_more_groups_than_it_colours(tmp_path):
    ds = _ensemble(tmp_path)  # 4 μ × 5 S = 20 groups of λ/S, more than MAX_LINES
    assert 20 > figures.MAX_LINES
    fig = figures.weight_var_against_ratio(ds)
    entries = plotting.legend_entries(fig)["entries"]
    measured = [e for e in entries if e.endswith("measured")]
    assert len(measured) == figures.EXTREME_GROUPS  # the extreme groups only, not 20
    assert "measured, all 20 groups" in entries
    title = fig.axes[0].get_title()
    assert "20 groups of S, μ" in title and "in colour the extreme ones" in title
    figures.plt.close(fig)
    few = ds.where(ds["momentum"] == 0.0, drop=True)  # 5 groups: each its colour, no summary
    fig = figures.weight_var_against_ratio(few)
    assert len([e for e in plotting.legend_entries(fig)["entries"] if e.endswith("measured")]) == 5
    assert "groups of" not in fig.axes[0].get_title()
    figures.plt.close(fig)


def test_extreme_groups_are_those_of_lowest_and_highest_median():
    codes = np.repeat(np.arange(5), 3)
    score = np.array([1, 1, 1, 5, 5, 5, 0.1, 0.2, 0.3, 2, 2, np.nan, 3, 3, 3], float)
    assert figures.extreme_groups(codes, score) == [2, 1]
    assert figures.extreme_groups(codes, np.full(15, np.nan)) == []


def test_collapse_summarises_more_values_than_it_colours(tmp_path):
    sizes = tuple(range(2, 2 + figures.MAX_LINES + 4))  # more batch sizes than colours
    ds = _ensemble(tmp_path, n_lr=4, momenta=(0.0,), sizes=sizes)
    fit = {"params": {"spread2": {"estimate": 0.01}}, "variable": "lr/batch_size", "relative_spread": 0.1}
    fig = figures.collapse(ds, fit)
    entries = plotting.legend_entries(fig)["entries"]
    assert len([e for e in entries if e.startswith("$S$ = ")]) == figures.EXTREME_GROUPS
    assert f"measured, all {len(sizes)} values" in entries
    assert f"{len(sizes)} groups of $S$" in fig.axes[0].get_title()
    figures.plt.close(fig)


def test_dense_figure_is_rasterised_in_its_svg_and_a_light_one_is_not(tmp_path):
    x = np.random.default_rng(1).random((2, plotting.MAX_VECTOR_POINTS + 1))
    fig, ax = figures.plt.subplots()
    ax.plot(*x, "o")
    _, svg = plotting.render(fig)
    figures.plt.close(fig)
    assert b"<image" in svg and svg.count(b"<use") < 50  # one picture, not a marker per point (ticks only)
    fig, ax = figures.plt.subplots()
    ax.plot(*x[:, :50], "o")
    _, svg = plotting.render(fig)
    figures.plt.close(fig)
    assert b"<image" not in svg and svg.count(b"<use") >= 50


@pytest.mark.parametrize("n_lr", [12])
def test_points_tables_list_at_most_max_rows_and_sum_up_the_rest(tmp_path, n_lr):
    ds = _ensemble(tmp_path, n_lr=n_lr)  # 12 × 4 × 5 = 240 points
    ds["escape_time"] = ds["weight_var"] * 0 + 1.0  # an "other observable": its own table of points
    assert ds.sizes["point"] > report.MAX_TABLE_ROWS
    page = build_report(ds, {"settings": {}}, SPEC, figures_dir=tmp_path / "figures")
    rest = ds.sizes["point"] - report.MAX_TABLE_ROWS
    assert page.count(f"{rest} more points not listed") == 2
    assert f"the first {report.MAX_TABLE_ROWS} of {ds.sizes['point']}" in page
    assert "<td>p199</td>" in page and "<td>p200</td>" not in page
    assert "their largest |measured − theory| / SE is" in page
    svg = (tmp_path / "figures" / "weight_var.svg").read_text()
    assert "20 groups of S, μ" in svg  # the summary's title is in the figure written for the page


def test_a_small_points_table_lists_every_point(tmp_path):
    ds = _ensemble(tmp_path, n_lr=2, momenta=(0.0,), sizes=(2, 4))
    page = build_report(ds, {"settings": {}}, SPEC)
    assert all(f"<td>p{i}</td>" in page for i in range(4)) and "more points not listed" not in page
