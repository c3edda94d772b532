"""The report answers its own question on its first screen: ``report.lead`` (schema enum, defaults
per sweep, every shipped config), the headline's numbers (the momentum sweep's measured stability
edge against the exact one), and the figures' conventions: theory drawn above the measurements,
every panel and group drawn or counted on the figure, 1-D spectra with their theory, diverged
points that do not look like data, mathtext labels without pseudo-units, an SVG beside each PNG
at 200 dpi, legends that list every labelled series, tables that scroll inside their own box."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from test_report import _ensemble, _text, _two_layer_like, _with_momentum

from sgdsweep.analysis import figures, headline, plotting, spectra_figures
from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.report import build_report
from sgdsweep.sweep import lead
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.schema import load_schema
from sgdsweep.theory.edge import liu_edge

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*(REPO / "config" / "sweeps").glob("*.yaml"), *(REPO / "config" / "models").glob("*.yaml"),
                  REPO / "config" / "config.yaml"])
LIU = yaml.safe_load((REPO / "config" / "sweeps" / "liu2021_momentum.yaml").read_text())
LR, K, SIGMA2 = 2.75, 1.0, 1.0  # liu2021_momentum: λk = 2.75, beyond plain SGD's λk < 2


def _momentum_sweep(mu=(0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9), diverged=(0.3, 0.35), seed=0) -> xr.Dataset:
    """liu2021_momentum's points: Var = λσ²/[(1−μ)k(2 − λk/(1+μ))] measured to 1 % (Gaussian
    errors of that size), every replica diverged at the μ in ``diverged``."""
    rng = np.random.default_rng(seed)
    mu = np.asarray(mu, float)
    gone = np.isin(mu, diverged)
    theory = np.where(2 - LR * K / (1 + mu) > 0, LR * SIGMA2 / ((1 - mu) * K * (2 - LR * K / (1 + mu))), np.nan)
    se = 0.01 * theory
    measured = np.where(gone, np.nan, theory + se * rng.standard_normal(mu.size))
    n = mu.size
    return xr.Dataset(
        {"weight_var": ("point", measured), "weight_var_se": ("point", np.where(gone, np.nan, se)),
         "weight_var_theory": ("point", np.where(gone, np.nan, theory)), "diverged": ("point", gone),
         "diverged_replicas": ("point", np.where(gone, 128, 0)), "simulation_seconds": ("point", np.full(n, 0.1))},
        coords={"point": [f"p{i}" for i in range(n)], "lr": ("point", np.full(n, LR)),
                "batch_size": ("point", np.full(n, 1)), "momentum": ("point", mu),
                "noise": ("point", np.array(["gaussian"] * n, dtype=object)),
                "shard": ("point", np.array(["s"] * n, dtype=object))},
        attrs={"swept_axes": '["momentum"]', "sweep": "liu2021_momentum", "package_versions": "{}"})


def _spec(config: dict | None = None, lead_name: str = "auto") -> dict:
    cfg = dict(config or {"sweep": "synthetic"})
    return {"report": {"title": "lead test", "lead": lead_name}, "config": cfg, "config_hash": "abc"}


def test_lead_names_are_the_schema_enum_and_every_shipped_config_resolves():
    """report.lead's schema enum is lead.LEADS; every shipped config names one (or auto) and
    builds; the paper reproductions name theirs (the question each asks)."""
    enum = load_schema()["properties"]["report"]["properties"]["lead"]["enum"]
    assert enum == list(lead.LEADS)
    for path in SHIPPED:
        cfg = build_sweep(yaml.safe_load(path.read_text()), rounds=False).config
        assert cfg["report"]["lead"] in lead.LEADS, path
    named = {p.stem: yaml.safe_load(p.read_text())["report"]["lead"]
             for p in (REPO / "config" / "sweeps").glob("*.yaml")}
    assert named["liu2021_momentum"] == "momentum" and named["vescovi_escape"] == "escape"
    assert named["gross2024_flatness"] == "flatness" and named["park2024_matrix"] == "wigner"


def test_auto_lead_follows_what_the_sweep_measured():
    """auto: weight variance for a λ×S sweep, the momentum lead for momentum swept at one λ/S,
    isotropy where the joint eigenvalue has its theory, escape where the escape fit ran."""
    ds = _ensemble(1.0)
    assert lead.resolve("auto", ds, {}) == "weight_var"
    assert lead.resolve(None, _momentum_sweep(), {}) == "momentum"
    assert lead.resolve("auto", _with_momentum(ds, (0.0, 0.5)), {}) == "weight_var"  # λ/S varies: not the edge
    two = _two_layer_like()
    two["joint_eigenvalue"] = two["weight_var"]
    two["joint_eigenvalue_theory"] = two["weight_var"]
    assert lead.resolve("auto", two, {}) == "isotropy"
    assert lead.resolve("auto", ds, {"escape": [{"params": {"slope": {}}}]}) == "escape"
    assert lead.resolve("loss", ds, {}) == "loss"


def test_momentum_headline_checks_the_exact_edge():
    """The momentum lead states the measured bracket (largest μ with a diverged replica, smallest
    without) and the exact edge of theory/edge.py (Liu et al. Cor. 1: μ = λk/2 − 1 = 0.375), and
    agrees only when the edge lies inside."""
    edge = liu_edge([K], "momentum", lr=LR)
    assert edge == pytest.approx(0.375)
    head = headline.headline("momentum", _momentum_sweep(), {}, LIU)
    text = " ".join(head.sentences)
    assert head.lead == "momentum" and head.status == "good", text
    assert "a replica diverged at μ = 0.35 and none at μ ≥ 0.4" in text
    assert "the exact edge μ = 0.375" in text and "lies inside that bracket: agrees" in text
    assert "Weight variance at the stable μ: measured" in text and "agrees with the exact theory" in text
    name, _, _, args = head.figure
    assert name == "momentum_edge"
    _, edges, curves = args
    assert edges[0]["lower"] == pytest.approx(0.375, abs=1e-9)
    mu, th = curves[0]["mu"], curves[0]["theory"]  # the exact curve, diverging towards the edge
    assert mu.min() > 0.375 and th[np.argmin(mu)] > 10 * th[np.argmax(mu)]
    k = np.argmin(np.abs(mu - 0.5))
    assert th[k] == pytest.approx(LR * SIGMA2 / ((1 - mu[k]) * K * (2 - LR * K / (1 + mu[k]))), rel=1e-9)
    # replicas that diverged above the exact edge: the edge lies outside the measured bracket
    wrong = headline.headline("momentum", _momentum_sweep(diverged=(0.3, 0.35, 0.4, 0.45)), {}, LIU)
    assert wrong.status == "bad" and "lies OUTSIDE that bracket: DISAGREES" in " ".join(wrong.sentences)
    # without the sweep's config there is no exact edge to compare with, and the report says so
    bare = headline.headline("momentum", _momentum_sweep(), {}, {})
    assert "no exact edge theory" in " ".join(bare.sentences)


def test_momentum_report_leads_with_the_edge_on_its_first_part(tmp_path):
    """The page's first section is the headline with the edge, then the lead figure; the verdicts
    and the coverage map follow."""
    ds = _momentum_sweep()
    fits = fit_ensemble(ds, {"bootstrap": 0})
    page = build_report(ds, fits, _spec(LIU, "momentum"), figures_dir=tmp_path)
    first = page[page.index("<section id='lead'>"):page.index("</section>")]
    assert "the exact edge μ = 0.375" in _text(first) and 'id="fig-momentum_edge"' in first
    assert page.index("<section id='lead'>") < page.index("<section id='answer'>") < page.index("fig-coverage")
    assert "No fit applies to this sweep" in page and "No fit ran" not in page  # the headline answers it


def test_headline_states_measured_theory_and_agreement(tmp_path):
    """weight_var: the point of largest deviation with its measured value, SE and exact theory,
    measured/theory over the points and the joint bound; a theory off by 30 % disagrees."""
    ds = _ensemble(1.0)
    head = headline.headline("auto", ds, {}, {})
    z = (ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]
    worst = int(np.argmax(np.abs(z.values)))
    text = head.sentences[0]
    assert f"measured {headline.num(ds['weight_var'].values[worst])} ± " in text
    assert f"exact theory {headline.num(ds['weight_var_theory'].values[worst])}" in text
    bound = headline.joint_bound(ds.sizes["point"], 0.95)
    assert f"bound is {bound:.2f} SE: agrees" in text and head.status == "good"
    assert 2.9 < bound < 3.0  # 16 points at 95 %
    off = ds.copy()
    off["weight_var_theory"] = off["weight_var_theory"] * 1.3
    assert headline.headline("auto", off, {}, {}).status == "bad"


def test_theory_is_drawn_above_the_measurements():
    """The exact theory's lines (dashed) lie above the measured points and lines: the collapse's
    dashed theory was hidden under its solid measured lines."""
    ds = _ensemble(1.0)
    fits = fit_ensemble(ds, {"bootstrap": 0})
    compared = 0
    for fig in (figures.weight_var_against_ratio(ds), figures.collapse(ds, fits["linear_scaling"][0]),
                figures.against_axis(ds, "lr")):
        try:
            for ax in fig.axes:
                dashed = [line.get_zorder() for line in ax.lines if line.get_linestyle() == "--"]
                measured = [line.get_zorder() for line in ax.lines if line.get_linestyle() in ("-", "None")
                            and line.get_label().startswith("_")]
                if dashed and measured:
                    compared += 1
                    assert min(dashed) > max(measured), (ax.get_title(), dashed, measured)
        finally:
            figures.plt.close(fig)
    assert compared >= 3  # a panel of each figure


def test_no_panel_or_group_is_dropped_silently():
    """The coverage map draws a panel for each of 9 momentum values (its legend counts every
    point) and says how many it leaves out beyond its limit; the flatness figure draws every
    point's series."""
    ds = _with_momentum(_ensemble(1.0), values=tuple(np.round(np.linspace(0, 0.8, 9), 3)))
    fig = figures.coverage(ds)
    try:
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
        assert len(panels) == 9
        counts = [int(re.search(r"\((\d+)\)", t.get_text()).group(1)) for t in fig.legends[0].get_texts()]
        assert sum(counts) == ds.sizes["point"]
    finally:
        figures.plt.close(fig)
    many = _with_momentum(_ensemble(1.0), values=tuple(np.round(np.linspace(0, 0.9, 14), 3)))
    fig = figures.coverage(many)
    try:
        assert "2 of 14 panels not shown" in fig.get_suptitle()
    finally:
        figures.plt.close(fig)
    flat, results = _flatness_case(6)
    fig = spectra_figures.flatness(flat, results)
    try:
        assert len([line for line in fig.axes[0].lines if line.get_marker() == "o"]) == 6
        assert plotting.legend_entries(fig)["unlisted"] == []
    finally:
        figures.plt.close(fig)


