"""The kernel rate behind ``sgdsweep plan``'s time estimate: a measurement cached in a file when
there is one, else a documented cost model; nothing is compiled while planning.

Planning imports no Numba (every Snakemake job parses the workflow and so plans the sweep): the
time estimate never runs the engine. Per task kind (a shard's problem and batch size) it takes

1. the rate last measured on this machine for that kind, read from the cache file
   (:func:`cache_path`: ``$SGDSWEEP_RATE_CACHE``, else ``$XDG_CACHE_HOME/sgdsweep/kernel_rates.json``,
   else ``~/.cache/sgdsweep/kernel_rates.json``), which ``python -m sgdsweep.sweep.rates CONFIG``
   writes by timing the engine (:func:`sgdsweep.sweep.cost.measure_rate`) on the sweep's costliest
   task kinds; or
2. the cost model :func:`model_rate`: one worker thread's replica-steps per second from the
   point's parameters d, batch size S, noise and observables, its constants fitted to what
   :func:`~sgdsweep.sweep.cost.measure_rate` measured for ``config/models/*.yaml`` on a 2-core dev VM
   (every step measured, a loss sample on each: slower than a run, which thins its loss samples;
   the model is within a factor of 2 of those measurements, ``benchmarks/README.md``).
   Machines differ: take it as an estimate and measure for a figure of this machine.

A cached rate is keyed by the machine's name and everything of the point but ``lr``,
``momentum``, ``replicas`` and ``seed`` (:func:`kind_key`), so a changed model or observable is
measured anew, not read stale.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgdsweep.core.identity import content_hash

#: Environment variable: the rate cache file (default under ``$XDG_CACHE_HOME`` or ``~/.cache``).
CACHE_ENV = "SGDSWEEP_RATE_CACHE"
#: Cost model, seconds per replica-step: a step's fixed cost (the loop, the bounds, a loss sample
#: and its 128 lagged products), fitted to the 1–2-parameter models (1.2e6–1.8e6 replica-steps/s).
STEP_SECONDS = 800e-9
#: Per drawn sample (index draw and row gather), fitted to the matrix model at S = 4 and 64.
SAMPLE_SECONDS = 35e-9
#: Per flop of the gradient and update (4·S·d flops with sampled noise, 2·d² + 4·d with added
#: noise), from linreg-ref bare (4,000 flops a step, 2.8e6 replica-steps/s; ``benchmarks/README.md``).
FLOP_SECONDS = 0.08e-9
#: Per entry of the second moment updated each measured step (d² up to ``cov_max_dim``, else d),
#: from linreg-ref with observables (N = 100: 1.36e6 replica-steps/s).
MOMENT_SECONDS = 0.04e-9
#: Per entry d·k of the streaming eigen-sketch beyond ``cov_max_dim`` (NumPy, not compiled),
#: fitted to the digits model (d = 610, k = 32: 3.6e3 replica-steps/s).
SKETCH_SECONDS = 14e-9


def cache_path() -> Path:
    """The rate cache file (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sgdsweep" / "kernel_rates.json"


def kind_key(params: Mapping[str, Any]) -> str:
    """The cache key of a task kind: this machine's name and the point's parameters but ``lr``,
    ``momentum``, ``replicas`` and ``seed``."""
    kept = {k: v for k, v in params.items() if k not in ("lr", "momentum", "replicas", "seed")}
    return f"{platform.node()}:{content_hash(kept)}"


def read_cache() -> dict[str, float]:
    """Key → replica-steps/s of the cache file; empty when it is missing or unreadable (a broken
    cache costs the measurement, never the plan)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}


def write_cache(rates: Mapping[str, float]) -> Path:
    """Merge ``rates`` (key → replica-steps/s) into the cache file, atomically; return its path."""
    from sgdsweep.core.paths import atomic_write_text

    merged = {**read_cache(), **{k: float(v) for k, v in rates.items()}}
    path = cache_path()
    atomic_write_text(path, json.dumps(merged, indent=1, sort_keys=True) + "\n")
    return path


def model_rate(params: Mapping[str, Any], dim: int) -> float:
    """Replica-steps per second of one worker thread on a point of ``dim`` parameters, by the cost
    model (the module's constants): every step measured, as :func:`sgdsweep.sweep.cost.measure_rate`
    times it."""
    from sgdsweep.sim.shapes import MODE, sketch_width

    d, s = int(dim), int(params["batch_size"])
    observe = params["observe"]
    sampled = params["noise"] in MODE
    flops = 4 * s * d if sampled else 2 * d * d + 4 * d
    seconds = STEP_SECONDS + (SAMPLE_SECONDS * s if sampled else 0.0) + FLOP_SECONDS * flops
    if d <= int(observe["cov_max_dim"]):
        seconds += MOMENT_SECONDS * d * d
    else:
        seconds += MOMENT_SECONDS * d
        if int(observe["n_eigenpairs"]) > 0:
            from sgdsweep.sim.shapes import ObserveSpec

            k = sketch_width(ObserveSpec(n_eigenpairs=int(observe["n_eigenpairs"])), d)
            seconds += SKETCH_SECONDS * d * k
    return 1.0 / seconds


def calibrate(config: str | Path) -> list[str]:
    """Time the engine on the costliest task kinds of the sweep of ``config`` (compiling the
    kernels: seconds to a minute), cache the rates (:func:`write_cache`) and return lines saying
    what was measured."""
    from sgdsweep.sweep import cost
    from sgdsweep.sweep.config import load_sweep

    sweep = load_sweep(config)
    kinds = cost.task_kinds(cost.tasks(sweep))
    measured = {}
    lines = []
    for key in sorted(kinds, key=lambda k: -sum(t.replica_steps for t in kinds[k]))[:cost.CALIBRATED_KINDS]:
        first = kinds[key][0].first
        rate = cost.measure_rate(first, max(t.lanes for t in kinds[key]))
        measured[kind_key(first.params)] = rate
        lines.append(f"batch_size {first.params['batch_size']} of shard {first.shard}: {rate:.3g} replica-steps/s "
                     f"(the cost model says {model_rate(first.params, sweep.footprints[first.data_set].dim):.3g})")
    path = write_cache(measured)
    return lines + [f"cached in {path}"]


def main(argv: list[str] | None = None) -> int:
    """``python -m sgdsweep.sweep.rates CONFIG``: measure and cache the sweep's kernel rates."""
    import sys

    from sgdsweep.errors import ConfigError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m sgdsweep.sweep.rates CONFIG  (times the engine on the sweep's costliest "
              "task kinds and caches the rates that `sgdsweep plan` reads)", file=sys.stderr)
        return 2
    try:
        lines = calibrate(args[0])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
