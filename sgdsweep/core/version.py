"""The package's version (``sgdsweep.__version__``; pyproject.toml's ``version``), recorded in the
provenance of every output."""

VERSION = "0.1.0"
