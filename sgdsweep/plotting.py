"""Matplotlib plumbing shared by the report's figures: Unicode log-axis labels, PNGs drawn once
and cut to their content, no overlapping tick labels, and axis labels from a variable's attributes.
"""

from __future__ import annotations

import io
import itertools
import math
import re

import matplotlib
import numpy as np

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib import ticker

#: A log axis's mathtext tick label: optional minus, optional ``coefficient\times``, base, optional exponent.
_LOG_LABEL = re.compile(r"\$\\mathdefault\{(-?)(?:([0-9.]+)\\times)?([0-9.]+)(?:\^\{(-?[0-9]+)\})?\}\$")
_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def plain_label(label: str) -> str:
    """A log-axis tick label written in mathtext (``$\\mathdefault{2\\times10^{-3}}$``) as the
    same text in Unicode (``2×10⁻³``); any other label unchanged."""
    m = _LOG_LABEL.fullmatch(label)
    if m is None:
        return label
    sign, coeff, base, exponent = m.groups()
    return ("−" if sign else "") + (f"{coeff}×" if coeff else "") + base + (exponent or "").translate(_SUPERSCRIPT)


class PlainLogFormatter(ticker.Formatter):
    """Wraps a log axis's own formatter (which ticks get a label, and which label, stay its
    choice) and writes its labels in Unicode instead of mathtext (:func:`plain_label`).

    Parsing mathtext tick labels is most of the time matplotlib spends drawing a log-scaled
    figure (a few milliseconds per label, for every label of every draw).
    """

    def __init__(self, inner: ticker.Formatter) -> None:
        self.inner = inner

    def set_axis(self, axis) -> None:
        self.axis = axis
        self.inner.set_axis(axis)

    def set_locs(self, locs) -> None:
        self.inner.set_locs(locs)

    def __call__(self, x, pos=None) -> str:
        return plain_label(self.inner(x, pos))

    def format_data_short(self, value) -> str:
        return self.inner.format_data_short(value)

    def get_offset(self) -> str:
        return self.inner.get_offset()


def plain_log_labels(fig: plt.Figure) -> plt.Figure:
    """Give every log-scaled axis of ``fig`` :class:`PlainLogFormatter` labels (call once the
    scales are set, before drawing); returns ``fig``."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log":
                continue
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                if isinstance(get(), ticker.LogFormatterMathtext):
                    put(PlainLogFormatter(get()))
    return fig


def tight_png(fig: plt.Figure, dpi: float = 100.0, pad_inches: float = 0.1) -> bytes:
    """The PNG of ``fig`` at ``dpi`` cut to its tight box (every drawn artist) plus
    ``pad_inches``: what ``fig.savefig(…, format="png", bbox_inches="tight")`` gives, drawn once.

    ``bbox_inches="tight"`` draws a figure twice: once to measure its artists, once to render it
    into the measured box (a third of the report's drawing time). Here the figure is drawn once at
    its own size, the box is measured on that drawing, and its pixels are cut out (the padding
    stops at the figure's edge). Where an artist reaches beyond the figure (a legend placed
    outside its axes) the pixels do not hold it, and the figure is drawn again into the measured
    box (an explicit box: ``savefig`` does not measure again), as ``"tight"`` would.
    """
    from PIL import Image

    fig.set_dpi(dpi)
    canvas = fig.canvas
    canvas.draw()
    if thin_tick_labels(fig):  # rare: drawn again without the labels that overlapped
        canvas.draw()
    box = fig.get_tightbbox(canvas.get_renderer())  # inches
    width, height = canvas.get_width_height()
    out = io.BytesIO()
    if box.x0 >= 0 and box.y0 >= 0 and box.x1 * dpi <= width and box.y1 * dpi <= height:
        padded = box.padded(pad_inches)
        left, right = max(0, math.floor(padded.x0 * dpi)), min(width, math.ceil(padded.x1 * dpi))
        top, bottom = max(0, math.floor(height - padded.y1 * dpi)), min(height, math.ceil(height - padded.y0 * dpi))
        pixels = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        pixels.crop((left, top, right, bottom)).save(out, format="png")
    else:
        fig.savefig(out, format="png", dpi=dpi, bbox_inches=box.padded(pad_inches))
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


def _labels(axis, which: str, renderer) -> list[tuple[float, str, object]]:
    """(location, text, window box) of every visible, non-empty tick label of ``axis`` inside its
    view, ``which`` "major" or "minor", in the order of their locations (figure drawn)."""
    locs = axis.get_majorticklocs() if which == "major" else axis.get_minorticklocs()
    ticks = axis.get_major_ticks(len(locs)) if which == "major" else axis.get_minor_ticks(len(locs))
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for loc, tick in zip(locs, ticks):
        if not lo <= loc <= hi:
            continue
        for label in (tick.label1, tick.label2):
            if label.get_visible() and label.get_text():
                out.append((float(loc), label.get_text(), label.get_window_extent(renderer).padded(1)))
    return sorted(out, key=lambda t: t[0])


def overlapping_tick_labels(fig: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of tick labels (texts) of one axis of ``fig`` whose boxes overlap, as last drawn."""
    renderer = fig.canvas.get_renderer()
    pairs = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = _labels(axis, "major", renderer) + _labels(axis, "minor", renderer)
            pairs += [(a[1], b[1]) for i, a in enumerate(labels) for b in labels[i + 1:] if a[2].overlaps(b[2])]
    return pairs


def thin_tick_labels(fig: plt.Figure) -> bool:
    """After a draw: on every axis whose tick labels overlap, drop the minor labels, and if major
    labels still overlap keep each one only if it clears the last one kept. Returns whether
    anything changed (then the figure must be drawn again)."""
    renderer = fig.canvas.get_renderer()
    changed = False
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            major, minor = _labels(axis, "major", renderer), _labels(axis, "minor", renderer)
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
