"""``python -m sgdsweep`` = the ``sgdsweep`` command."""

from .cli import main

raise SystemExit(main())
