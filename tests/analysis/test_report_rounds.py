"""The report's account of sweeps run in rounds: the status line, the "Rounds" section of a
precision sweep and the "Stability edge" section of an edge search (sgdsweep/analysis/rounds.py)."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.report import build_report
from sgdsweep.analysis.rounds import edge_figure, theory_edge
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import points as point_store
from sgdsweep.store.aggregate import build_ensemble
from sgdsweep.sweep.config import Sweep, build_sweep
from sgdsweep.sweep.plan import PlanFiles, plan_texts

LINEAR = {"kind": "linear", "n_inputs": 4, "label_noise": 0.5}

PRECISE: dict[str, Any] = {
    "sweep": "precise",
    "seed": 3,
    "model": LINEAR,
    "dynamics": {"steps": 3000, "replicas": 8},
    "grid": {"lr": [0.2, 0.4], "batch_size": 2, "samples_per_param": 10},
    "precision": {"observables": {"weight_var": {"rel_se": 0.02}}},
    "execution": {"workers": 1},
}

EDGE: dict[str, Any] = {
    "sweep": "edge",
    "seed": 3,
    "model": LINEAR,
    "dynamics": {"steps": 2000, "replicas": 16, "burn_in": 0},
    "grid": {"lr": [0.05, 3.0], "batch_size": 2, "samples_per_param": 10, "noise": "gaussian"},
    "search": {"edge": "lr", "tolerance": 0.01},
    "execution": {"workers": 1},
}


def config(base: dict[str, Any], root: Path, **sections: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg["results_dir"] = str(root / "results")
    cfg.update(sections)
    return cfg


def run_rounds(cfg: dict[str, Any], limit: int = 40) -> Sweep:
    """Simulate the sweep's rounds in this process, as `sgdsweep run` does through Snakemake."""
    for _ in range(limit):
        sweep = build_sweep(cfg)
        points = sweep.directory / "points"
        todo = [p.spec() for p in sweep.points if not point_store.is_complete(point_store.point_path(points, p.hash))]
        if not todo:
            return sweep
        for batch in make_batches(todo, 4):
            simulate_points(batch, str(points))
    raise AssertionError("the rounds did not end")


def report_of(sweep: Sweep, figures_dir: Path | None = None, legends: dict | None = None) -> str:
    """The HTML report of ``sweep`` at its current round, built from its plan files' content
    (``legends``: filled with each drawn figure's legend entries, by name)."""
    files = PlanFiles(sweep.directory)
    texts = plan_texts(sweep)
    ds = build_ensemble(json.loads(texts[files.sweep_spec]))
    fits = fit_ensemble(ds, json.loads(texts[files.fit_spec]))
    return build_report(ds, fits, json.loads(texts[files.report_spec]), figures_dir, legends=legends)


@pytest.fixture
def no_figures(monkeypatch):
    """Reports built without drawing their figures (each placeholder left empty), for the tests
    that read only the report's text and tables: the figures of precision and edge-search
    ensembles are drawn by test_an_edge_search_over_momentum_draws_the_edge_against_it and the
    workflow's precision run (tests/sweep/test_precision.py)."""
    from sgdsweep.analysis import report

    monkeypatch.setattr(report, "_render", lambda todo, pool, svg=False: [None] * len(todo))


@pytest.fixture
def edge_figure_only(monkeypatch):
    """Reports that draw the stability-edge figure (:func:`edge_figure`) and leave the others'
    placeholders empty."""
    from sgdsweep.analysis import report

    monkeypatch.setattr(report, "_render", lambda todo, pool, svg=False: [
        report._png(make, args, svg) if make is edge_figure else None for make, args in todo])


def text_of(page: str) -> str:
    """The page's text: inline tags dropped, the others replaced by a space."""
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"</?(b|span)\b[^>]*>", "", page)))


