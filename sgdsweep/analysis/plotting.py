"""Matplotlib plumbing shared by the report's figures: a figure's PNG (at :data:`DPI`) and SVG in
matplotlib's tight box with no overlapping tick labels, the legend entries a figure draws, axis
labels from a variable's attributes (real units only, Greek symbols in mathtext); and the text of
a value in the report's tables.
"""

from __future__ import annotations

import io
import itertools

import matplotlib
import numpy as np

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"  # SVG text stays text: searchable and editable
matplotlib.rcParams["svg.hashsalt"] = "sgdsweep"  # the same figure gives the same SVG (its clip-path ids)

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


#: Pixels per inch of the report's PNGs: sharp on high-density screens (a figure is shown at
#: half its pixel size, :data:`SHOWN_DPI`).
DPI = 200.0
#: Pixels per inch at which the report's page shows a figure (CSS pixels).
SHOWN_DPI = 100.0


def _tight_box(fig: plt.Figure, dpi: float, pad_inches: float) -> Bbox:
    """Lay ``fig`` out at ``dpi``, drop overlapping tick labels (:func:`thin_tick_labels`) and
    return its tight box (inches) padded by ``pad_inches``."""
    fig.set_dpi(dpi)
    fig.draw_without_rendering()
    if thin_tick_labels(fig):  # rare: laid out again without the labels that overlapped
        fig.draw_without_rendering()
    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad_inches)


def png(fig: plt.Figure, dpi: float = DPI, pad_inches: float = 0.1) -> bytes:
    """The PNG of ``fig`` at ``dpi`` (pixels per inch) in its tight box (every drawn artist) with
    ``pad_inches`` (inches) around: what ``fig.savefig(…, bbox_inches="tight")`` gives, after
    :func:`thin_tick_labels` has dropped the tick labels that would overlap.

    The figure is laid out once to find the overlaps and its box; ``savefig`` is given that box
    (a figure without a layout engine is then laid out only once more, as it is rendered)."""
    return render(fig, dpi, pad_inches, svg=False)[0]


def render(fig: plt.Figure, dpi: float = DPI, pad_inches: float = 0.1, svg: bool = True) -> tuple[bytes, bytes | None]:
    """(PNG, SVG or None) of ``fig`` in one tight box (:func:`png`); the SVG, when ``svg``, holds
    the same drawing with its text as text."""
    box = _tight_box(fig, dpi, pad_inches)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi, bbox_inches=box)
    if not svg:
        return out.getvalue(), None
    vector = io.BytesIO()
    dense = rasterise_dense(fig)
    fig.savefig(vector, format="svg", bbox_inches=box, metadata={"Date": None}, **({"dpi": dpi} if dense else {}))
    return out.getvalue(), vector.getvalue()


#: A figure whose data (lines, markers, error bars) hold more than this many points in all has
#: them drawn as one picture at the PNG's dpi inside its SVG: the axes, ticks and text stay
#: vector and text, and the SVG stays small however many points a sweep has.
MAX_VECTOR_POINTS = 5000


def _points(artist) -> int:
    """How many points (vertices, markers or paths) a line or collection draws."""
    if hasattr(artist, "get_xydata"):
        return len(artist.get_xydata())
    return max(len(artist.get_offsets()), len(artist.get_paths()))


def rasterise_dense(fig: plt.Figure) -> bool:
    """Mark every line and collection of ``fig``'s axes to be rasterised in vector output when
    they hold more than :data:`MAX_VECTOR_POINTS` points in all; returns whether it did."""
    artists = [a for ax in fig.axes for a in (*ax.lines, *ax.collections)]
    if sum(_points(a) for a in artists) <= MAX_VECTOR_POINTS:
        return False
    for artist in artists:
        artist.set_rasterized(True)
    return True


def legend_entries(fig: plt.Figure) -> dict[str, list[str]]:
    """What the legends of ``fig`` say: ``{"entries": every legend text (axes' and figure's),
    "unlisted": labels of labelled artists (matplotlib's legend handles of each axes) that no
    legend shows}``. A figure that names each plotted group in its legend has nothing unlisted."""
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    entries = [t.get_text() for leg in legends if leg is not None for t in leg.get_texts()]
    shown = set(entries)
    labels = [label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]
    return {"entries": entries, "unlisted": [label for label in dict.fromkeys(labels) if label not in shown]}


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


#: Units a label or table header shows: physical ones. The others of the ensemble ("1", "weight²",
#: "loss", "gradient²", "units", …) only restate what the quantity is, so they are left out.
REAL_UNITS = frozenset({"s", "steps"})

#: Unicode symbols of the ensemble's long names and their mathtext (longest first).
_MATH = (("σ_ε²", r"$\sigma_\varepsilon^2$"), ("σ_ε", r"$\sigma_\varepsilon$"), ("σ²", r"$\sigma^2$"),
         ("N_h", "$N_h$"), ("P/N", "$P/N$"), ("λ", r"$\lambda$"), ("μ", r"$\mu$"), ("σ", r"$\sigma$"),
         ("ψ", r"$\psi$"), ("τ", r"$\tau$"), ("Δ²", r"$\Delta^2$"))


def math_text(text: str) -> str:
    """``text`` with its Greek symbols and subscripts (λ, μ, σ², σ_ε, N_h, P/N, ψ, τ) in mathtext;
    a text that already holds mathtext (a ``$``) is returned as it is."""
    if "$" in text:
        return text
    for plain, math in _MATH:
        text = text.replace(plain, math)
    return text.replace("$$", "")  # adjacent symbols in one math run


def shown_units(attrs: dict) -> str:
    """The units a label shows: the model's units (``model_units``: steps, loss, …) where the
    variable's CF ``units`` is the dimensionless ``1``, else ``units``."""
    return str(attrs.get("model_units", attrs.get("units", "")))


def unit_suffix(units: object) -> str:
    """`` [units]`` for a unit of :data:`REAL_UNITS`, else nothing."""
    return f" [{units}]" if str(units) in REAL_UNITS else ""


def axis_label(attrs: dict, name: str, dtype_kind: str = "f") -> str:
    """``long name [units]`` of a variable from its attributes, the long name in mathtext
    (:func:`math_text`), with the units only when they are real (:data:`REAL_UNITS`).
    ``dtype_kind`` is kept for callers that pass it; every quantity follows the same rule."""
    return math_text(str(attrs.get("long_name", name))) + unit_suffix(shown_units(attrs))


def integer_ticks(ax, values: np.ndarray, max_ticks: int = 12) -> None:
    """Ticks of ``ax``'s x axis at exactly the integer ``values`` drawn (when there are at most
    ``max_ticks``), so that an integer axis shows no fractional ticks."""
    unique = np.unique(np.asarray(values)[np.isfinite(np.asarray(values, float))])
    if 0 < unique.size <= max_ticks:
        ax.set_xticks(unique, [f"{int(v)}" for v in unique])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
