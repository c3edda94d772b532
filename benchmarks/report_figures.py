"""Seconds the report's figures take: each figure made and turned into its PNG (with ``--svg``, its
PNG and SVG, as a report that writes its figures does) as the report does it
(``sgdsweep.analysis.report._png``: :func:`sgdsweep.analysis.plotting.render`), serially, in one process.

The figures are the ones :func:`sgdsweep.analysis.report.build_report` draws for a finished sweep (its
results directory: ``ensemble.zarr``, ``fits.json``, ``plan/report.json``; for instance one kept
by ``python benchmarks/pipeline.py --keep DIR``). Each round draws every figure once; printed: the
best CPU seconds of each figure over the rounds and their sum (drawing is single-threaded: on an
idle machine, the wall time; on a shared one, steadier than it). Run it from another checkout's
root to time that checkout's figures on the same sweep.

    python benchmarks/report_figures.py RESULTS_DIR [--rounds 3] [--svg]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import xarray as xr

from sgdsweep.analysis import report


def figure_calls(results: Path) -> list:
    """The (make, args) of every figure the report of ``results`` draws, in the report's order."""
    calls: list = []
    render = report._render
    report._render = lambda todo, pool, svg=False: (calls.extend(todo), [None] * len(todo))[1]
    try:
        ds = xr.open_zarr(results / "ensemble.zarr").load()
        report.build_report(ds, json.loads((results / "fits.json").read_text()),
                            json.loads((results / "plan" / "report.json").read_text()), None)
    finally:
        report._render = render
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a sweep's results directory (ensemble.zarr, fits.json, plan/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--svg", action="store_true", help="each figure's SVG too (a report with --figures)")
    args = ap.parse_args()
    for need in ("ensemble.zarr", "fits.json", "plan/report.json"):
        if not (args.results / need).exists():
            raise SystemExit(f"{args.results}: no {need}; give a finished sweep's results directory "
                             "(e.g. one kept by benchmarks/pipeline.py --keep DIR)")
    calls = figure_calls(args.results)
    best: dict[int, float] = {}
    drawn: set[int] = set()
    for _ in range(args.rounds):
        for i, (make, fargs) in enumerate(calls):
            t0 = time.process_time()
            if report._png(make, fargs, args.svg) is not None:
                drawn.add(i)
            best[i] = min(best.get(i, float("inf")), time.process_time() - t0)
    what = "PNG and SVG" if args.svg else "PNG"
    print(f"{len(drawn)} figures of {args.results} ({len(calls)} asked for), drawn serially as {what}, "
          f"best of {args.rounds} rounds, CPU seconds:")
    for i in sorted(drawn):
        print(f"  {calls[i][0].__name__:24s} {best[i]:6.3f}")
    print(f"  {'total':24s} {sum(best.values()):6.3f}")


if __name__ == "__main__":
    main()
