"""Snakemake's terminal output under ``sgdsweep run``: a Snakemake logger plugin (``--logger sgdsweep``).

``sgdsweep run`` puts the directory above this package on the ``PYTHONPATH`` of its Snakemake
process, where Snakemake finds logger plugins (packages named ``snakemake_logger_plugin_*``), and
passes ``--logger sgdsweep``. The plugin replaces Snakemake's own terminal output (its log file
in ``.snakemake/log/`` is unchanged):

- at the verbosity of ``sgdsweep run -v`` (:data:`sgdsweep.run.progress.VERBOSITY_ENV` = 1) it
  writes what Snakemake would, formatted by Snakemake, without colour;
- otherwise only Snakemake's warnings and errors: its banner, job tables and per-job messages
  are left out (the jobs' own lines say what they do);
- after Ctrl-C (SIGINT) nothing: the jobs Snakemake then cancels fail, and their errors are not
  news; ``sgdsweep run`` says in one line that the run was interrupted.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from snakemake_interface_logger_plugins.base import LogHandlerBase

#: The environment variable of :data:`sgdsweep.run.progress.VERBOSITY_ENV` (repeated here: the
#: plugin imports nothing from sgdsweep).
VERBOSITY_ENV = "SGDSWEEP_VERBOSITY"

_interrupted = False  # set by the SIGINT handler below, read by every handler's emit()


def _watch_interrupts() -> None:
    """Note Ctrl-C before Snakemake's own handling of it (a KeyboardInterrupt) starts. Only in
    the main thread, and not where SIGINT is ignored (a run in the background)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None) or getattr(previous, "__name__", "") == "_on_sigint":
        return

    def _on_sigint(signum: int, frame: FrameType | None) -> Any:
        global _interrupted
        _interrupted = True
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: Ctrl-C is then reported as Snakemake reports it
        pass


class LogHandler(LogHandlerBase):
    """Snakemake's records to stderr: warnings and errors, or everything with ``-v``; nothing
    after Ctrl-C."""

    def __post_init__(self) -> None:
        self.verbose = os.environ.get(VERBOSITY_ENV) == "1"
        _watch_interrupts()

    def emit(self, record: logging.LogRecord) -> None:
        if _interrupted or (not self.verbose and record.levelno < logging.WARNING):
            return
        try:
            text = self.format(record)
            if text and text != "None":
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a handler reports its failure, never raises
            self.handleError(record)

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False  # Snakemake's own filter (--quiet, --printshellcmds) applies first

    @property
    def has_formatter(self) -> bool:
        return False  # Snakemake formats its records

    @property
    def needs_rulegraph(self) -> bool:
        return False