def test_a_precision_report_shows_each_points_spend_status_and_targets(tmp_path, no_figures):
    sweep = run_rounds(config(PRECISE, tmp_path))
    info = sweep.rounds
    assert all(p["status"] == "met" for p in info["points"].values())
    assert any(p["rounds"] >= 1 for p in info["points"].values()), "the target must need an extension"
    page = report_of(sweep)
    text = " ".join(text_of(page).split())
    rounds = f"{info['round']} extension round" + ("s" if info["round"] != 1 else "")
    assert (f"Precision: 2 of 2 points met every target; {rounds}; "
            f"{info['replica_steps']:.3g} replica-steps.") in text
    assert "<h2 id='rounds'>Rounds</h2>" in page
    assert page.index("What the fits found") < page.index("Precision: 2 of 2") < page.index("<h2>Fits</h2>")
    for h, p in info["points"].items():
        row = next(r for r in page.split("<tr>") if r.startswith(f"<td>{h[:10]}</td>"))
        assert "<span class='good'>met</span>" in row
        assert f"<td>{p['replicas']}</td><td>{p['steps']}</td><td>{p['rounds']}</td>" in row
        assert f"{p['replica_steps']:.3g}" in row
        assert re.search(r"rel SE \d[\d.]* % ≤ 2 %", row)  # the measured rel SE against its target
        for step in p["history"]:
            assert html.escape(step["reasons"][0]) in row
    assert "weight_var (rel SE ≤ 2 %): met at 2 points" in text
    assert "Stability edge" not in page


def test_a_precision_report_names_the_budget_that_stopped_each_point(tmp_path, no_figures):
    cfg = config(PRECISE, tmp_path, precision={"observables": {"weight_var": {"rel_se": 0.001}},
                                               "budget": {"max_replicas": 40}})
    sweep = run_rounds(cfg)
    page = report_of(sweep)
    text = " ".join(text_of(page).split())
    assert "Precision: 0 of 2 points met every target; 2 stopped at the budget (max_replicas = 40);" in text
    assert "<b class='bad'>Precision:" in page
    assert page.count("<span class='bad'>budget: max_replicas = 40</span>") == 2
    assert "weight_var (rel SE ≤ 0.1 %): met at 0 points; not met at 2 (budget: max_replicas = 40: λ = 0.2; λ = 0.4)" \
        in text
    assert re.search(r"rel SE \d[\d.]* % &gt; 0.1 %", page)


@pytest.fixture(scope="module")
def edge_search(tmp_path_factory) -> Sweep:
    return run_rounds(config(EDGE, tmp_path_factory.mktemp("edge")))


def test_an_edge_search_report_shows_the_bracket_beside_the_exact_theory(edge_search, edge_figure_only):
    (group,) = edge_search.rounds["groups"]
    assert group["status"] == "found"
    theory = theory_edge(group["params"], "lr")["value"]
    page = report_of(edge_search)
    text = " ".join(text_of(page).split())
    assert edge_search.rounds["round"] > 1
    assert (f"Edge search (λ): edge found for 1 of 1 combination; {edge_search.rounds['round']} bisection rounds; "
            f"{edge_search.rounds['replica_steps']:.3g} replica-steps.") in text
    assert "<h2 id='stability-edge'>Stability edge</h2>" in page
    row = next(r for r in page.split("<tr>") if "<span class='good'>found</span>" in r)
    ratio = (group["stable"] + group["unstable"]) / 2 / theory
    assert (f"<td>{group['stable']:.4g}</td><td>{group['unstable']:.4g}</td><td>{theory:.4g}</td>"
            f"<td>{ratio:.4g}</td>") in row
    assert abs(ratio - 1) < 0.01  # gaussian noise: the almost-sure edge is the mean-square one
    assert "The measured edge is the almost-sure one" in text and "exceeds 1 there" in text
    assert "crossed the divergence threshold" in text and "Criterion: top Lyapunov exponent" in text
    assert "at or above it (the almost-sure" not in text  # no claim that replicas diverge only above it
    assert 'id="fig-stability_edge"' not in page  # one combination: the table says it all
    assert "<h2 id='rounds'>" not in page


def test_a_report_without_rounds_has_no_rounds_sections(tmp_path, no_figures):
    cfg = config(PRECISE, tmp_path)
    del cfg["precision"]
    sweep = run_rounds(cfg)
    page = report_of(sweep)
    for absent in ("Precision:", "Edge search", "id='rounds'", "id='stability-edge'"):
        assert absent not in page


