"""``python -m sgdsweep`` = the ``sgdsweep`` command."""

from sgdsweep.run.cli import main

raise SystemExit(main())
