"""The report in a real browser: headless Chromium (Debian's package, driven by playwright) loads
report.html without console errors, every image loads, nothing is wider than the window, and the
first screen (1366×768, no scrolling) holds the headline on the sweep's question with its numbers
and the top of the figure that answers it; the fits' verdicts follow.

One small run of every family of shipped configs (``FAMILIES``: each lead, each model kind) goes
through plan, simulation, aggregation, fits and report in-process, shrunk to run in seconds.

Skipped, with the reason, where there is no Chromium (``apt-get install chromium``; ``.ci/run``
installs it) or no playwright (the ``test`` extra). Playwright's own browser downloads are never
used: it drives the system's Chromium through ``executable_path``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.verdict import HEADLINE, MAX_LISTED, judge, parameter_sentence
from sgdsweep.analysis.report import build_report, figure_pool

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: The first screen a reader sees (a common laptop display).
VIEWPORT = {"width": 1366, "height": 768}
#: Chromium as root in a container: no sandbox, no GPU, nothing fetched from the network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

#: One shipped config per family (its report.lead, its model kind), shrunk to seconds: the lead
#: it must resolve to, and the changes (``section.key`` or a top-level key) that shrink it.
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "default": ("config/config.yaml", "weight_var", {
        "grid.lr": [0.1, 0.4], "grid.batch_size": [2, 8], "dynamics.steps": 3000, "dynamics.burn_in": 1000,
        "dynamics.replicas": 16}),
    "momentum": ("config/sweeps/liu2021_momentum.yaml", "momentum", {
        "grid.momentum": [0.3, 0.35, 0.4, 0.5, 0.7, 0.9], "dynamics.steps": 3000, "dynamics.replicas": 32}),
    "loss": ("config/sweeps/liu2021_loss.yaml", "loss", {
        "grid.lr": [0.3, 1.0, 1.8], "grid.noise": "gaussian", "dynamics.steps": 3000, "dynamics.replicas": 16}),
    "escape": ("config/sweeps/double_well_exact_escape.yaml", "escape", {
        "grid.lr": [0.18, 0.27, 0.36], "grid.batch_size": [8, 12, 16], "dynamics.steps": 20000,
        "dynamics.replicas": 32}),
    "isotropy": ("config/models/two_layer.yaml", "isotropy", {
        "grid.lr": [0.02, 0.04], "grid.hidden_width": [2, 3], "dynamics.steps": 4000, "dynamics.replicas": 8}),
    "flatness": ("config/sweeps/gross2024_flatness.yaml", "flatness", {
        "grid.lr": 0.1, "dynamics.steps": 6000, "dynamics.replicas": 4}),
    "wigner": ("config/sweeps/park2024_matrix.yaml", "wigner", {
        "grid.batch_size": [4, 16], "points": [{"lr": 0.4, "batch_size": 16}], "dynamics.steps": 1000,
        "dynamics.replicas": 32}),
    "fdr": ("config/sweeps/han2021_fdr.yaml", "fdr", {
        "grid.lr": [0.002, 0.004], "dynamics.steps": 3000, "dynamics.burn_in": 1000, "dynamics.replicas": 4}),
    "spectrum": ("config/sweeps/gross2024_spectrum.yaml", "spectrum", {
        "grid.samples_per_param": [2.0, 4.0], "dynamics.steps": 6000, "dynamics.burn_in": 2000,
        "dynamics.replicas": 8}),
    "noise_types": ("config/models/linear_noise_types.yaml", "weight_var", {
        "dynamics.steps": 3000, "dynamics.replicas": 8}),
}


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it as root)")
    return path


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e '.[test]')")
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def pool():
    """Two processes drawing every family's figures (the test machine's cores)."""
    workers = figure_pool(2)
    yield workers
    if workers is not None:
        workers.shutdown()


def _visit(browser, report: Path) -> dict:
    """Open ``report`` at :data:`VIEWPORT`: console errors, page errors, every image's load state,
    the page's and the window's widths, the headline's text and box, the lead figure's box, and
    the text of every verdict line with whether it lies wholly inside the first screen."""
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(report.as_uri(), wait_until="load")
    seen = page.evaluate("""() => {
        const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
                           return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; };
        const h = document.querySelector('#lead .headline');
        return {
          images: Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth]),
          scrollWidth: document.scrollingElement.scrollWidth, innerWidth: window.innerWidth,
          innerHeight: window.innerHeight, headline: h ? h.innerText : null, headlineBox: box(h),
          leadFigure: box(document.querySelector('#lead figure')),
          lines: Array.from(document.querySelectorAll('#answer li')).map(li => li.innerText),
        };
    }""")
    page.close()
    return {"errors": errors, **seen}


def _first_screen(box: dict | None, seen: dict) -> bool:
    return box is not None and box["top"] >= 0 and box["bottom"] <= seen["innerHeight"] \
        and box["right"] <= seen["innerWidth"]


def _shrunk(path: str, changes: dict, results: Path) -> dict:
    cfg = yaml.safe_load((REPO / path).read_text())
    for key, value in changes.items():
        section, _, option = key.rpartition(".")
        (cfg.setdefault(section, {}) if section else cfg)[option or key] = value
    cfg["results_dir"] = str(results)
    return cfg


def _family_report(name: str, tmp: Path, pool) -> tuple[Path, dict, dict, str]:
    """The family's shrunk config run in-process (plan, simulate, aggregate, fit) and its report
    written as the workflow writes it: (report path, fits, legends of every figure, the lead it
    resolved to)."""
    from sgdsweep.run.execute import make_batches
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store.aggregate import build_ensemble
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.lead import resolve
    from sgdsweep.sweep.plan import write_plan

    path, _, changes = FAMILIES[name]
    sweep = build_sweep(_shrunk(path, changes, tmp))
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 16):
        simulate_points(batch, str(files.points_dir))
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    fits = json.loads(json.dumps(fit_ensemble(ds, sweep.config["fit"])))
    spec = json.loads(files.report_spec.read_text())
    legends: dict = {}
    report = tmp / "report.html"
    report.write_text(build_report(ds, fits, spec, pool=pool, legends=legends), encoding="utf-8")
    return report, fits, legends, resolve(spec["report"]["lead"], ds, fits)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_answers_its_question_on_the_first_screen(browser, pool, tmp_path, name):
    """Per family: no errors, every image loads, no sideways scrolling of the page, the headline
    (naming the lead's measured and theory values) wholly inside the first screen with the top of
    the lead figure below it, every labelled series of every figure in a legend."""
    report, fits, legends, lead = _family_report(name, tmp_path, pool)
    assert lead == FAMILIES[name][1]
    seen = _visit(browser, report)
    assert seen["errors"] == []
    assert seen["images"] and all(complete and width > 0 for _, complete, width in seen["images"]), seen["images"]
    assert seen["scrollWidth"] <= seen["innerWidth"], (seen["scrollWidth"], seen["innerWidth"])
    assert _first_screen(seen["headlineBox"], seen), (seen["headlineBox"], seen["headline"])
    assert seen["leadFigure"] is not None and seen["leadFigure"]["top"] < seen["innerHeight"] / 2
    assert "measured" in seen["headline"] or "=" in seen["headline"], seen["headline"]
    assert {k: v["unlisted"] for k, v in legends.items() if v["unlisted"]} == {}
    expected = [judge(kind, res).sentences[0] for kind in HEADLINE
                if len(fits.get(kind, [])) <= MAX_LISTED  # (more groups: one summary verdict)
                for res in fits.get(kind, []) if res.get("params") and not res.get("error")]
    for sentence in expected:  # every fit's headline numbers in its verdict, after the lead
        assert any(sentence in text for text in seen["lines"]), (sentence, seen["lines"])
    if name == "momentum":  # the exact edge μ = λk/2 − 1 = 0.375 lies in the measured bracket
        assert "the exact edge μ = 0.375" in seen["headline"] and "inside that bracket: agrees" in seen["headline"]
    if name == "default":  # the power law's exponents with their intervals on the first screen
        a = fits["power_law"][0]["params"]["a"]
        assert parameter_sentence("a", a) in seen["headline"]
