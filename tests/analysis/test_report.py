"""The report leads with the answer: each fit's headline numbers and a verdict in words that counts the
goodness of fit; then the main figure. It embeds what it shows, and its figures name every swept axis,
have no empty panel and no overlapping tick labels."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
import xarray as xr

from sgdsweep.analysis import plotting
from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.verdict import num, pvalue
from sgdsweep.analysis.report import build_report


class _Parse(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.figure_ids, self.open = [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a["src"])
        if tag == "figure":
            self.figure_ids.append(a["id"])
        if tag not in ("img", "meta", "br"):
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()


def _ensemble(theory_exponent: float, seed: int = 0) -> xr.Dataset:
    """Synthetic sweep: 4 λ × 4 S, 32 replicas of weight_var ∝ λ/S, theory ∝ λ^theory_exponent/S."""
    rng = np.random.default_rng(seed)
    lr, s = np.meshgrid([0.05, 0.1, 0.2, 0.4], [2, 4, 8, 16], indexing="ij")
    lr, s = lr.ravel(), s.ravel().astype(float)
    truth = 0.3 * lr / s
    reps = truth[:, None] * rng.gamma(100, 1 / 100, size=(16, 32))
    n = lr.size
    return xr.Dataset(
        {"weight_var": ("point", reps.mean(1)), "weight_var_se": ("point", reps.std(1, ddof=1) / np.sqrt(32)),
         "weight_var_theory": ("point", 0.3 * lr**theory_exponent / s * 0.1 ** (1 - theory_exponent)),
         "weight_var_replica": (("point", "replica"), reps), "diverged": ("point", np.zeros(n, bool)),
         "diverged_replicas": ("point", np.zeros(n, int)), "burn_in": ("point", np.full(n, 100)),
         "simulation_seconds": ("point", np.full(n, 0.5))},
        coords={"point": [f"p{i}" for i in range(n)], "lr": ("point", lr), "batch_size": ("point", s),
                "shard": ("point", np.array(["shard-a"] * 8 + ["shard-b"] * 8, dtype=object))},
        attrs={"swept_axes": '["lr", "batch_size"]', "sweep": "synthetic", "package_versions": "{}"})


SPEC = {"report": {"title": "synthetic"}, "config": {"sweep": "synthetic"}, "config_hash": "abc"}


def _report(ds, tmp_path, files=True, legends=None):
    """(fits, page, parser); the figures also written under ``tmp_path / "figures"`` (PNG and SVG)
    with ``files``, else not (no SVG is drawn)."""
    fits = fit_ensemble(ds, {"confidence": 0.95, "bootstrap": 200})
    page = build_report(ds, fits, SPEC, figures_dir=tmp_path / "figures" if files else None, legends=legends)
    parser = _Parse()
    parser.feed(page)
    assert parser.open == []  # every element closed: well-formed
    return fits, page, parser


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    """The report of ``_ensemble(1.0)`` with its figure files, built once for the tests that only
    read it: (ds, fits, page, parser, figures directory)."""
    root = tmp_path_factory.mktemp("inside")
    ds = _ensemble(1.0)
    fits, page, parser = _report(ds, root)
    return ds, fits, page, parser, root / "figures"


def test_report_says_when_theory_is_inside(inside):
    _, fits, page, parser, figures_dir = inside
    a = fits["power_law"][0]["params"]["a"]
    assert a["theory_inside"] and a["interval_method"] == "bootstrap"
    assert "OUTSIDE" not in page and "DISAGREES" not in page and "agrees with the exact theory" in page
    # every referenced figure is embedded (data URI), also written as a file, and named
    assert parser.imgs and all(src.startswith("data:image/png;base64,") for src in parser.imgs)
    files = sorted(p.stem for p in figures_dir.glob("*.png"))
    assert sorted(i[len("fig-"):] for i in parser.figure_ids) == files
    assert {"power_law_0", "linear_scaling_0", "weight_var", "shard_times"} <= set(files)
    assert "coverage" not in files  # a full grid, every point done: nothing for a coverage map to say
    assert "Not run: " in page and "momentum is not swept" in page


def test_report_says_when_theory_is_outside(tmp_path):
    """A theory with exponent a = 1.3 on data with a = 1: the report flags it in red, in the
    summary and in the fit's section."""
    fits, page, _ = _report(_ensemble(1.3), tmp_path, files=False)
    a = fits["power_law"][0]["params"]["a"]
    assert a["theory_inside"] is False and abs(a["theory"] - 1.3) < 1e-9
    start = page.index("<section id='answer'>")
    answer = page[start:page.index("</section>", start)]
    assert a["disagrees"] and a["pvalue_holm"] <= 0.05
    assert f"exact theory {num(a['theory'])} (DISAGREES: " in answer and "DISAGREES with the exact theory" in answer
    assert "class='bad'" in answer and "correction over all" in answer
    # the linear-scaling collapse: the measurements collapse, the wrong theory does not
    spread = fits["linear_scaling"][0]["params"]["spread2"]
    assert spread["theory"] > spread["interval"][1]
    assert json.dumps(fits)  # JSON-ready


