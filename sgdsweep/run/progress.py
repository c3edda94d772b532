"""Progress of a shard job in the terminal and in its log.

On a terminal (and when ``sgdsweep run`` allows it: :data:`PROGRESS_ENV`), one line of the shard,
redrawn in place with a carriage return; otherwise (a pipe, a file, a cluster job's output, or
two shard jobs that may run at once) plain lines, each naming the shard. The job's log file gets
the plain lines either way. Progress counts the replica-steps of finished tasks and the share
that the running tasks reported of theirs (:mod:`sgdsweep.run.execute`); the bar is redrawn at
most every :data:`REDRAW_S` seconds, a plain line is written when a task finishes, at most every
:data:`LINE_EVERY_S` seconds while the running tasks advance, and at least every
:data:`HEARTBEAT_S` seconds while nothing does, so the user never waits long without a sign of
life. A rate and the time left are shown only once something was done (before that there is no
rate to show).
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
#: Shortest interval, in seconds, between two plain lines while the running tasks advance.
LINE_EVERY_S = 10.0
#: Shortest interval, in seconds, between two redraws of the bar on a terminal.
REDRAW_S = 1.0

#: Environment variable: the terminal verbosity (-1 quiet, 0 normal, 1 verbose) that
#: ``sgdsweep run -q/-v`` passes on to the workflow's jobs.
VERBOSITY_ENV = "SGDSWEEP_VERBOSITY"

#: Environment variable: ``lines`` makes a shard job write plain lines even on a terminal
#: (``sgdsweep run`` sets it when two shard jobs may run at once, whose redrawn lines would
#: overwrite each other); ``bar`` or unset: a redrawn line on a terminal.
PROGRESS_ENV = "SGDSWEEP_PROGRESS"


def verbosity() -> int:
    """The verbosity :data:`VERBOSITY_ENV` asks for (0 when unset or not -1, 0 or 1)."""
    text = os.environ.get(VERBOSITY_ENV, "0")
    return int(text) if text in ("-1", "0", "1") else 0


#: A terminal narrower than this (or of unknown width) gets plain lines instead of a bar.
MIN_BAR_COLUMNS = 40
#: Columns the bar's text needs besides its graph (the graph is drawn where the terminal has more).
_BAR_ROOM = 100


def _terminal_size(stream: IO[str]) -> os.terminal_size:
    """The size of the terminal ``stream`` writes to; 0 × 0 if it is not a terminal."""
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    return os.terminal_size((0, 0))


def _clock(seconds: float) -> str:
    """``3725`` → ``'1:02:05'`` (h:mm:ss)."""
    seconds = max(0, round(seconds)) if math.isfinite(seconds) else 0
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def count(x: float) -> str:
    """A count to 4 significant digits with a metric prefix: ``96000`` → ``'96k'``,
    ``1234567`` → ``'1.235M'``."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.4g}{prefix}"
    return f"{x:.4g}"


