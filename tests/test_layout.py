"""The package's shape: layered packages that import one way (pyproject.toml's import-linter
contracts), small modules, and no reach into another package's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sgdsweep"
#: The packages, bottom layer first (each imports only those before it), and the modules allowed at the top.
STAGES = ("core", "theory", "models", "sim", "store", "sweep", "analysis", "share", "run")
TOP_MODULES = {"__init__.py", "__main__.py", "errors.py"}
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_workflow" not in p.parts)


def test_the_top_level_holds_the_stages_only():
    entries = {p.name for p in PACKAGE.iterdir() if not p.name.startswith((".", "_")) or p.suffix == ".py"}
    entries -= {"__pycache__"}
    assert entries == set(STAGES) | TOP_MODULES, (
        f"sgdsweep/ holds {sorted(entries)}: put a new module in the stage package it belongs to "
        f"({', '.join(STAGES)})")
    for stage in STAGES:
        init = PACKAGE / stage / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), (
            f"{init} must say in its docstring what the stage does")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_the_size_limit(path):
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines (at most {MAX_LINES}): split it"


def private_imports(package: Path) -> list[str]:
    """``file:line imports module._name`` for each import of a private name from another
    package of ``package`` (a directory laid out like ``sgdsweep/``)."""
    offences = []
    for path in sorted(package.rglob("*.py")):
        if "_workflow" in path.parts:
            continue
        rel = path.relative_to(package.parent).with_suffix("").parts
        here = ".".join(rel[:2]) if len(rel) > 2 else rel[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(package.name):
                continue
            there = ".".join(node.module.split(".")[:2])
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and there != here:
                    offences.append(f"{path.relative_to(package.parent)}:{node.lineno} imports "
                                    f"{node.module}.{alias.name}")
    return offences


def test_no_private_name_is_imported_across_packages():
    offences = private_imports(PACKAGE)
    assert not offences, ("private names used across packages (make them public or move the code):\n"
                          + "\n".join(offences))


def test_a_private_import_across_packages_is_found(tmp_path):
    package = tmp_path / "sgdsweep"
    for stage in ("sim", "store"):
        (package / stage).mkdir(parents=True)
    (package / "store" / "aggregate.py").write_text("def _attrs():\n    pass\n")
    (package / "store" / "share.py").write_text("from sgdsweep.store.aggregate import _attrs\n")
    assert private_imports(package) == []  # within one package: allowed
    (package / "sim" / "results.py").write_text("from sgdsweep.store.aggregate import _attrs\n")
    assert private_imports(package) == ["sgdsweep/sim/results.py:1 imports sgdsweep.store.aggregate._attrs"]


def test_the_packages_import_one_way():
    """pyproject.toml's import-linter contracts (the layers, bottom first: errors, core, theory,
    models, sim, store, sweep, analysis, share, run) are kept: ``lint-imports`` sees every import,
    those inside functions included."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.is_file():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    done = subprocess.run([str(lint), "--no-cache"], check=False, cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, f"an import runs against the layers:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