def _with_momentum(ds: xr.Dataset, values=(0.0, 0.2, 0.4, 0.6, 0.8, 0.9)) -> xr.Dataset:
    """``ds`` repeated once per momentum value: fits grouped by momentum get one group per value."""
    parts = [ds.assign_coords(point=[f"{p}-m{j}" for p in ds["point"].values],
                              momentum=("point", np.full(ds.sizes["point"], m)))
             for j, m in enumerate(values)]
    out = xr.concat(parts, dim="point")
    out.attrs.update(ds.attrs, swept_axes='["lr", "batch_size", "momentum"]')
    return out


def test_many_groups_get_an_overview_and_a_few_figures(tmp_path):
    """With more groups than MAX_GROUP_FIGURES, every group keeps its table, a few get their own
    figure, one overview figure shows them all, and the report says so."""
    from sgdsweep.analysis.report import MAX_GROUP_FIGURES

    legends: dict = {}
    fits, page, parser = _report(_with_momentum(_ensemble(1.0)), tmp_path, files=False, legends=legends)
    assert len(fits["power_law"]) == 6 > MAX_GROUP_FIGURES
    files = set(legends)  # every drawn figure, by name
    assert sorted(i[len("fig-"):] for i in parser.figure_ids) == sorted(files)
    for kind in ("power_law", "linear_scaling"):
        assert f"{kind}_overview" in files and f"{kind}_0" in files
        assert len([f for f in files if f.startswith(f"{kind}_") and f[len(kind) + 1:].isdigit()]) == MAX_GROUP_FIGURES
    assert page.count("<h3>Power law weight_var") == 6 + 1  # every group's section, and the overview
    assert "6 groups: each has its table below" in page


def test_figures_drawn_in_parallel_give_the_same_report(inside, tmp_path):
    ds, fits, serial, _, one = inside  # drawn in this process
    parallel = build_report(ds, fits, SPEC, figures_dir=tmp_path / "two", jobs=2)
    assert serial == parallel
    for png in one.glob("*.png"):
        assert png.read_bytes() == (tmp_path / "two" / png.name).read_bytes()


def test_figure_workers_are_forked_only_from_a_single_threaded_process():
    """A fork of a process with another thread (Zarr's event loop) could inherit a held lock and
    hang: then the workers come from a fork server. A single-threaded process forks them."""
    import subprocess
    import sys
    import threading

    from sgdsweep.analysis.report import figure_pool

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        pool = figure_pool(2)
        assert pool._mp_context.get_start_method() == "forkserver"
        assert pool.submit(sum, [1, 2]).result() == 3
        assert pool.submit(eval, "'dask.array' in __import__('sys').modules").result()  # preloaded
        pool.shutdown()
    finally:
        stop.set()
        other.join()
    # a fresh process forks them; each has dask.array already (which xarray imports for the first
    # variable a worker unpickles: imported once before the fork, not in every worker)
    code = ("import sys; from sgdsweep.analysis.report import figure_pool; "
            "before = 'dask.array' in sys.modules; p = figure_pool(2); "
            "print(p._mp_context.get_start_method(), p.submit(sum, [1, 2]).result(), before, "
            "p.submit(eval, \"'dask.array' in __import__('sys').modules\").result()); p.shutdown()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["fork", "3", "False", "True"]
    assert figure_pool(1) is None


def _pixels(png: bytes) -> np.ndarray:
    """The RGBA pixels of ``png``, read by matplotlib."""
    import io

    from matplotlib.image import imread

    return imread(io.BytesIO(png), format="png")


def _savefig_tight(fig) -> bytes:
    import io

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=plotting.DPI, bbox_inches="tight")
    return out.getvalue()