def test_the_edge_figure_draws_the_bracket_and_theory_against_the_other_axis():
    rows = [{"key": (0.0,), "stable": 1.0, "unstable": 1.1, "theory": 1.05},
            {"key": (0.5,), "stable": 1.5, "unstable": None, "theory": 1.4},
            {"key": (0.9,), "stable": None, "unstable": 0.2, "theory": None}]
    fig = edge_figure(rows, "lr", ["momentum"])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "μ" and ax.get_ylabel() == "edge λ"
    lines = {line.get_label(): line for line in ax.get_lines()}
    theory = lines["exact mean-square edge"]
    assert list(theory.get_xdata()) == [0.0, 0.5] and list(theory.get_ydata()) == [1.05, 1.4]
    (bar,) = ax.containers  # the closed bracket: one error bar from 1.0 to 1.1
    segment = bar.lines[2][0].get_segments()[0]
    assert segment[0][1] == pytest.approx(1.0) and segment[1][1] == pytest.approx(1.1)
    assert edge_figure(rows[:1], "lr", ["momentum"]) is None  # one combination: no empty panel
    assert edge_figure(rows, "lr", []) is None


def test_an_edge_search_over_momentum_draws_the_edge_against_it(tmp_path):
    grid = {**EDGE["grid"], "momentum": [0.0, 0.5]}
    sweep = run_rounds(config(EDGE, tmp_path, grid=grid))
    groups = sweep.rounds["groups"]
    assert [g["status"] for g in groups] == ["found", "found"]
    legends: dict = {}
    page = report_of(sweep, legends=legends)  # no figure files: no SVG drawn
    assert 'id="fig-stability_edge"' in page and "stability_edge" in legends
    assert "edge found for 2 of 2 combinations" in " ".join(text_of(page).split())
    for g in groups:  # one row per momentum, with the theory's edge at that momentum
        theory = theory_edge(g["params"], "lr")["value"]
        assert f"<tr><td>{g['axes']['momentum']:.4g}</td><td>{g['stable']:.4g}</td><td>{g['unstable']:.4g}</td>" \
               f"<td>{theory:.4g}</td>" in page


def test_a_precision_report_gives_each_fit_target_its_measured_half_width(tmp_path, no_figures):
    grid = {"lr": [0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10}
    cfg = config(PRECISE, tmp_path, grid=grid, precision={"observables": {"weight_var": {"rel_se": 0.02}},
                                                           "fits": {"power_law.a": 100, "power_law.b": 1e-6}})
    sweep = run_rounds(cfg)
    files = PlanFiles(sweep.directory)
    texts = plan_texts(sweep)
    ds = build_ensemble(json.loads(texts[files.sweep_spec]))
    fits = fit_ensemble(ds, json.loads(texts[files.fit_spec]))
    (fit,) = fits["power_law"]
    text = " ".join(text_of(build_report(ds, fits, json.loads(texts[files.report_spec]))).split())
    for name, met in (("a", 1), ("b", 0)):
        low, high = fit["params"][name]["interval"]
        goal = "100" if name == "a" else "1e-06"
        assert (f"power_law.{name} interval half-width ≤ {goal}: met in {met} of 1 group "
                f"(widest {(high - low) / 2:.3g})") in text


def test_a_precision_report_shows_a_swept_noise_type(tmp_path, no_figures):
    """Axis values that are strings (the noise type) appear in the table like numbers."""
    grid = {"lr": 0.2, "batch_size": 2, "samples_per_param": 10, "noise": ["minibatch", "gaussian"]}
    sweep = run_rounds(config(PRECISE, tmp_path, grid=grid))
    page = report_of(sweep)
    rows = [r for r in page.split("<tr>") if any(r.startswith(f"<td>{h[:10]}</td>") for h in sweep.rounds["points"])]
    assert len(rows) == 2
    assert any("<td>minibatch</td>" in r for r in rows) and any("<td>gaussian</td>" in r for r in rows)


def test_a_momentum_edge_stable_above_is_compared_with_the_theorys_lower_edge(tmp_path):
    """On the quadratic at λk = 2.75 momentum is stable above μ = λk/2 − 1 = 0.375 (Liu et al.
    Cor. 1): the report sets the measured edge beside that value, not beside 'no upper edge'."""
    cfg = config(EDGE, tmp_path, model={"kind": "quadratic", "curvatures": [1.0], "noise_cov": [1.0]},
                 dynamics={"steps": 3000, "replicas": 16, "burn_in": 0},
                 grid={"lr": 2.75, "batch_size": 1, "momentum": [0.1, 0.6], "noise": "gaussian"},
                 search={"edge": "momentum", "tolerance": 0.02})
    sweep = run_rounds(cfg)
    page = report_of(sweep)
    (row,) = [r for r in page.split("<tr>")[1:] if "found" in r]
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells[2] == "0.375"  # the exact theory's edge column
    assert abs(float(cells[3]) - 1) < 0.03  # bracket midpoint / theory: additive noise, the edges coincide
