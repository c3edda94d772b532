"""Where a sweep's simulations run, read from its ``execution`` settings and the environment: an
existing Dask scheduler (``SGDSWEEP_SCHEDULER`` or ``execution.scheduler``), a local cluster and
its number of workers, and the threads of the simulation kernels (``SGDSWEEP_THREADS``).

Reading settings only: nothing here starts, connects to or stops a cluster
(:mod:`sgdsweep.run.cluster` does); the sweep's cost and limits read them before anything runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from sgdsweep.core.hardware import cpu_cores
from sgdsweep.errors import UsageError

#: Environment variable naming an existing Dask scheduler (it overrides ``execution.scheduler``).
SCHEDULER_ENV = "SGDSWEEP_SCHEDULER"
#: What a scheduler address looks like (``protocol://host:port``; :func:`valid_address` checks the port).
ADDRESS_PATTERN = re.compile(r"^(tcp|tls|inproc|ucx)://\S+$")

#: The environment variable of :data:`sgdsweep.sim.kernels.loop.THREADS_ENV` (repeated here:
#: reading it must not compile the kernels).
THREADS_ENV = "SGDSWEEP_THREADS"


def check_threads_env() -> None:
    """Refuse a ``SGDSWEEP_THREADS`` that every simulation would refuse (not a positive integer),
    before any job or cluster starts, instead of in each of them.

    Raises:
        UsageError: naming the variable, what it holds and what is allowed.
    """
    raw = os.environ.get(THREADS_ENV)
    if raw is None:
        return
    try:
        ok = int(raw) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"environment variable {THREADS_ENV}={raw!r}: allowed: a positive integer, the threads "
                         "of the simulation kernels in one process (default 1); set it so, or unset it")


def scheduler_address(execution: Mapping[str, Any]) -> str | None:
    """The existing scheduler to use, or None to use a local cluster. First the environment the
    jobs will read is checked (:func:`check_threads_env`).

    Raises:
        UsageError: ``SGDSWEEP_SCHEDULER`` or ``execution.scheduler`` is set but is not a
            scheduler address; ``SGDSWEEP_THREADS`` is set but is not a positive integer.
    """
    check_threads_env()
    env = os.environ.get(SCHEDULER_ENV)
    if env is not None and env.strip():
        if not valid_address(env.strip()):
            raise UsageError(f"environment variable {SCHEDULER_ENV}={env!r} is not a Dask scheduler "
                             "address; expected e.g. tcp://127.0.0.1:8786 (or unset it to start a "
                             "local cluster)")
        return env.strip()
    address = execution.get("scheduler")
    if address is not None and not valid_address(address):
        raise UsageError(f"config key 'execution.scheduler': {address!r} is not a Dask scheduler address; "
                         "expected e.g. tcp://127.0.0.1:8786 (a host and a port from 1 to 65535), or "
                         "null to start a local cluster")
    return address


def valid_address(address: str) -> bool:
    """Whether ``address`` is ``protocol://host:port`` with a port in 1–65535 (``inproc://`` takes
    any name)."""
    from urllib.parse import urlsplit

    if not ADDRESS_PATTERN.match(address):
        return False
    if address.startswith("inproc://"):
        return True
    try:
        parts = urlsplit(address)
        return bool(parts.hostname) and parts.port is not None and 0 < parts.port
    except ValueError:  # a port beyond 65535, an unclosed [ of an IPv6 host
        return False


def worker_count(execution: Mapping[str, Any]) -> int:
    """Worker processes of a local cluster (``auto`` = CPU cores available to this process)."""
    workers = execution.get("workers", "auto")
    return cpu_cores() if workers == "auto" else int(workers)


def uses_local_cluster(execution: Mapping[str, Any]) -> bool:
    """Whether a shard job with these settings would simulate on a local cluster (no scheduler
    named, not SLURM)."""
    return scheduler_address(execution) is None and execution.get("cluster", "local") == "local"
