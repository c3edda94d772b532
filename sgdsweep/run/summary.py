"""The closing summary of ``sgdsweep run``: what was simulated, what each fit found (the report's
verdicts, :func:`sgdsweep.analysis.fit.verdict.verdicts`), which fits did not run and why, and where the
report is.

Built from the files the run wrote (point stores, ``fits.json``, the report), so it says what is
on disk, not what was intended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sgdsweep.analysis.fit.verdict import verdicts
from sgdsweep.store.points import complete_points
from sgdsweep.sweep.plan import PlanFiles


def run_summary(sweep: Any, stored_before: Iterable[str], seconds: float) -> str:
    """The text ``sgdsweep run`` prints when Snakemake succeeded.

    Args:
        sweep: the :class:`sgdsweep.sweep.config.Sweep` that ran.
        stored_before: hashes of the points that had a complete store before the run (checked
            then; only the others are opened now).
        seconds: wall-clock duration of the run.
    """
    plan = PlanFiles(Path(sweep.directory))
    hashes = [p.hash for p in sweep.points]
    before = set(stored_before)
    stored = before & set(hashes) | complete_points(plan.points_dir, [h for h in hashes if h not in before])
    new = len(stored - set(stored_before))
    out = [f"sgdsweep: sweep '{sweep.name}' finished in {seconds:.0f} s",
           f"  points: {len(stored)} of {len(hashes)} stored, {new} simulated in this run"]
    try:
        fits = json.loads(plan.fits.read_text())
    except (OSError, ValueError):
        fits = None
    if fits is not None:  # the report's verdicts, one line per fit, failed groups and fits not run included
        out += ["  fits:"] + ["    " + line for line in verdicts(fits)]
    if plan.report.exists():
        out.append(f"  report: {plan.report}")
    return "\n".join(out)