def _flatness_case(n: int) -> tuple[xr.Dataset, list[dict]]:
    """``n`` points with variance ∝ curvature^(ψ/2) along 5 modes, and their flatness results."""
    k = np.geomspace(1, 100, 5)
    ds = xr.Dataset({"weight_cov_eigenvalues": (("point", "mode"), np.array([k ** (1 + 0.1 * i) for i in range(n)])),
                     "mode_curvature": (("point", "mode"), np.tile(k, (n, 1)))},
                    coords={"point": [f"p{i}" for i in range(n)]})
    results = [{"point": f"p{i}", "layer": "all", "group": {"samples_per_param": float(i + 2)},
                "params": {"psi": {"estimate": 2 + 0.2 * i, "interval": [1.9, 2.5], "theory": 2.0}}}
               for i in range(n)]
    return ds, results


def test_one_mode_spectrum_draws_its_theory():
    """A 1-D model's spectrum panel has one mode: its theory is a marker, not a line of one point."""
    ds = _momentum_sweep()
    ds["weight_cov_eigenvalues"] = (("point", "mode"), ds["weight_var"].values[:, None])
    ds["weight_cov_eigenvalues_theory"] = (("point", "mode"), ds["weight_var_theory"].values[:, None])
    fig = spectra_figures.spectra(ds)
    try:
        for ax in fig.axes:
            theory = [line for line in ax.lines if line.get_linestyle() == "--"]
            assert theory and all(line.get_marker() == "_" for line in theory)
        assert "of 7 points not shown" in fig.get_suptitle()  # 4 panels of the 7 stable points
    finally:
        figures.plt.close(fig)


