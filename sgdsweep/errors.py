"""Error types of sgdsweep.

Every user-facing error names the thing that is wrong, what was given, what is allowed and,
where possible, how to fix it. The command line turns them into one message and a non-zero
exit code (2 for bad input, 1 for a failed run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SgdsweepError(Exception):
    """Base class of the errors sgdsweep reports to its users."""

    exit_code = 1


class ConfigError(SgdsweepError, ValueError):
    """The sweep configuration is invalid.

    Attributes:
        key: dotted path of the offending key (``grid.lr[2]``), or ``"<config>"``.
        given: the value that was given (``None`` when the key is missing).
        allowed: what is allowed, in words.
    """

    exit_code = 2
    #: Longest ``repr`` of the given value a message shows whole (a longer one is cut, with its
    #: length said): a config value of megabytes must not flood the terminal.
    MAX_SHOWN = 300

    def __init__(self, key: str, given: object, allowed: str, hint: str = "") -> None:
        self.key, self.given, self.allowed, self.hint = key, given, allowed, hint
        shown = repr(given)
        if len(shown) > self.MAX_SHOWN:
            shown = f"{shown[:self.MAX_SHOWN // 2]}… (a value of {len(shown)} characters)"
        msg = f"config key '{key}': got {shown}; allowed: {allowed}"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


class PointName:
    """A sweep point's name in a message, ``point lr=0.1, batch_size=4`` (its grid axes and their
    values, in order), written only when a message is (``str()`` or an f-string): every point of
    a sweep is checked with its name at hand, and a sweep of 10⁶ points raises no error for
    nearly all of them. ``axes`` is read when the name is written, so it must not change before."""

    __slots__ = ("axes",)

    def __init__(self, axes: Mapping[str, Any]) -> None:
        self.axes = axes

    def __str__(self) -> str:
        return "point " + ", ".join(f"{k}={v}" for k, v in self.axes.items())


class UsageError(SgdsweepError):
    """A command-line argument, environment variable or path is invalid."""

    exit_code = 2


class StoreError(SgdsweepError):
    """A stored result is missing, incomplete or corrupt."""
