"""The report's figures drawn once and cut (:func:`sgdsweep.figures.tight_png`) against
``savefig(bbox_inches="tight")``, which draws each figure twice, in the same process.

The figures are the ones :func:`sgdsweep.report.build_report` draws for a finished sweep (its
results directory: ``ensemble.zarr``, ``fits.json``, ``plan/report.json``; for instance one kept
by ``python benchmarks/pipeline.py --keep DIR``). Each round draws every figure both ways, one
after the other, serially; printed: the best seconds of each over the rounds, their ratio, how
many figures took the second drawing (an artist outside the figure), and the largest difference
in image size (pixels).

    python benchmarks/report_figures.py RESULTS_DIR [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import xarray as xr
from PIL import Image

from sgdsweep import figures, report


def figure_calls(results: Path) -> list:
    """The (make, args) of every figure the report of ``results`` draws."""
    calls: list = []
    render = report._render
    report._render = lambda todo, pool: (calls.extend(todo), [None] * len(todo))[1]
    try:
        ds = xr.open_zarr(results / "ensemble.zarr").load()
        report.build_report(ds, json.loads((results / "fits.json").read_text()),
                            json.loads((results / "plan" / "report.json").read_text()), None)
    finally:
        report._render = render
    return calls


def savefig_tight(fig) -> bytes:
    """The baseline: matplotlib's tight box, measured by a first drawing."""
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100, bbox_inches="tight")
    return out.getvalue()


def draw_all(calls: list, to_png) -> tuple[float, list[bytes]]:
    """Seconds to draw every figure of ``calls`` as ``to_png`` makes PNGs, and the PNGs."""
    pngs = []
    t0 = time.perf_counter()
    for make, args in calls:
        fig = make(*args)
        if fig is None:
            continue
        try:
            pngs.append(to_png(figures.plain_log_labels(fig)))
        finally:
            figures.plt.close(fig)
    return time.perf_counter() - t0, pngs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a sweep's results directory (ensemble.zarr, fits.json, plan/)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for need in ("ensemble.zarr", "fits.json", "plan/report.json"):
        if not (args.results / need).exists():
            raise SystemExit(f"{args.results}: no {need}; give a finished sweep's results directory "
                             "(e.g. one kept by benchmarks/pipeline.py --keep DIR)")
    calls = figure_calls(args.results)
    redrawn = []
    original = figures.plt.Figure.savefig

    def counted(fig, *a, **kw):
        redrawn.append(1)
        return original(fig, *a, **kw)

    best = {"savefig tight": float("inf"), "tight_png": float("inf")}
    for _ in range(args.rounds):
        seconds, old = draw_all(calls, savefig_tight)
        best["savefig tight"] = min(best["savefig tight"], seconds)
        redrawn.clear()
        figures.plt.Figure.savefig = counted
        try:
            seconds, new = draw_all(calls, figures.tight_png)
        finally:
            figures.plt.Figure.savefig = original
        best["tight_png"] = min(best["tight_png"], seconds)
    sizes = [(Image.open(io.BytesIO(a)).size, Image.open(io.BytesIO(b)).size) for a, b in zip(old, new)]
    worst = max(max(abs(p - q) for p, q in zip(sa, sb)) for sa, sb in sizes)
    print(f"{len(old)} figures of {args.results}, drawn serially, best of {args.rounds} rounds")
    for name, seconds in best.items():
        print(f"  {name:14s} {seconds:6.2f} s")
    print(f"  ratio {best['savefig tight'] / best['tight_png']:.2f}; {len(redrawn)} figures drawn a second time "
          f"(an artist outside the figure); image sizes differ by at most {worst} px")


if __name__ == "__main__":
    main()
