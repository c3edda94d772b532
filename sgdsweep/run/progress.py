"""Progress of a shard job in the terminal and in its log.

On a terminal, a tqdm bar over the shard's replica-steps; otherwise (a pipe, a file, a cluster
job's output) plain lines. The job's log file gets the plain lines either way. Either is updated
when a task finishes and at least every :data:`HEARTBEAT_S` seconds while none does, so the user
never waits long without a sign of life.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

log = logging.getLogger("sgdsweep.run.execute")

#: Longest silence, in seconds, while a shard's tasks run.
HEARTBEAT_S = 20.0

#: Environment variable: the terminal verbosity (-1 quiet, 0 normal, 1 verbose) that
#: ``sgdsweep run -q/-v`` passes on to the workflow's jobs.
VERBOSITY_ENV = "SGDSWEEP_VERBOSITY"


def verbosity() -> int:
    """The verbosity :data:`VERBOSITY_ENV` asks for (0 when unset or not -1, 0 or 1)."""
    text = os.environ.get(VERBOSITY_ENV, "0")
    return int(text) if text in ("-1", "0", "1") else 0


#: A terminal narrower than this (or of unknown width) gets plain lines instead of a bar.
MIN_BAR_COLUMNS = 40


def _terminal_size(stream: IO[str]) -> os.terminal_size:
    """The size of the terminal ``stream`` writes to; 0 × 0 if it is not a terminal."""
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    return os.terminal_size((0, 0))


def _fmt_time(seconds: float) -> str:
    seconds = max(0, round(seconds)) if math.isfinite(seconds) else 0
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ShardProgress:
    """Progress of one shard: points and replica-steps done out of those to simulate.

    Args:
        shard: the shard id (its first 8 characters label the bar).
        points: points in the shard; ``cached`` of them were stored before.
        total_steps: replica-steps to simulate.
        stream: where the bar goes (stderr); a bar is drawn only if it is a terminal and
            ``verbosity`` is not negative (``-q``).
    """

    def __init__(self, shard: str, points: int, cached: int, total_steps: int,
                 stream: IO[str] | None = None, verbosity: int = 0) -> None:
        self.shard, self.points, self.cached, self.total = shard, points, cached, total_steps
        self.done_points = self.done_steps = 0
        self.t0 = self.last = time.perf_counter()
        stream = sys.stderr if stream is None else stream
        self.bar = None
        size = _terminal_size(stream)
        if verbosity >= 0 and size.columns >= MIN_BAR_COLUMNS:
            from tqdm import tqdm

            # the size is fixed here: a terminal that reports no rows (a pty nobody sized, which
            # tqdm's dynamic sizing reads again at each refresh) would hide the bar
            self.bar = tqdm(total=total_steps, unit="replica-step", unit_scale=True, file=stream,
                            desc=f"shard {shard[:8]}", ncols=size.columns, nrows=size.lines or 24,
                            mininterval=1.0)
            self.bar.set_postfix_str(self._points())

    def _points(self) -> str:
        return f"{self.done_points + self.cached}/{self.points} points"

    def line(self) -> str:
        """The plain progress line: points, replica-steps, rate, elapsed and estimated time left."""
        elapsed = time.perf_counter() - self.t0
        rate = self.done_steps / elapsed if elapsed > 0 and self.done_steps else float("nan")
        left = (self.total - self.done_steps) / rate if rate > 0 else float("nan")
        return (f"shard {self.shard}: {self._points()} done ({self.cached} stored before) | "
                f"{self.done_steps:.3g}/{self.total:.3g} replica-steps | {rate:.3g} replica-steps/s | "
                f"{_fmt_time(elapsed)} elapsed, {_fmt_time(left) if math.isfinite(left) else '?'} left")

    def advance(self, points: int, steps: int) -> None:
        """Record finished points and their replica-steps."""
        self.done_points += points
        self.done_steps += steps
        self._emit()
        if self.bar is not None:
            self.bar.set_postfix_str(self._points(), refresh=False)
            self.bar.update(steps)

    def heartbeat(self) -> None:
        """Say the shard is still running (called when no task finished for a while)."""
        if time.perf_counter() - self.last >= HEARTBEAT_S:
            self._emit()
            if self.bar is not None:
                self.bar.refresh()

    def _emit(self) -> None:
        self.last = time.perf_counter()
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, self.line(), None, None)
        if self.bar is None:
            log.handle(record)
            return
        for handler in logging.getLogger("sgdsweep").handlers:  # the bar stands for the terminal
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def heartbeat(what: str, every: float | None = None) -> Iterator[None]:
    """Log ``<what>: still running (N s)`` every ``every`` seconds (default :data:`HEARTBEAT_S`)
    while the block runs: for a job that has nothing else to say until it is done (aggregation,
    fits, the report's figures) on a machine busy enough to make it slow."""
    every = HEARTBEAT_S if every is None else every
    stop = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not stop.wait(every):
            logging.getLogger("sgdsweep").info("%s: still running (%.0f s)", what, time.perf_counter() - t0)

    thread = threading.Thread(target=beat, name="sgdsweep-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
