"""Fits with the previous fits of unchanged groups (``.fit-cache``) against fits from nothing:
:func:`sgdsweep.analysis.fit.fit_ensemble` timed in-process on a finished sweep's ensemble, in
three cases per round:

- ``full``: no cache (every group fitted: the cost without the cache);
- ``grown``: the cache holds the fits of the ensemble without the last value of ``--axis``
  (made before, not timed), as after a run of the sweep before that value was added; the groups
  of the new value and the fits over every value are fitted;
- ``unchanged``: the same ensemble again.

Printed: seconds per case per round, the medians, and each median's ratio to ``full``. The
sweep is any finished one swept over ``--axis`` (its results directory: ``ensemble.zarr`` and
``plan/fit.json``), e.g. ``benchmarks/scale.py``'s ``1e4`` case (100 lr × 10 momentum × 10
batch_size).

    python benchmarks/fit_cache.py RESULTS_DIR [--axis momentum] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.cache import FitCache
from sgdsweep.store.aggregate import load_ensemble


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--axis", default="momentum")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    ds = load_ensemble(args.results / "ensemble.zarr")
    spec = json.loads((args.results / "plan" / "fit.json").read_text())
    last = np.unique(ds[args.axis].values)[-1]
    before = ds.isel(point=np.flatnonzero(ds[args.axis].values != last))
    print(f"{ds.sizes['point']} points; without {args.axis} = {last}: {before.sizes['point']}")
    times: dict[str, list[float]] = {"full": [], "grown": [], "unchanged": []}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            fresh = fit_ensemble(ds, spec)
            times["full"].append(time.perf_counter() - t0)
            primed = FitCache(tmp)
            fit_ensemble(before, spec, primed)
            primed.save()
            for case in ("grown", "unchanged"):
                t0 = time.perf_counter()
                cache = FitCache(tmp)  # read, fits, written: as the fit job does
                fits = fit_ensemble(ds, spec, cache)
                cache.save()
                times[case].append(time.perf_counter() - t0)
                assert json.dumps(fits) == json.dumps(fresh), "fits with the cache differ from fits without"
                print(f"round {r + 1} {case}: {cache.made} group fits made, {cache.reused} taken from the cache")
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    base = statistics.median(times["full"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:>10}: median {med:6.2f} s   ratio to full {med / base:.2f}")


if __name__ == "__main__":
    main()