class ShardProgress:
    """Progress of one shard: points and replica-steps done out of those to simulate.

    Args:
        shard: the shard id (its first 8 characters label the bar).
        points: points in the shard; ``cached`` of them were stored before.
        total_steps: replica-steps to simulate.
        stream: where the bar goes (stderr).
        verbosity: -1 (``-q``) draws no bar.
        bar: draw a bar (True) or write plain lines (False); by default a bar when ``stream`` is
            a terminal at least :data:`MIN_BAR_COLUMNS` wide, ``verbosity`` is not negative and
            :data:`PROGRESS_ENV` is not ``lines``.
    """

    def __init__(self, shard: str, points: int, cached: int, total_steps: int,
                 stream: IO[str] | None = None, verbosity: int = 0, bar: bool | None = None) -> None:
        self.shard, self.points, self.cached, self.total = shard, points, cached, total_steps
        self.done_points = self.finished_steps = self.running_steps = 0
        self.t0 = self.last_line = time.perf_counter()
        self.last_draw = -math.inf
        self.steps_at_last_line = 0.0
        self.stream = sys.stderr if stream is None else stream
        self.columns = _terminal_size(self.stream).columns
        if bar is None:
            bar = (verbosity >= 0 and self.columns >= MIN_BAR_COLUMNS
                   and os.environ.get(PROGRESS_ENV, "bar") != "lines")
        self.bar = bool(bar)
        self.columns = self.columns or 80
        self._drawn = 0  # characters of the bar now on the terminal's line
        if self.bar:
            self._draw()

    @property
    def done_steps(self) -> float:
        """Replica-steps done: those of finished tasks and the running tasks' reported share."""
        return min(self.total, self.finished_steps + self.running_steps)

    def rate(self) -> float | None:
        """Replica-steps per second since the start; None while nothing is done (no rate yet)."""
        elapsed = time.perf_counter() - self.t0
        done = self.done_steps
        return done / elapsed if done > 0 and elapsed > 0 else None

    def _points(self) -> str:
        return f"{self.done_points + self.cached}/{self.points} points"

    def _timing(self) -> list[str]:
        """``['2.1M replica-steps/s', '0:00:12 elapsed, 0:00:30 left']``; no rate and no time left
        while nothing is done."""
        elapsed = time.perf_counter() - self.t0
        rate = self.rate()
        if rate is None:
            return [f"{_clock(elapsed)} elapsed"]
        left = (self.total - self.done_steps) / rate
        return [f"{count(rate)} replica-steps/s", f"{_clock(elapsed)} elapsed, {_clock(left)} left"]

    def _percent(self) -> float:
        return 100.0 * self.done_steps / self.total if self.total else 100.0

    def line(self) -> str:
        """The plain progress line: points, replica-steps, and (once measurable) rate and time left."""
        return " | ".join([f"shard {self.shard}: {self._points()} done ({self.cached} stored before)",
                           f"{count(self.done_steps)}/{count(self.total)} replica-steps ({self._percent():.0f}%)",
                           *self._timing()])

    def bar_text(self) -> str:
        """The bar's line, at most one character narrower than the terminal: the time left comes
        before the counts, so a narrow terminal cuts the elapsed time first; the graph, of a width
        fixed by the terminal's, only where it leaves room for the rest."""
        elapsed = time.perf_counter() - self.t0
        rate = self.rate()
        parts = [f"{self._percent():3.0f}% {self._points()}"]
        if rate is not None:
            parts.append(f"{_clock((self.total - self.done_steps) / rate)} left")
        parts.append(f"{count(self.done_steps)}/{count(self.total)} replica-steps")
        if rate is not None:
            parts.append(f"{count(rate)}/s")
        parts.append(f"{_clock(elapsed)} elapsed")
        width = min(25, self.columns - _BAR_ROOM)
        graph = ""
        if width >= 8:
            filled = round(width * self._percent() / 100)
            graph = f"[{'#' * filled}{'-' * (width - filled)}] "
        text = f"shard {self.shard[:8]} {graph}{' | '.join(parts)}"
        while len(text) >= self.columns and len(parts) > 1:  # whole parts off the end
            parts.pop()
            text = f"shard {self.shard[:8]} {graph}{' | '.join(parts)}"
        return text[: self.columns - 1]

    def advance(self, points: int, steps: int) -> None:
        """Record finished points and their replica-steps."""
        self.done_points += points
        self.finished_steps += steps
        self._emit()
        if self.bar:
            self._draw()

    def running(self, steps: float) -> None:
        """Record the replica-steps the running tasks reported so far (replaces the last value)."""
        self.running_steps = max(0.0, steps)

    def tick(self) -> None:
        """Show what changed since the last line: called at least every :data:`REDRAW_S` seconds."""
        now = time.perf_counter()
        if self.bar and now - self.last_draw >= REDRAW_S:
            self._draw()
        moved = self.done_steps != self.steps_at_last_line
        if now - self.last_line >= (LINE_EVERY_S if moved else HEARTBEAT_S):
            self._emit()

    def _draw(self) -> None:
        self.last_draw = time.perf_counter()
        text = self.bar_text()
        self.stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
        self.stream.flush()
        self._drawn = len(text)

    def _emit(self) -> None:
        self.last_line = time.perf_counter()
        self.steps_at_last_line = self.done_steps
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, self.line(), None, None)
        if not self.bar:
            log.handle(record)
            return
        for handler in logging.getLogger("sgdsweep").handlers:  # the bar stands for the terminal
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)

    def close(self) -> None:
        """End the bar's line (a terminal's next output starts on a line of its own)."""
        if self.bar:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self.bar = False


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
