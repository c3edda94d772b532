"""The README's first command on a machine whose cores are all busy, with nothing compiled (a
``slow`` test: a file of its own, so that a parallel test run schedules it after the others)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, run_cli, write_yaml


def _busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep a core busy for at most 15 minutes."""
    loop = "import time\nend = time.time() + 900\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


@pytest.mark.workflow
@pytest.mark.slow
def test_default_sweep_from_a_cold_numba_cache_on_a_saturated_machine(tmp_path):
    """The README's first command on a machine whose cores are all busy, with nothing compiled:
    it succeeds, says what it is doing first, and ends with the summary."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    path = write_yaml(tmp_path / "default.yaml", cfg)
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    busy = _busy_loops(os.cpu_count() or 2)
    try:
        t0 = time.monotonic()
        out = run_cli("run", str(path), "--cores", "2", cwd=tmp_path, env={"NUMBA_CACHE_DIR": str(cache)},
                      timeout=1500, cluster="own")
        seconds = time.monotonic() - t0
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert any(cache.rglob("*.nbi")), "the kernels were not compiled into the empty cache"
    first = text.splitlines()[:3]
    assert any("16 to simulate" in line for line in first), first
    assert any("compiles the simulation kernels" in line for line in first), first
    assert "sgdsweep: sweep 'default' finished" in text
    assert "points: 16 of 16 stored, 16 simulated in this run" in text
    assert re.search(r"\[ok\] Power law .*: a = \S+ \[\S+, \S+\]; exact theory \S+ \(inside\)", text)
    assert "[not run] Momentum scaling" in text
    assert f"report: {tmp_path / 'results' / 'default' / 'report.html'}" in text
    print(f"cold, saturated first run: {seconds:.0f} s")