def test_report_figures_are_matplotlibs_own_tight_pngs(inside):
    """The report's PNG of a figure is pixel for pixel what ``savefig(bbox_inches="tight")``
    makes of it, log axes labelled by matplotlib's own formatter: no hand-cut canvas, no
    rewritten labels."""
    from matplotlib import ticker

    from sgdsweep.analysis import figures
    ds, fits, _, _, tmp_path = inside
    # (not a figure with constrained layout: two savefig calls of one such figure differ by a pixel)
    for name, make, args in (("weight_var", figures.weight_var_against_ratio, (ds,)),
                             ("power_law_0", figures.power_law, (ds, fits["power_law"][0])),
                             ("shard_times", figures.shard_times, (ds,))):
        fig = make(*args)
        try:
            assert np.array_equal(_pixels((tmp_path / f"{name}.png").read_bytes()), _pixels(_savefig_tight(fig))), name
            if name != "shard_times":
                assert isinstance(fig.axes[0].yaxis.get_major_formatter(), ticker.LogFormatterSciNotation), name
        finally:
            figures.plt.close(fig)


def test_png_holds_a_legend_outside_the_figure():
    """A legend placed beyond the figure's edge is inside the PNG, as with ``savefig(bbox_inches="tight")``."""
    from sgdsweep.analysis.plotting import plt, png

    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(left=0.3, bottom=0.4, right=0.95, top=0.85)
    ax.plot([1, 2, 3], [3, 1, 2], label="a line")
    ax.set_title("a title")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    try:
        pixels = _pixels(png(fig))
        box = fig.get_tightbbox()  # inches
        assert box.x1 > 6  # the case: the legend reaches beyond the figure's right edge
        assert abs(pixels.shape[1] - (box.width + 2 * 0.1) * plotting.DPI) <= 1  # and it is in the PNG
        assert np.array_equal(pixels, _pixels(_savefig_tight(fig)))
    finally:
        plt.close(fig)


