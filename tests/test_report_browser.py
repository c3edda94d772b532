"""The report in a real browser: headless Chromium (Debian's package, driven by playwright) loads
report.html without console errors, every image loads, and the first screen (1366×768) holds every
fit's headline numbers from fits.json.

Skipped, with the reason, where there is no Chromium (``apt-get install chromium``; ``.ci/run``
installs it) or no playwright (the ``test`` extra). Playwright's own browser downloads are never
used: it drives the system's Chromium through ``executable_path``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.verdict import HEADLINE, parameter_sentence
from sgdsweep.analysis.report import build_report

#: The first screen a reader sees (a common laptop display).
VIEWPORT = {"width": 1366, "height": 768}
#: Chromium as root in a container: no sandbox, no GPU, nothing fetched from the network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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


def _visit(browser, report: Path) -> dict:
    """Open ``report`` at :data:`VIEWPORT`: console errors, page errors, every image's load state,
    and the text of every verdict line with whether it lies wholly inside the first screen."""
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(report.as_uri(), wait_until="load")
    images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
    lines = page.evaluate("""() => Array.from(document.querySelectorAll('#answer li')).map(li => {
        const r = li.getBoundingClientRect();
        return [li.innerText, r.top >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth];
    })""")
    page.close()
    return {"errors": errors, "images": images, "lines": lines}


def _report(ds, tmp_path: Path) -> tuple[Path, dict]:
    """fits.json and report.html of ``ds`` written as the workflow writes them."""
    fits = json.loads(json.dumps(fit_ensemble(ds, {"confidence": 0.95, "bootstrap": 200})))
    (tmp_path / "fits.json").write_text(json.dumps(fits))
    spec = {"report": {"title": "browser test"}, "config": {"sweep": "browser"}, "config_hash": "abc"}
    path = tmp_path / "report.html"
    path.write_text(build_report(ds, fits, spec, figures_dir=tmp_path / "figures"), encoding="utf-8")
    return path, fits


def _sweeps():
    from test_report import _ensemble, _two_layer_like

    return {"default-like": _ensemble(1.0), "two-layer-like": _two_layer_like()}


@pytest.mark.parametrize("name", ["default-like", "two-layer-like"])
def test_report_renders_in_chromium_with_the_answer_on_the_first_screen(browser, tmp_path, name):
    path, _ = _report(_sweeps()[name], tmp_path)
    seen = _visit(browser, path)
    assert seen["errors"] == []
    assert seen["images"] and all(complete and width > 0 for _, complete, width in seen["images"]), seen["images"]
    first_screen = [text for text, inside in seen["lines"] if inside]
    fits = json.loads((tmp_path / "fits.json").read_text())  # what the workflow's fits.json says
    expected = [parameter_sentence(p, res["params"][p]) for kind, names in HEADLINE.items()
                for res in fits.get(kind, []) for p in names if (res.get("params") or {}).get(p)]
    assert expected
    for sentence in expected:
        assert any(sentence in text for text in first_screen), (sentence, first_screen)
