"""The tests' in-process ``sgdsweep`` (``conftest.cli``): the exit status and messages of the real
command (``python -m sgdsweep``, ``conftest.run_cli``), and nothing of the call left behind in the
test process: working directory, environment, the ``sgdsweep`` logger, the random streams' version."""

from __future__ import annotations

import logging
import os

from conftest import cli, run_cli, tiny_config, write_yaml

from sgdsweep.core import identity


def test_a_usage_error_is_the_same_in_process_and_in_a_subprocess():
    inside, outside = cli("plan"), run_cli("plan")
    assert (inside.returncode, inside.stdout, inside.stderr) == (outside.returncode, outside.stdout, outside.stderr)
    assert inside.returncode == 2 and "the following arguments are required: config" in inside.stderr


def test_a_call_leaves_the_directory_environment_logger_and_streams_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("SGDSWEEP_SCHEDULER", "tcp://127.0.0.1:1")  # removed for the call, as run_cli does
    monkeypatch.delenv("SGDSWEEP_THREADS", raising=False)
    logger = logging.getLogger("sgdsweep")
    before = (os.getcwd(), dict(os.environ), list(logger.handlers), logger.level, logger.propagate,
              identity.STREAM_VERSION)
    path = write_yaml(tmp_path / "t.yaml", tiny_config())
    refused = cli("run", "t.yaml", "-v", cwd=tmp_path, env={"SGDSWEEP_THREADS": "0"})
    assert refused.returncode == 2 and "SGDSWEEP_THREADS='0'" in refused.stderr, refused.stderr
    valid = cli("validate", str(path), "--help")
    assert valid.returncode == 0 and valid.stdout.startswith("usage: sgdsweep validate")
    log_file = tmp_path / "job.log"
    missing = cli("aggregate", "missing.json", "--out", "e.zarr", "--log", str(log_file), cwd=tmp_path)
    assert missing.returncode == 2 and "file not found: missing.json" in missing.stderr, missing.stderr
    assert log_file.is_file()
    after = (os.getcwd(), dict(os.environ), list(logger.handlers), logger.level, logger.propagate,
             identity.STREAM_VERSION)
    assert after == before
