"""A report rebuilt with the previous report's figures (``.figure-cache``) against one drawn from
nothing: the report job's command, ``python -m sgdsweep report … --jobs N --figure-cache DIR``,
timed as a fresh process (what the workflow runs), in three cases per round:

- ``full``: an empty cache (every figure drawn: the cost without the cache);
- ``new title``: the same inputs but ``report.title`` (no figure changes);
- ``new fits``: fits made with another confidence (the fits' figures change, the ensemble's not;
  the fits are made before, not timed).

Printed: seconds of each case per round, their medians and the ratio of each to ``full``. The
sweep is any finished one (its results directory: ``ensemble.zarr``, ``fits.json`` and
``plan/report.json``).

    python benchmarks/report_rebuild.py RESULTS_DIR [--rounds 3] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def report(results: Path, fits: Path, spec: Path, cache: Path, out: Path, jobs: int) -> float:
    """Wall seconds of one ``sgdsweep report`` process."""
    cmd = [sys.executable, "-m", "sgdsweep", "report", "--ensemble", str(results / "ensemble.zarr"),
           "--fits", str(fits), "--spec", str(spec), "--out", str(out / "report.html"),
           "--figures", str(out / "figures"), "--jobs", str(jobs), "--figure-cache", str(cache)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.store.aggregate import load_ensemble

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = json.loads((args.results / "plan" / "report.json").read_text())
        (tmp / "spec.json").write_text(json.dumps(spec))
        (tmp / "titled.json").write_text(json.dumps({**spec, "report": {**spec["report"], "title": "Renamed"}}))
        fits = json.loads((args.results / "fits.json").read_text())
        settings = {**fits.get("settings", {}), "confidence": 0.9}
        refit = fit_ensemble(load_ensemble(args.results / "ensemble.zarr"), settings)
        (tmp / "refit.json").write_text(json.dumps(refit))
        times: dict[str, list[float]] = {"full": [], "new title": [], "new fits": []}
        for r in range(args.rounds):
            cache = tmp / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            full = report(args.results, args.results / "fits.json", tmp / "spec.json", cache, tmp / "a", args.jobs)
            titled = report(args.results, args.results / "fits.json", tmp / "titled.json", cache, tmp / "b", args.jobs)
            refitted = report(args.results, tmp / "refit.json", tmp / "spec.json", cache, tmp / "c", args.jobs)
            for name, value in zip(times, (full, titled, refitted)):
                times[name].append(value)
            print(f"round {r + 1}: full {full:.2f} s, new title {titled:.2f} s, new fits {refitted:.2f} s", flush=True)
        base = statistics.median(times["full"])
        for name, values in times.items():
            med = statistics.median(values)
            print(f"{name:>10}: median {med:6.2f} s   ratio to full {med / base:.2f}")


if __name__ == "__main__":
    main()