def test_diverged_points_are_hollow_grey_markers_at_the_edge():
    """A diverged point is no measurement: a hollow grey triangle at the bottom edge (axes
    coordinates: no y value), listed in the legend as "diverged"."""
    ds = _ensemble(1.0)
    ds["diverged"] = ds["diverged"].copy(data=np.r_[True, np.zeros(15, bool)])
    for fig in (figures.weight_var_against_ratio(ds), figures.against_axis(ds, "lr")):
        try:
            ax = fig.axes[0]
            marks = [line for line in ax.lines if line.get_label() == figures.DIVERGED]
            assert marks, [line.get_label() for line in ax.lines]
            mark = marks[0]
            assert mark.get_marker() == "v" and mark.get_markerfacecolor() == "none"
            assert mark.get_markeredgecolor() == "0.45" and mark.get_transform() == ax.get_xaxis_transform()
            assert figures.DIVERGED in plotting.legend_entries(fig)["entries"]
        finally:
            figures.plt.close(fig)


def _figure_texts(fig) -> list[str]:
    out = [fig.get_suptitle()]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    return out


def test_labels_are_mathtext_without_pseudo_units():
    """Axis labels carry real units only (no [loss], [weight²], [1], [units]) and their symbols
    in mathtext ($\\lambda/S$, $\\mu$)."""
    ds = _ensemble(1.0)
    fits = fit_ensemble(ds, {"bootstrap": 0})
    drawn = [figures.weight_var_against_ratio(ds), figures.power_law(ds, fits["power_law"][0]),
             figures.collapse(ds, fits["linear_scaling"][0]), figures.against_axis(_two_layer_like(), "lr"),
             spectra_figures.spectra(_two_layer_like()), figures.coverage(_momentum_sweep())]
    try:
        texts = " ".join(t for fig in drawn for t in _figure_texts(fig))
        for pseudo in ("[1]", "[weight", "[loss", "[units]", "[gradient", "[learning"):
            assert pseudo not in texts, (pseudo, texts)
        assert r"$\lambda/S$" in drawn[0].axes[-1].get_xlabel()
        assert r"$\lambda$" in drawn[3].axes[-1].get_xlabel() and r"$\mu$" in drawn[5].axes[0].get_xlabel()
    finally:
        for fig in drawn:
            figures.plt.close(fig)
    assert plotting.axis_label({"long_name": "simulation time", "units": "s"}, "x") == "simulation time [s]"
    # a number in the model's units: CF units "1", the label shows the model's (steps), not "1" or "loss"
    steps = {"long_name": "escape time", "units": "1", "model_units": "steps"}
    assert plotting.axis_label(steps, "x") == "escape time [steps]"
    assert plotting.axis_label({"long_name": "loss", "units": "1", "model_units": "loss"}, "x") == "loss"
    assert plotting.axis_label({"long_name": "training loss", "units": "loss"}, "x") == "training loss"


