"""Matplotlib plumbing shared by the report's figures: a figure's PNG in matplotlib's tight box
with no overlapping tick labels, and axis labels from a variable's attributes; and the text of a
value in the report's tables.
"""

from __future__ import annotations

import io
import itertools

import matplotlib
import numpy as np

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.transforms import Bbox


def format_value(x: object, digits: int = 4, infinity: bool = False) -> str:
    """A value as the report's tables show it (plain text, not escaped): None, NaN and (unless
    ``infinity``: ∞, −∞) infinities as "—", booleans as yes/no, floats to ``digits``
    significant digits, anything else as ``str``."""
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (float, np.floating)):
        if np.isinf(x) and infinity:
            return "∞" if x > 0 else "−∞"
        return "—" if not np.isfinite(x) else f"{x:.{digits}g}"
    return str(x)


def png(fig: plt.Figure, dpi: float = 100.0, pad_inches: float = 0.1) -> bytes:
    """The PNG of ``fig`` at ``dpi`` (pixels per inch) in its tight box (every drawn artist) with
    ``pad_inches`` (inches) around: what ``fig.savefig(…, bbox_inches="tight")`` gives, after
    :func:`thin_tick_labels` has dropped the tick labels that would overlap.

    The figure is laid out once to find the overlaps and its box; ``savefig`` is given that box
    (a figure without a layout engine is then laid out only once more, as it is rendered)."""
    fig.set_dpi(dpi)
    fig.draw_without_rendering()
    if thin_tick_labels(fig):  # rare: laid out again without the labels that overlapped
        fig.draw_without_rendering()
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad_inches)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi, bbox_inches=box)
    return out.getvalue()


class _Only(ticker.Formatter):
    """Wraps a formatter and leaves unlabelled every tick whose location is not in ``keep``."""

    def __init__(self, inner: ticker.Formatter, keep: set[float]) -> None:
        self.inner, self.keep = inner, keep

    def set_axis(self, axis) -> None:
        self.axis = axis
        self.inner.set_axis(axis)

    def set_locs(self, locs) -> None:
        self.inner.set_locs(locs)

    def __call__(self, x, pos=None) -> str:
        return self.inner(x, pos) if float(x) in self.keep else ""

    def get_offset(self) -> str:
        return self.inner.get_offset()


def _labels(axis, along: int, minor: bool, renderer) -> list[tuple[float, str, Bbox]]:
    """(location, text, window box padded by 1 px) of every visible, non-empty major or ``minor``
    tick label of ``axis`` inside its view, in the order of their locations; ``along`` is 0 for
    an x axis, 1 for a y axis (the coordinate of a label's position that is its tick's location).
    The figure must have been laid out (drawn) at the size and dpi it is measured for."""
    lo, hi = sorted(axis.get_view_interval())
    inside = [(float(label.get_position()[along]), label) for label in axis.get_ticklabels(minor=minor)
              if label.get_text()]
    return sorted(((loc, label.get_text(), label.get_window_extent(renderer).padded(1))
                   for loc, label in inside if lo <= loc <= hi), key=lambda t: t[0])


def _axes_labels(fig: plt.Figure):
    """(axis, its major labels, its minor labels) for every x and y axis of ``fig`` (:func:`_labels`)."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for along, axis in enumerate((ax.xaxis, ax.yaxis)):
            yield axis, _labels(axis, along, False, renderer), _labels(axis, along, True, renderer)


def overlapping_tick_labels(fig: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of tick labels (texts) of one axis of ``fig`` whose boxes overlap, as last laid out."""
    pairs = []
    for _, major, minor in _axes_labels(fig):
        labels = major + minor
        pairs += [(a[1], b[1]) for i, a in enumerate(labels) for b in labels[i + 1:] if a[2].overlaps(b[2])]
    return pairs


def thin_tick_labels(fig: plt.Figure) -> bool:
    """After a layout (a draw): on every axis whose tick labels overlap, drop the minor labels,
    and if major labels still overlap keep each one only if it clears the last one kept.
    Returns whether anything changed (the figure's next draw shows the change)."""
    changed = False
    for axis, major, minor in _axes_labels(fig):
        both = sorted(major + minor, key=lambda t: t[0])
        if not any(a[2].overlaps(b[2]) for a, b in itertools.pairwise(both)):
            continue
        changed = True
        if minor:
            axis.set_minor_formatter(ticker.NullFormatter())
        if any(a[2].overlaps(b[2]) for a, b in itertools.pairwise(major)):
            keep = [major[0]]
            for label in major[1:]:
                if not label[2].overlaps(keep[-1][2]):
                    keep.append(label)
            axis.set_major_formatter(_Only(axis.get_major_formatter(), {k[0] for k in keep}))
    return changed


#: Units that say nothing: a dimensionless integer (a width, a count) is labelled without them.
_NO_UNIT = {"", "units", "count"}


def axis_label(attrs: dict, name: str, dtype_kind: str = "f") -> str:
    """``long name [units]`` of a variable from its attributes; without brackets where the unit is
    empty or a pseudo-unit, or is "1" for an integer quantity (``dtype_kind`` "i" or "u")."""
    units = str(attrs.get("units", ""))
    long_name = attrs.get("long_name", name)
    if units in _NO_UNIT or (units == "1" and dtype_kind in "iu"):
        return long_name
    return f"{long_name} [{units}]"


def integer_ticks(ax, values: np.ndarray, max_ticks: int = 12) -> None:
    """Ticks of ``ax``'s x axis at exactly the integer ``values`` drawn (when there are at most
    ``max_ticks``), so that an integer axis shows no fractional ticks."""
    unique = np.unique(np.asarray(values)[np.isfinite(np.asarray(values, float))])
    if 0 < unique.size <= max_ticks:
        ax.set_xticks(unique, [f"{int(v)}" for v in unique])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
