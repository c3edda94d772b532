"""The closing summary of ``sgdsweep run``: what was simulated, which fits ran, where the report is.

Built from the files the run wrote (point stores, ``fits.json``, the report), so it says what is
on disk, not what was intended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .plan import PlanFiles
from .store import complete_points

#: Fits whose results have more than this many groups are summarised as a count.
MAX_GROUPS_LISTED = 1


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.5g}"


def _param_line(name: str, q: dict[str, Any]) -> str:
    lo, hi = q.get("interval") or (None, None)
    text = f"{name} = {_number(q.get('estimate'))} [{_number(lo)}, {_number(hi)}]"
    if q.get("theory") is not None:
        text += f" (exact theory {_number(q['theory'])})"
    return text


def fit_lines(fits: dict[str, Any]) -> list[str]:
    """One line per fit: its headline parameters with intervals, or how many groups were fitted
    and how many failed (with the first failure's reason); then the fits that were not run."""
    lines = []
    for kind, results in fits.items():
        if kind in ("skipped", "settings") or not isinstance(results, list):
            continue
        failed = [r for r in results if "error" in r]
        ok = [r for r in results if "error" not in r]
        if len(results) <= MAX_GROUPS_LISTED and ok:
            params = ok[0].get("params") or {}
            text = "; ".join(_param_line(n, q) for n, q in params.items() if q and q.get("estimate") is not None)
            lines.append(f"{kind}: {text or 'fitted'}")
        else:
            lines.append(f"{kind}: {len(ok)} of {len(results)} groups fitted")
        if failed:
            lines.append(f"  {len(failed)} of {len(results)} group(s) failed, e.g. {failed[0]['group']}: "
                         f"{failed[0]['error']}")
    skipped = fits.get("skipped") or {}
    if skipped:
        lines.append("not run: " + "; ".join(f"{kind} ({why})" for kind, why in skipped.items()))
    return lines


def run_summary(sweep: Any, stored_before: Iterable[str], seconds: float) -> str:
    """The text ``sgdsweep run`` prints when Snakemake succeeded.

    Args:
        sweep: the :class:`sgdsweep.config.Sweep` that ran.
        stored_before: hashes of the points that had a complete store before the run.
        seconds: wall-clock duration of the run.
    """
    plan = PlanFiles(Path(sweep.directory))
    hashes = [p.hash for p in sweep.points]
    stored = complete_points(plan.points_dir, hashes)
    new = len(stored - set(stored_before))
    out = [f"sgdsweep: sweep '{sweep.name}' finished in {seconds:.0f} s",
           f"  points: {len(stored)} of {len(hashes)} stored, {new} simulated in this run"]
    try:
        fits = json.loads(plan.fits.read_text())
    except (OSError, ValueError):
        fits = None
    if fits is not None:
        out += ["  fits: " + line if i == 0 else "        " + line for i, line in enumerate(fit_lines(fits))]
    if plan.report.exists():
        out.append(f"  report: {plan.report}")
    return "\n".join(out)
