"""The limits of a config, checked from its sizes before anything is expanded or built.

A config that asks for too much is refused in seconds, with what it would cost, instead of after
minutes of expanding a grid or building a data set. Three stages check it:

1. While the YAML file is read (:func:`sgdsweep.sweep.schema.read_yaml`): at most
   :data:`MAX_FILE_BYTES`, :data:`MAX_NODES` values, lists of at most :data:`MAX_LIST_ITEMS`
   items and values nested at most :data:`MAX_DEPTH` levels deep, each refused as the parser
   meets it (:func:`depth_error`, :func:`list_error`, :func:`nodes_error`).
2. On the raw mapping, before the schema walks it (:func:`check_sizes`): the number of points the
   grid and the explicit points make (:data:`MAX_POINTS`), counted from the lists' lengths; the
   model's sizes (:data:`MAX_MODEL_SIZE`) and its data set (:data:`MAX_DATA_VALUES`).
3. On the validated config (:func:`check_results_dir`, :func:`check_execution`): a
   ``results_dir`` the file system can hold, local workers bounded by this machine's cores, and a
   ``slurm.memory`` that parses.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from sgdsweep.errors import ConfigError

#: Points per sweep (grid product plus explicit points): what ``validate`` and ``plan`` handle in
#: about a minute and 2 GB (``benchmarks/scale.py``, its plan cases).
MAX_POINTS = 1_000_000
#: Items in any one list of a config (an axis's values, the explicit points): a sweep of more
#: points than this is a product of shorter lists.
MAX_LIST_ITEMS = 100_000
#: Levels of lists in lists or mappings in mappings (the deepest key of a valid config, such as
#: ``precision.observables.weight_var.rel_se``, is at level 4).
MAX_DEPTH = 32
#: Values (scalars, lists and mappings) in one config file.
MAX_NODES = 1_000_000
#: Bytes of a config file (10⁵ explicit points written one per line take about 6 MB).
MAX_FILE_BYTES = 8 * 2**20
#: Largest ``n_inputs``, ``n_outputs``, ``hidden_width`` and length of a model's list option
#: (``targets``, ``curvatures``, ``noise_cov``).
MAX_MODEL_SIZE = 1000
#: Largest data set, in values of its inputs: P·N with P = round(N·samples_per_param) samples of
#: N inputs (8 bytes each: 160 MB).
MAX_DATA_VALUES = 20_000_000
#: Local worker processes per CPU core this process may use (``execution.workers``).
WORKERS_PER_CORE = 2
#: Bytes of one path component and of a whole path (Linux: NAME_MAX, PATH_MAX).
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4096
#: Characters of any one string of a config, key or value (a report title, a comment): a config
#: that passes these limits must also be one that a YAML file of :data:`MAX_FILE_BYTES` can hold,
#: as an imported sweep's ``config.yaml`` is.
MAX_STRING_CHARS = 100_000


def _short(value: str, keep: int = 40) -> str:
    return value if len(value) <= keep else f"{value[:keep]}… ({len(value)} characters)"


def depth_error(key: str, where: str) -> ConfigError:
    """A value nested deeper than :data:`MAX_DEPTH` at ``key`` (``where``: line and column)."""
    return ConfigError(key, f"a value nested more than {MAX_DEPTH} levels deep",
                       f"values nested at most {MAX_DEPTH} levels (lists in lists, mappings in mappings)",
                       f"{where}No key of a sweep config is nested more than a few levels; check the brackets.")


def string_error(key: str, length: int) -> ConfigError:
    """A string (key or value) longer than :data:`MAX_STRING_CHARS` at ``key``."""
    return ConfigError(key, f"a string of {length} characters", f"strings of at most {MAX_STRING_CHARS} characters",
                       "A title or comment of a config is a line or a paragraph, not a document.")


def list_error(key: str, where: str) -> ConfigError:
    """A list longer than :data:`MAX_LIST_ITEMS` at ``key``."""
    return ConfigError(key, f"a list of more than {MAX_LIST_ITEMS} items",
                       f"lists of at most {MAX_LIST_ITEMS} items (a sweep has at most {MAX_POINTS} points, "
                       "a product of shorter lists beyond that)",
                       f"{where}Split the sweep into several, or use fewer values.")


def nodes_error(where: str) -> ConfigError:
    """A config file of more than :data:`MAX_NODES` values."""
    return ConfigError("<config file>", f"more than {MAX_NODES} values",
                       f"a config of at most {MAX_NODES} values (a sweep has at most {MAX_POINTS} points)",
                       f"{where}Split the sweep into several.")


def file_size_error(path: str, size: int) -> ConfigError:
    return ConfigError("<config file>", path, f"a YAML file of at most {MAX_FILE_BYTES // 2**20} MiB",
                       f"It has {size} bytes; {MAX_LIST_ITEMS} explicit points take about 6 MB.")


def _length(value: Any) -> int:
    return len(value) if isinstance(value, list) else 1


def count_points(grid: Any, points: Any) -> tuple[int, str]:
    """At most how many points ``grid`` and ``points`` (raw, unvalidated) make, from the lengths of
    their lists alone, and how (in words): the product of the axes' lengths, a ``zip`` group
    counted once, plus the explicit points. Malformed parts count as one value (the schema
    refuses them later)."""
    from sgdsweep.sweep.grid import GRID_KEYS

    grid = grid if isinstance(grid, Mapping) else {}
    groups = [g for g in grid.get("zip", []) if isinstance(g, list)] if isinstance(grid.get("zip"), list) else []
    zipped = {name for g in groups for name in g if isinstance(name, str)}
    product, parts = 1, []
    for key in GRID_KEYS:
        if key in grid and key not in zipped and _length(grid[key]) > 1:
            product *= _length(grid[key])
            parts.append(f"{key} {_length(grid[key])}")
    for g in groups:
        first = next((n for n in g if isinstance(n, str) and n in grid), None)
        if first is not None and _length(grid[first]) > 1:
            product *= _length(grid[first])
            parts.append(f"zip({', '.join(map(str, g))}) {_length(grid[first])}")
    explicit = len(points) if isinstance(points, list) else 0
    how = " × ".join(parts) if parts else "1"
    if explicit:
        how += f" + {explicit} explicit points"
    return product + explicit, how


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def _largest(section: Mapping[str, Any], grid: Mapping[str, Any], key: str, default: Any) -> tuple[float | None, str]:
    """The largest value of ``key`` (in ``grid`` or ``section``, else ``default``), and where."""
    if key in grid:
        values, where = grid[key], f"grid.{key}"
    elif key in section:
        values, where = section[key], key
    else:
        values, where = default, key
    numbers = [n for n in (_number(v) for v in (values if isinstance(values, list) else [values])) if n is not None]
    return (max(numbers) if numbers else None), where


def check_sizes(raw: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` if the raw config ``raw`` (a mapping, not yet validated) asks
    for more than the limits: more than :data:`MAX_POINTS` points (counted by
    :func:`count_points`, with the replica-steps they would cost), a grid list or explicit points
    of more than :data:`MAX_LIST_ITEMS` items, a model size above
    :data:`MAX_MODEL_SIZE` or a data set above :data:`MAX_DATA_VALUES`. Costs the length of the
    config's lists, never their product."""
    from sgdsweep.models import get_model
    from sgdsweep.sweep.schema import load_schema

    grid = raw.get("grid") if isinstance(raw.get("grid"), Mapping) else {}
    n, how = count_points(grid, raw.get("points"))
    schema = load_schema()
    dynamics = raw.get("dynamics") if isinstance(raw.get("dynamics"), Mapping) else {}
    if n > MAX_POINTS:
        defaults = schema["properties"]["dynamics"]["properties"]
        steps = _largest(dynamics, grid, "steps", defaults["steps"].get("default"))[0]
        reps = _largest(dynamics, grid, "replicas", defaults["replicas"].get("default"))[0]
        cost = f" At {reps:.0f} replicas of {steps:.0f} steps each that is {n * reps * steps:.2g} replica-steps." \
            if steps and reps else ""
        raise ConfigError("points" if isinstance(raw.get("points"), list) and len(raw["points"]) > MAX_POINTS
                          else "grid", f"{n} points ({how})", f"a sweep of at most {MAX_POINTS} points",
                          f"The sweep's points were counted from its lists' lengths, before expanding them.{cost} "
                          "Use fewer values per axis, or split the sweep into several (each its own sweep name).")
    for key, values in grid.items():  # what read_yaml refuses in a file, here for a mapping too
        if isinstance(values, list) and len(values) > MAX_LIST_ITEMS:
            raise list_error(f"grid.{key}", "")
    if isinstance(raw.get("points"), list) and len(raw["points"]) > MAX_LIST_ITEMS:
        raise list_error("points", "")
    model = raw.get("model") if isinstance(raw.get("model"), Mapping) else {}
    kind = model.get("kind", schema["properties"]["model"]["properties"]["kind"]["default"])
    try:
        options = get_model(kind).OPTIONS
    except (ConfigError, TypeError):  # an unknown kind (or not a name): the schema names it
        return
    for key in ("n_inputs", "n_outputs", "hidden_width"):
        value, where = _largest(model, grid, key, options.get(key))
        if value is not None and value > MAX_MODEL_SIZE:
            raise ConfigError(f"model.{key}" if where == key else where,
                              int(value) if value.is_integer() else value, f"at most {MAX_MODEL_SIZE}",
                              "A larger model takes minutes and gigabytes to build before any check could refuse it.")
    for key, value in model.items():
        if isinstance(value, list) and len(value) > MAX_MODEL_SIZE:
            raise ConfigError(f"model.{key}", f"a list of {len(value)} values", f"at most {MAX_MODEL_SIZE} values",
                              "A larger model takes minutes and gigabytes to build before any check could refuse it.")
    size = len(model["targets"]) if isinstance(model.get("targets"), list) else None
    n_in, _ = _largest(model, grid, "n_inputs", options.get("n_inputs", size))
    spp, where = _largest(model, grid, "samples_per_param", None)
    if n_in is None or spp is None:
        return
    p = math.floor(n_in * spp + 0.5)
    if p * n_in > MAX_DATA_VALUES:
        raise ConfigError(where if where.startswith("grid.") else f"grid.{where}", spp,
                          f"a data set of at most {MAX_DATA_VALUES:.0e} input values (P·N)",
                          f"With N = {n_in:.0f} inputs, samples_per_param {spp:g} makes P = {p:.3g} samples, "
                          f"{p * n_in:.3g} values ({8 * p * n_in / 2**30:.3g} GiB). Use a smaller "
                          "samples_per_param or n_inputs.")