def _text(page: str) -> str:
    """The text of an HTML page, entities decoded."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_report_leads_with_the_headline_numbers_and_an_honest_verdict(tmp_path):
    """Before the first figure: each exponent with its interval, the exact theory and the leading
    order; a power law that the χ² rejects is said to be rejected, with what the deviations are,
    and never shown as a plain green pass."""
    ds = _ensemble(1.0)
    curved = 1 + 3 * ds["lr"]  # the data: not a power law
    ds["weight_var_replica"] = ds["weight_var_replica"] * curved
    ds["weight_var"], ds["weight_var_se"] = ds["weight_var"] * curved, ds["weight_var_se"] * curved
    fits, page, _ = _report(ds, tmp_path, files=False)
    pl = fits["power_law"][0]
    assert pl["chi2_pvalue"] < 1e-3  # the case of the verdict below
    first = _text(page[:page.index("<figure")])
    for name in ("a", "b"):
        q = pl["params"][name]
        assert f"{name} = {num(q['estimate'])} [{num(q['interval'][0])}, {num(q['interval'][1])}]" in first
        assert f"leading order {num(q['leading_order'])}" in first
    assert f"a pure power law is rejected (χ²/dof = {num(pl['chi2_reduced'], 3)}, {pvalue(pl['chi2_pvalue'])})" in first
    # the theory here is a pure power law, the data are not: the deviations are not the theory's
    assert "the measurements deviate from the exact theory" in first and "DISAGREES" in first


def test_coverage_map_only_when_the_grid_has_gaps_or_divergence(tmp_path):
    from sgdsweep.analysis import figures
    ds = _ensemble(1.0)
    assert not figures.coverage_worth_showing(ds)
    assert figures.coverage_worth_showing(ds.isel(point=slice(1, None)))  # a gap
    diverged = ds.copy()
    diverged["diverged_replicas"] = diverged["diverged_replicas"].copy(data=np.r_[3, np.zeros(15, int)])
    assert figures.coverage_worth_showing(diverged)
    page = build_report(diverged, fit_ensemble(diverged, {"bootstrap": 0}), SPEC)
    assert "Coverage of the grid" in page


def _two_layer_like(seed: int = 0) -> xr.Dataset:
    """A sweep over hidden_width × lr at one batch size, no exact theory (as two_layer): weight_var,
    loss, and a spectrum whose length grows with the hidden width (NaN-padded)."""
    rng = np.random.default_rng(seed)
    hw, lr = np.meshgrid([2, 3, 6], [0.01, 0.02, 0.04], indexing="ij")
    hw, lr = hw.ravel(), lr.ravel()
    n = hw.size
    wv = 0.3 * lr / 4 / hw * (1 + 0.02 * rng.standard_normal(n))
    modes = np.full((n, 28), np.nan)
    for i in range(n):
        d = 5 * hw[i] - 2
        modes[i, :d] = wv[i] * np.geomspace(10, 1e-4, d)
    ds = xr.Dataset(
        {"weight_var": ("point", wv, {"long_name": "weight variance", "units": "weight²"}),
         "weight_var_se": ("point", 0.02 * wv), "weight_var_theory": ("point", np.full(n, np.nan)),
         "loss": ("point", 0.504 + 0.01 * lr, {"long_name": "training loss", "units": "loss"}),
         "loss_se": ("point", np.full(n, 1e-4)),
         "weight_cov_eigenvalues": (("point", "mode"), modes,
                                    {"long_name": "weight covariance eigenvalues", "units": "weight²"}),
         "diverged": ("point", np.zeros(n, bool)), "diverged_replicas": ("point", np.zeros(n, int)),
         "simulation_seconds": ("point", np.full(n, 0.5))},
        coords={"point": [f"p{i}" for i in range(n)],
                "lr": ("point", lr, {"long_name": "learning rate λ", "units": "1"}),
                "batch_size": ("point", np.full(n, 4)),
                "hidden_width": ("point", hw, {"long_name": "hidden width N_h", "units": "units"}),
                "shard": ("point", np.array(["s"] * n, dtype=object))},
        attrs={"swept_axes": '["lr", "hidden_width"]', "sweep": "two", "package_versions": "{}"})
    return ds


def _texts(fig) -> list[str]:
    """Every title, suptitle, axis label and legend entry of a drawn figure."""
    out = [fig.get_suptitle()]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        if ax.get_legend() is not None:
            out += [t.get_text() for t in ax.get_legend().get_texts()]
    return out


def test_two_layer_figures_name_every_swept_axis_and_have_no_empty_panel():
    """hidden_width × lr without an exact theory: no "(no theory)" panel, spectrum panels with
    distinct titles naming hidden_width, legends naming the other axis, no pseudo-unit on
    hidden_width, integer ticks for it, and no overlapping tick labels in any figure."""
    from sgdsweep.analysis import figures, spectra_figures
    from sgdsweep.analysis.plotting import overlapping_tick_labels, png

    ds = _two_layer_like()
    drawn = {"weight_var": figures.weight_var_against_ratio(ds), "spectra": spectra_figures.spectra(ds),
             "against_lr": figures.against_axis(ds, "lr"),
             "against_hidden_width": figures.against_axis(ds, "hidden_width"),
             "spectrum_hw": spectra_figures.spectrum_against_axis(ds, "hidden_width")}
    try:
        assert all(fig is not None for fig in drawn.values()), drawn
        for name, fig in drawn.items():
            png(fig)
            assert overlapping_tick_labels(fig) == [], name
            for ax in fig.axes:  # every panel draws something
                assert ax.lines or ax.collections or ax.images, (name, ax.get_title())
            texts = " ".join(_texts(fig))
            assert "no theory)" not in texts and "[units]" not in texts and "[1]" not in texts.replace("λ [1]", "")
            assert "hidden_width" in texts or "hidden width" in texts, (name, texts)
        assert len(drawn["weight_var"].axes) == 1
        titles = [ax.get_title() for ax in drawn["spectra"].axes]
        assert len(set(titles)) == len(titles) and all("hidden_width = " in t for t in titles), titles
        legend = " ".join(_texts(drawn["spectrum_hw"]))
        assert all(f"$\\lambda$ = {v:g}" in legend for v in (0.01, 0.02, 0.04)), legend
        ax = drawn["against_hidden_width"].axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "3", "6"]
    finally:
        for fig in drawn.values():
            if fig is not None:
                figures.plt.close(fig)


def test_overlapping_tick_labels_are_thinned():
    """A log axis over one decade labels its minor ticks; on a narrow axis they collide: drawn, the
    PNG keeps only labels that clear each other."""
    from sgdsweep.analysis.plotting import overlapping_tick_labels, plt, png

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([2.8e-4, 4.3e-3], [1, 2])
    ax.set_xscale("log")
    fig.draw_without_rendering()
    assert overlapping_tick_labels(fig)  # the case the guard is for
    png(fig)
    assert overlapping_tick_labels(fig) == []
    assert any(t.get_text() for t in ax.get_xticklabels())  # not every label dropped
    plt.close(fig)
