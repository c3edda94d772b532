"""Sharing a large sweep: ``sgdsweep export``, ``verify`` and ``import`` of a finished sweep.

Each command runs in a fresh process on the finished sweep ``RESULTS_DIR`` (for example the
10⁴-point sweep that ``python benchmarks/scale.py --only 1e4 --keep DIR`` keeps under
``DIR/results/1e4``): ``sgdsweep export`` (which ends by verifying what it wrote), ``sgdsweep
verify`` of that file and ``sgdsweep import`` of it. The baseline, timed in the same run: the
sweep directory's files written into a stored zip file with the SHA-256 of each taken and no
check (what sharing it by hand costs).

    python benchmarks/export_scale.py --sweep RESULTS_DIR [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", required=True, help="a finished sweep directory (results/<sweep>)")
    parser.add_argument("--dir", default=None, help="where to write the files (a temporary directory)")
    args = parser.parse_args()
    commands(Path(args.sweep), args.dir)


def commands(sweep: Path, where: str | None) -> None:
    """Time ``sgdsweep export``, ``verify`` and ``import`` of the finished sweep ``sweep`` against
    a plain stored zip of its directory (see the module docstring)."""
    points = len(json.loads((sweep / "plan" / "sweep.json").read_text())["points"])
    with tempfile.TemporaryDirectory(dir=where) as root:
        root = Path(root)
        t0 = time.perf_counter()
        with zipfile.ZipFile(root / "plain.zip", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for dirpath, _, names in os.walk(sweep):
                for name in sorted(names):
                    path = Path(dirpath) / name
                    data = path.read_bytes()
                    hashlib.sha256(data).hexdigest()
                    zf.writestr(path.relative_to(sweep).as_posix(), data)
        plain = time.perf_counter() - t0
        print(f"{sweep}: {points} points; plain stored zip of the directory with SHA-256s: {plain:.1f} s")
        export = root / "export.zip"
        runs = [("export", ["export", str(sweep), str(export)]), ("verify", ["verify", str(export)]),
                ("import", ["import", str(export), "--results-dir", str(root / "imported")])]
        for name, argv in runs:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sgdsweep", *argv], check=True, cwd=root,
                           stdout=subprocess.DEVNULL)
            took = time.perf_counter() - t0
            print(f"  sgdsweep {name:<7} {took:7.1f} s  {1e3 * took / points:6.2f} ms per point  "
                  f"ratio to the plain zip {took / plain:5.1f}")
        print(f"  export size {export.stat().st_size / 2**20:.0f} MiB, plain zip "
              f"{(root / 'plain.zip').stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
