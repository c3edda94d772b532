"""The report's cost at 10^3 and at 10^4 points: :func:`sgdsweep.analysis.report.build_report`
timed in-process (CPU seconds of this process and wall seconds, figures drawn serially, PNG
and SVG written), on an ensemble of 10^4 points and on 10^3 of its points
(``ds.isel(point=…)``: the points at every ``--every``-th value of the first swept axis, a
grid of the same shape with fewer values of that axis), each with its own fits
(:func:`sgdsweep.analysis.fit.fit_ensemble`, not timed). A report of a few points is built first
and not timed, so that neither timed one pays the imports and the caches of fonts and mathtext.
Printed: seconds, the HTML's size, and the ratio of the 10^4-point report to the 10^3-point one
(the target is at most 2).

The sweep is any finished one with about 10^4 points (its results directory: ``ensemble.zarr``
and ``plan/by-content/{fit,report}.*.json``), e.g. a linear sweep of 100 ``lr`` × 10
``momentum`` × 10 ``batch_size`` values (``steps: 400``, ``replicas: 8``).

    python benchmarks/report_scale.py RESULTS_DIR [--every 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.report import build_report
from sgdsweep.store.aggregate import load_ensemble


def _spec(results: Path, kind: str) -> dict:
    return json.loads(next((results / "plan" / "by-content").glob(f"{kind}.*.json")).read_text())


def timed(ds, fit_spec: dict, report_spec: dict) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, HTML bytes) of one report of ``ds`` (its fits made first)."""
    fits = fit_ensemble(ds, fit_spec)
    with tempfile.TemporaryDirectory() as figs:
        wall, cpu = time.perf_counter(), time.process_time()
        page = build_report(ds, fits, report_spec, figs)
        return time.process_time() - cpu, time.perf_counter() - wall, len(page.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a finished sweep's results directory (about 10^4 points)")
    parser.add_argument("--every", type=int, default=10, help="keep every n-th value of the first swept axis")
    args = parser.parse_args()
    ds = load_ensemble(str(args.results / "ensemble.zarr")).load()
    fit_spec, report_spec = _spec(args.results, "fit"), _spec(args.results, "report")
    n = ds.sizes["point"]
    axis = json.loads(ds.attrs["swept_axes"])[0]
    small = ds.isel(point=np.flatnonzero(np.isin(ds[axis].values, np.unique(ds[axis].values)[::args.every])))
    timed(small.isel(point=slice(0, 20)), fit_spec, report_spec)  # warm: imports, fonts, mathtext
    rows = {}
    for name, part in (("small", small), ("large", ds)):
        cpu, wall, size = timed(part, fit_spec, report_spec)
        rows[name] = cpu
        print(f"{part.sizes['point']:>6} points: report {cpu:7.1f} s CPU, {wall:7.1f} s wall, HTML {size / 1e6:.2f} MB",
              flush=True)
    print(f"ratio {n} / {small.sizes['point']} points (CPU): {rows['large'] / rows['small']:.2f}")


if __name__ == "__main__":
    main()
