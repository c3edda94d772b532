"""The lock that makes one process per machine compile a kernel (sgdsweep.sim.kernels.compiling):
one lock per kernel and cache directory, a waiter that gives up after its wait and says so, a lock
that goes with its holder. The two processes that start one kernel at once with nothing cached are
tests/sim/test_fused.py::test_cached_kernels_are_compiled_again_when_a_helper_module_changes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from sgdsweep.sim.kernels import affine, compiling

SOURCE = affine.__file__

HOLD = """
import sys, time
from sgdsweep.sim.kernels import compiling
with compiling.locked(sys.argv[1], sys.argv[2]) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(60)
"""


def _holder(name: str, env: dict[str, str]) -> subprocess.Popen:
    """Another process holding kernel ``name``'s lock (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, name, SOURCE], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_kernel_waits_only_for_its_own_lock_in_its_own_cache(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "a"))
    env = {**os.environ}
    assert compiling.lock_path("affine_full", SOURCE).parent == tmp_path / "a"
    holder = _holder("affine_full", env)
    try:
        with compiling.locked("affine_diagonal", SOURCE, wait=5) as held:  # another kernel
            assert held
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "b"))
        with compiling.locked("affine_full", SOURCE, wait=5) as held:  # another cache
            assert held
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "a"))
        monkeypatch.setattr(compiling, "SAY_AFTER", 0.2)
        t0 = time.monotonic()
        with (caplog.at_level(logging.WARNING, logger="sgdsweep.sim.kernels"),
              compiling.locked("affine_full", SOURCE, wait=1.0) as held):  # the same: waits, then gives up
            assert not held
        assert time.monotonic() - t0 >= 1.0
        said = [r.getMessage() for r in caplog.records]
        assert any("waiting for another process" in m and "affine_full" in m for m in said), said
        assert any("compiling the simulation kernel affine_full here after waiting" in m for m in said), said
    finally:
        holder.kill()
        holder.wait()
    with compiling.locked("affine_full", SOURCE, wait=5) as held:  # a killed holder's lock is gone
        assert held


def test_no_lock_where_the_cache_directory_cannot_be_made(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "file" / "cache"))  # under a file: no directory
    with compiling.locked("affine_full", SOURCE, wait=1) as held:
        assert not held


def test_a_process_already_holding_the_kernel_takes_no_lock(tmp_path, monkeypatch):
    """ensure_compiled returns at once where the dispatcher has the signature (no lock file made)."""

    class Dispatcher:
        __name__ = "affine_full"

        def __init__(self) -> None:
            self.overloads = {(compiling.numba.typeof(1.0),): "compiled"}

        def compile(self, signature):
            raise AssertionError("compiled again")

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    compiling.ensure_compiled(Dispatcher(), SOURCE, (1.0,))
    assert list(tmp_path.iterdir()) == []


def test_advance_locks_each_kernel_by_its_own_name_while_it_compiles_not_while_it_runs(monkeypatch):
    """A process's first call of a kernel: the kernel's own lock around its compile or load, then
    the call, outside the lock; the next call takes no lock."""
    import contextlib

    import numpy as np

    from sgdsweep.sim.kernels import loop

    events: list[str] = []

    @contextlib.contextmanager
    def recorded(name, source, wait=None):
        events.append(f"lock {name} {source}")
        yield True
        events.append("unlock")

    class Kernel:  # a dispatcher with nothing compiled
        __name__ = "affine_full"

        def __init__(self) -> None:
            self.overloads: dict = {}

        def compile(self, signature) -> None:
            events.append("compile")
            self.overloads[signature] = "compiled"

        def __call__(self, *args) -> None:
            events.append("run")

    kernel = Kernel()
    monkeypatch.setattr(compiling, "locked", recorded)
    monkeypatch.setitem(loop._SOURCES, kernel, SOURCE)
    lanes = loop.Lanes(*[np.zeros((2, 1)) for _ in loop.Lanes._fields])
    for _ in range(2):
        loop.advance((kernel, kernel), None, None, 0, 1, lanes, [], 0, 0, 1)
    loop._CALLED.discard(kernel)
    assert events == [f"lock affine_full {SOURCE}", "compile", "unlock", "run", "run"]
