"""``python -m sgdsweep`` = the ``sgdsweep`` command. A job of ``sgdsweep run`` is first offered
to the run's job server (:mod:`sgdsweep.run.jobclient`), which runs it without importing anything
here; otherwise, or where the server declines, it runs in this process."""

import sys

from sgdsweep.run.jobclient import run_served

code = run_served(sys.argv[1:])
if code is None:
    from sgdsweep.run.cli import main

    code = main()
raise SystemExit(code)
