"""The README's first run: the default sweep (``config/config.yaml``) from an empty numba cache.

Each repetition runs ``sgdsweep run config/config.yaml --cores 2`` of each ``--tree`` (checkouts of
sgdsweep, e.g. ``git worktree add /tmp/old <commit>``) in turn, each in a fresh directory with a
fresh, empty ``NUMBA_CACHE_DIR``, so every run compiles the simulation kernels it needs as a new
installation does; with ``--busy N``, N busy loops run meanwhile (a machine whose cores are all
busy, where first runs were slowest). The trees take turns within a repetition, so they share the
machine's load.

    python benchmarks/first_run.py --tree OLD --tree NEW [--repeats 2] [--busy 2]

Prints each run's wall seconds and the number of compiled kernel signatures numba cached (files
``*.nbc``), then per tree the median and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _once(tree: Path, timeout_s: float = 1800.0) -> tuple[float, int]:
    """(wall seconds of the default sweep of ``tree`` from an empty numba cache, compiled signatures)."""
    with tempfile.TemporaryDirectory(prefix="first-run-") as tmp:
        cfg = yaml.safe_load((tree / "config" / "config.yaml").read_text())
        cfg["results_dir"] = str(Path(tmp) / "results")
        (Path(tmp) / "default.yaml").write_text(yaml.safe_dump(cfg))
        cache = Path(tmp) / "numba-cache"
        cache.mkdir()
        env = {**os.environ, "PYTHONPATH": str(tree), "NUMBA_CACHE_DIR": str(cache)}
        env.pop("SGDSWEEP_SCHEDULER_FILE", None)
        env.pop("SGDSWEEP_SCHEDULER", None)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "sgdsweep", "run", "default.yaml", "--cores", "2"], cwd=tmp,
                              env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
        wall = time.monotonic() - t0
        if proc.returncode:
            raise SystemExit(f"{tree}: sgdsweep run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return wall, sum(1 for _ in cache.rglob("*.nbc"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", type=Path, help="a checkout of sgdsweep (default: this one)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy", type=int, default=0, help="busy loops running meanwhile")
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    loop = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"
    busy = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(args.busy)]
    walls: dict[Path, list[float]] = {t: [] for t in trees}
    try:
        for rep in range(args.repeats):
            for tree in trees:
                wall, signatures = _once(tree)
                walls[tree].append(wall)
                print(f"  repetition {rep + 1}  {tree}  {wall:6.1f} s  {signatures} compiled signatures", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    first = statistics.median(walls[trees[0]])
    print(f"default sweep from an empty numba cache, --cores 2, {args.busy} busy loop(s), median of {args.repeats}:")
    for tree in trees:
        median = statistics.median(walls[tree])
        print(f"  {tree}  {median:6.1f} s  ratio to the first tree {median / first:.2f}")


if __name__ == "__main__":
    main()
