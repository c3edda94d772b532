"""A job's progress (sgdsweep/run/progress.py): plain lines with a heartbeat without a terminal,
a bar on one, rates only once measurable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from conftest import (
    REPO,
)

from sgdsweep.run import progress


def test_progress_without_a_terminal_is_plain_lines_with_a_heartbeat(monkeypatch, caplog):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    with caplog.at_level("INFO", logger="sgdsweep.run.execute"):
        p = progress.ShardProgress("0123456789abcdef", points=4, cached=1, total_steps=300)
        assert not p.bar
        p.advance(1, 100)
        p.tick()  # no task finished: still a line
        p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("2/4 points done (1 stored before)" in line for line in lines)
    assert "100/300 replica-steps (33%)" in lines[0]


def test_progress_says_nothing_of_a_rate_before_one_is_measurable(monkeypatch, caplog):
    """Before any replica-step is done there is no rate: no 'nan replica-steps/s', no '? left'."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="sgdsweep.run.execute"):
        p = progress.ShardProgress("0123456789abcdef", points=4, cached=0, total_steps=4000)
        p.tick()
        p.running(1000.0)  # the running tasks reported a quarter of their steps
        p.tick()
    first, second = (r.getMessage() for r in caplog.records)
    assert re.fullmatch(r"shard 0123456789abcdef: 0/4 points done \(0 stored before\) \| 0/4k replica-steps "
                        r"\(0%\) \| \d+:\d\d:\d\d elapsed", first), first
    assert "1k/4k replica-steps (25%)" in second and "replica-steps/s" in second and " left" in second
    for text in (first, second, p.bar_text()):
        assert "nan" not in text and "?" not in text


def test_progress_counts_print_four_significant_digits():
    assert [progress.count(x) for x in (0, 999, 96000, 1234567, 2.5e9)] == ["0", "999", "96k", "1.235M", "2.5G"]


def test_a_job_with_nothing_to_say_still_says_it_runs(caplog):
    with caplog.at_level("INFO", logger="sgdsweep"), progress.heartbeat("report: drawing", every=0.05):
        time.sleep(0.3)
    beats = [r.getMessage() for r in caplog.records]
    assert len(beats) >= 2 and all(re.fullmatch(r"report: drawing: still running \(\d+ s\)", b) for b in beats)


def _progress_on_a_terminal(env: dict[str, str]) -> bytes:
    """What two shards' progress writes to a terminal (a pty 120 columns wide) in one process."""
    import pty

    parent, child = pty.openpty()
    os.set_blocking(parent, False)
    code = ("from sgdsweep.run.cli import _setup_logging\n"
            "from sgdsweep.run.progress import ShardProgress\n"
            "_setup_logging(None)\n"
            "a = ShardProgress('0123456789abcdef', 4, 0, 400)\n"
            "b = ShardProgress('fedcba9876543210', 2, 0, 200)\n"
            "a.advance(2, 200); b.advance(2, 200); a.advance(2, 200); a.close(); b.close()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120", **env}
    subprocess.run(["stty", "cols", "120", "rows", "0"], stdin=child, check=True)  # rows unknown, as under `script`
    proc = subprocess.run([sys.executable, "-c", code], stderr=child, env=env, timeout=120, check=False)
    os.close(child)
    out = b""
    try:
        while chunk := os.read(parent, 65536):
            out += chunk
    except (BlockingIOError, OSError):
        pass
    os.close(parent)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out


def test_progress_on_a_terminal_is_a_bar():
    out = _progress_on_a_terminal({progress.PROGRESS_ENV: "bar"})
    assert b"\r" in out and b"4/4 points" in out and b"100%" in out
    assert b"\x1b[" not in out  # no escape sequences, colour or cursor


def test_two_shards_on_one_terminal_write_lines_that_name_them():
    """When ``sgdsweep run`` may run two shard jobs at once it asks for plain lines: no carriage
    return rewrites one shard's line over the other's, and each line names its shard."""
    out = _progress_on_a_terminal({progress.PROGRESS_ENV: "lines"}).decode()
    assert "\r" not in out.replace("\r\n", "\n")  # the pty turns \n into \r\n
    lines = [line for line in out.splitlines() if "points done" in line]
    assert [line.split("shard ")[1][:16] for line in lines] == ["0123456789abcdef", "fedcba9876543210",
                                                               "0123456789abcdef"], lines
