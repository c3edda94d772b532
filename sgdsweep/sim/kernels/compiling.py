"""One compile of a kernel per machine: of the processes that need a kernel Numba has not cached
(a sweep's Dask workers, parallel test processes), one compiles it (tens of seconds of CPU) while
the others wait, then load it from Numba's cache instead of compiling it again.

A kernel's lock is a file in its Numba cache directory (``$NUMBA_CACHE_DIR`` where set, else the
``__pycache__`` beside its family's source, Numba's default, or the temporary directory where that
cannot be written; :func:`lock_path`), one per kernel and source file, held with ``flock`` while
the kernel is compiled or loaded, not while it runs. Processes with another cache directory take
another lock. Where no lock can be had (no ``fcntl``, a directory that cannot be written, a file
system without locks) the kernel is compiled without one. Nothing here changes what a kernel
computes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numba

log = logging.getLogger("sgdsweep.sim.kernels")

#: Seconds a process waits for another process that compiles the same kernel before it compiles
#: the kernel itself (a holder that was stopped, not killed, keeps its lock).
COMPILE_WAIT = 600.0
#: Seconds of waiting after which the process says, once, what it waits for.
SAY_AFTER = 10.0


def lock_path(name: str, source: str) -> Path:
    """The lock file of kernel ``name`` compiled from the family module ``source`` (a path): in
    ``$NUMBA_CACHE_DIR`` where set, else in the ``__pycache__`` beside ``source`` where that can
    be written (where Numba caches it), else in this machine's temporary directory (Numba then
    caches it in the user's cache directory)."""
    cache = os.environ.get("NUMBA_CACHE_DIR")
    tag = hashlib.sha1(str(Path(source).resolve()).encode()).hexdigest()[:12]
    filename = f"sgdsweep-compile-{name}-{tag}.lock"
    if cache:
        return Path(cache) / filename
    beside = Path(source).parent / "__pycache__"
    if os.access(beside if beside.is_dir() else beside.parent, os.W_OK):
        return beside / filename
    return Path(tempfile.gettempdir()) / filename


def _open(path: Path) -> int | None:
    """A descriptor of ``path`` (created where missing) to lock, or None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):  # another user's lock file: read-only
        try:
            return os.open(path, flags, 0o666)
        except OSError:
            continue
    return None


@contextlib.contextmanager
def locked(name: str, source: str, wait: float | None = None) -> Iterator[bool]:
    """An exclusive lock on kernel ``name``'s lock file (:func:`lock_path`) for the block; yields
    whether it is held: not where none can be had, nor after ``wait`` seconds (default
    :data:`COMPILE_WAIT`) of waiting for another holder. Released when the block ends or the
    process dies."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    path = lock_path(name, source)
    fd = _open(path)
    if fd is None:
        yield False
        return
    try:
        wait = COMPILE_WAIT if wait is None else wait
        start = time.monotonic()
        said = held = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= wait:
                    log.warning("compiling the simulation kernel %s here after waiting %.0f s for another "
                                "process that holds %s", name, waited, path)
                    break
                if not said and waited >= SAY_AFTER:
                    said = True
                    log.warning("waiting for another process that is compiling or loading the simulation "
                                "kernel %s (it holds %s); at most %.0f s, then compiling it here", name, path, wait)
                time.sleep(0.05)
            except OSError:
                break
        yield held
    finally:
        os.close(fd)


def ensure_compiled(kernel: Any, source: str, args: tuple) -> None:
    """Compile ``kernel`` (a Numba dispatcher) for the types of ``args``, or load it from Numba's
    cache, unless this process already has it; the compile or load holds the kernel's lock
    (:func:`locked`), so that another process compiling it at the same time finishes first and
    this one loads what it wrote."""
    signature = tuple(numba.typeof(arg) for arg in args)
    if signature in kernel.overloads:
        return
    with locked(kernel.__name__, source):
        kernel.compile(signature)
