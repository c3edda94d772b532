"""The digest of the sources compiled into a family's kernels, found by following the code.

Numba checks a cached function against the stamp of its own source file only, while a kernel
has the block loop, the family's hooks and their helpers from several modules compiled in.
:func:`source_digest` starts at the block loop and a family's module and follows every global
name the compiled functions read: a compiled function (``numba.njit``) adds its module's source
(with the intrinsics defined there) and is followed in turn, a module is followed, a number, string or tuple adds
its value. A new helper or a new module is found the same way, so nothing is kept by hand.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from numba.extending import is_jitted

#: Packages whose sources count; a library's code is covered by its version (Numba's own key).
PACKAGE = "sgdsweep"


def source_digest(*roots: Any) -> str:
    """SHA-256 (16 hex digits) of the sources of every module of :data:`PACKAGE` that code
    reachable from ``roots`` (modules or compiled functions) is compiled from, in name order,
    and of the constant values that code reads (:func:`compiled_sources`)."""
    files, constants = compiled_sources(*roots)
    digest = hashlib.sha256()
    for name in files:
        source = Path(inspect.getfile(sys.modules[name])).read_bytes().replace(b"\r\n", b"\n")
        digest.update(name.encode() + b"\0" + source + b"\0")
    for key in sorted(constants):
        digest.update(f"{key}={constants[key]}\0".encode())
    return digest.hexdigest()[:16]


def compiled_sources(*roots: Any) -> tuple[list[str], dict[str, str]]:
    """The modules of :data:`PACKAGE` whose code a kernel built from ``roots`` and
    :mod:`sgdsweep.sim.kernels.loop` can have compiled in (sorted names), and the constants that
    code reads (``module.name`` → repr)."""
    from sgdsweep.sim.kernels import loop  # every kernel is made there

    files: set[str] = set()
    constants: dict[str, str] = {}
    seen: set[int] = set()
    todo: list[Any] = [loop, *roots]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ModuleType):
            if _ours(item.__name__):
                files.add(item.__name__)
                todo.extend(v for v in vars(item).values() if _compiled(v) is not None)
            continue
        func = _compiled(item)
        if func is None or not _ours(func.__module__):
            continue
        files.add(func.__module__)
        for name in _names(func.__code__):
            value = func.__globals__.get(name)
            if isinstance(value, (bool, int, float, str, tuple)):
                constants[f"{func.__module__}.{name}"] = repr(value)
            elif value is not None:
                todo.append(value)
    return sorted(files), constants


def _ours(module: str | None) -> bool:
    return module is not None and (module == PACKAGE or module.startswith(PACKAGE + "."))


def _compiled(value: Any) -> FunctionType | None:
    """The Python function behind a compiled function, or None."""
    return value.py_func if callable(value) and is_jitted(value) else None


def _names(code) -> set[str]:
    """Global names read by ``code`` and the code nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names