def check_results_dir(value: str) -> None:
    """Raise :class:`ConfigError` for a ``results_dir`` no file system can hold: a NUL byte, a
    component longer than :data:`MAX_NAME_BYTES` bytes, or more than :data:`MAX_PATH_BYTES` in all."""
    if "\0" in value:
        raise ConfigError("results_dir", _short(value), "a path without NUL characters",
                          f"It has a NUL at character {value.index(chr(0))}; no file name can hold one.")
    encoded = os.fsencode(value)
    for part in value.split("/"):
        size = len(os.fsencode(part))
        if size > MAX_NAME_BYTES:
            raise ConfigError("results_dir", _short(value), f"a path whose every component has at most "
                              f"{MAX_NAME_BYTES} bytes", f"The component {_short(part)!r} has {size} bytes.")
    if len(encoded) > MAX_PATH_BYTES - 100:
        raise ConfigError("results_dir", _short(value), f"a path of at most {MAX_PATH_BYTES - 100} bytes",
                          f"It has {len(encoded)} bytes; the files of a sweep lie below it.")


def local_cores() -> int:
    """CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def check_execution(execution: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for ``execution.workers`` above :data:`WORKERS_PER_CORE` per
    core of this machine when the workers are local (no scheduler named, ``cluster: local``), and
    for an ``execution.slurm.memory`` that is not a size (``4G``, ``4GB``, ``4000MiB``, as Dask's
    ``parse_bytes`` reads it) when the cluster is SLURM. Workers of a scheduler or of SLURM jobs
    live on other machines: their count is theirs (a SLURM job asks for ``slurm.cores``, and SLURM
    refuses more than a node has)."""
    from sgdsweep.sweep.execution import SCHEDULER_ENV

    if execution.get("cluster") == "slurm":
        slurm_memory_bytes(execution.get("slurm", {}).get("memory", "4GB"))
    local = execution.get("cluster", "local") == "local" and not (execution.get("scheduler")
                                                                  or os.environ.get(SCHEDULER_ENV))
    workers = execution.get("workers", "auto")
    if local and isinstance(workers, int):
        cores = local_cores()
        if workers > WORKERS_PER_CORE * cores:
            raise ConfigError("execution.workers", workers,
                              f"auto or an integer from 1 to {WORKERS_PER_CORE * cores} ({WORKERS_PER_CORE} per "
                              f"CPU core; this machine gives this process {cores})",
                              "Each worker is a process of about 250 MiB running one task at a time; beyond the "
                              "cores they only compete for them. Use auto (one per core).")


def slurm_memory_bytes(value: Any) -> int:
    """``execution.slurm.memory`` in bytes, as dask-jobqueue reads it (``dask.utils.parse_bytes``:
    ``4G`` and ``4GB`` are 4·10⁹, ``4GiB`` 4·2³⁰).

    Raises:
        ConfigError: naming the key, for anything else.
    """
    from dask.utils import parse_bytes

    try:
        size = int(parse_bytes(value))
    except (ValueError, TypeError, AttributeError, OverflowError):  # OverflowError: beyond a float ('1e400G')
        size = 0
    if size <= 0:
        raise ConfigError("execution.slurm.memory", value, "a memory size such as 4G, 4GB, 4000MB or 4GiB",
                          "It is the memory of one SLURM job (sbatch --mem), read as dask-jobqueue reads it.")
    return size