def _png_dpi(data: bytes) -> float:
    """Pixels per inch from a PNG's pHYs chunk."""
    i = data.index(b"pHYs")
    per_metre, _, unit = struct.unpack(">IIB", data[i + 4:i + 13])
    assert unit == 1
    return per_metre * 0.0254


def test_figures_are_written_as_png_at_200_dpi_and_svg(tmp_path):
    """Every figure of the report is a PNG at 200 dpi (shown at half its pixel size) with an SVG
    of the same name beside it; every legend lists every labelled series; every table sits in a
    box that scrolls sideways."""
    ds = _ensemble(1.0)
    fits = fit_ensemble(ds, {"bootstrap": 0})
    legends: dict = {}
    page = build_report(ds, fits, _spec(), figures_dir=tmp_path, legends=legends)
    pngs = sorted(p.stem for p in tmp_path.glob("*.png"))
    assert pngs and pngs == sorted(p.stem for p in tmp_path.glob("*.svg"))
    for stem in pngs:
        data = (tmp_path / f"{stem}.png").read_bytes()
        assert round(_png_dpi(data)) == plotting.DPI == 200
        assert len(data) < 400_000, (stem, len(data))  # a few hundred kB at most
        assert b"<svg" in (tmp_path / f"{stem}.svg").read_bytes()[:400]
        width = struct.unpack(">I", data[16:20])[0]
        assert f'id="fig-{stem}"><img alt=' in page
        assert re.search(rf'id="fig-{stem}"><img alt="[^"]*" width="{round(width / 2)}"', page), stem
    assert set(legends) == set(pngs)
    assert all(v["unlisted"] == [] for v in legends.values()), legends
    assert page.count("<table") == page.count("<div class='scroll'><table")
    assert json.dumps(legends)


def test_isotropy_lead_compares_the_joint_eigenvalue_with_its_isotropic_value():
    """two_layer: the headline gives the mean stiff eigenvalue against λ⟨r²⟩/(2S) with the joint
    bound and the anisotropy; the figure draws each point's spectrum over the theory at integer
    modes and lists every point."""
    ds = _two_layer_like()
    n = ds.sizes["point"]
    theory = ds["weight_var"].values * 2
    ds["joint_eigenvalue_theory"] = ("point", theory)
    ds["joint_eigenvalue"] = ("point", theory * (1 + 0.01 * np.sin(np.arange(n))))
    ds["joint_eigenvalue_se"] = ("point", 0.02 * theory)
    ds["joint_anisotropy"] = ("point", np.full(n, 0.1))
    ds["range_cov_eigenvalues"] = (("point", "range_mode"), theory[:, None] * np.array([1.1, 1.0, 0.9, 0.95]))
    head = headline.headline("auto", ds, {}, {})
    text = " ".join(head.sentences)
    assert head.lead == "isotropy" and head.status == "good", text
    assert "against the leading-order isotropic value λ⟨r²⟩/(2S)" in text and "anisotropy" in text
    assert "DISAGREES" not in text  # a leading-order prediction is deviated from, never disagreed with
    _, _, make, args = head.figure
    fig = make(*args)
    try:
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "3", "4"]
        assert len([line for line in fig.axes[0].lines if line.get_marker() == "o"]) == n
        assert plotting.legend_entries(fig)["unlisted"] == []
    finally:
        figures.plt.close(fig)
