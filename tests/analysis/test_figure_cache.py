"""A rebuilt report takes the figures whose inputs did not change from the previous report's
(sgdsweep.analysis.figure_cache) and draws the others: the page and the figure files are those of
a report built from nothing, whatever changed, and a damaged or planted entry is drawn again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from conftest import REPO
from test_report import SPEC, _ensemble

from sgdsweep.analysis import figure_cache, report
from sgdsweep.analysis.figures import shard_times
from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.plotting import plt


def _counting(calls: list[list[str]]):
    """:func:`report._render`, appending to ``calls`` the names of the figures it draws, per
    build (not those of figure functions that find nothing to draw)."""
    real = report._render

    def counting(todo, pool, svg=False):
        out = real(todo, pool, svg)
        calls.append([make.__name__ for (make, _), data in zip(todo, out) if data is not None])
        return out

    return counting


@pytest.fixture
def drawn(monkeypatch):
    """The names of the figures :func:`report._render` draws, per build (:func:`_counting`)."""
    calls: list[list[str]] = []
    monkeypatch.setattr(report, "_render", _counting(calls))
    return calls


def _fresh(ds, fits, spec, tmp_path, name, files=False):
    """The page of a report built without a cache, and with ``files`` its figure files (PNG and
    SVG; without, the page alone, which embeds the PNGs, is cheaper: no SVG is drawn)."""
    out = tmp_path / name if files else None
    page = report.build_report(ds, fits, spec, figures_dir=out)
    return page, {p.name: p.read_bytes() for p in out.iterdir()} if files else None


def _cached(ds, fits, spec, tmp_path, name, files=False):
    """:func:`_fresh` of a report built with the cache ``tmp_path / "cache"``."""
    out = tmp_path / name if files else None
    page = report.build_report(ds, fits, spec, figures_dir=out, figure_cache=tmp_path / "cache")
    return page, {p.name: p.read_bytes() for p in out.iterdir()} if files else None


def _entries(tmp_path):
    return sorted(p.name for p in (tmp_path / "cache").iterdir())


class Warm(NamedTuple):
    """What the tests of a rebuilt report start from (:func:`warm`)."""

    ds: Any  #: the synthetic ensemble
    fits: dict[str, Any]  #: its fits (confidence 0.95, 100 bootstrap samples)
    cache: Path  #: the cache the first report left: copied by each test (:func:`cache`), never changed
    first: tuple  #: that first report's page and figure files (:func:`_cached`)
    fresh: tuple  #: the page and figure files of a report built without a cache (:func:`_fresh`)
    every: list[str]  #: the figures the first report drew (all of them: its cache was empty)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Warm:
    """One ensemble, its fits, the report built from them with an empty cache and the one built
    without a cache: built once for the module, as drawing every figure is what the tests here
    cost."""
    root = tmp_path_factory.mktemp("warm")
    ds = _ensemble(1.0)
    fits = fit_ensemble(ds, {"confidence": 0.95, "bootstrap": 100})
    calls: list[list[str]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "_render", _counting(calls))
        first = _cached(ds, fits, SPEC, root, "a", files=True)
    fresh = _fresh(ds, fits, SPEC, root, "fresh", files=True)
    return Warm(ds, fits, root / "cache", first, fresh, calls[0])


@pytest.fixture
def cache(warm, tmp_path) -> Path:
    """A copy of the warm cache at ``tmp_path / "cache"``, where :func:`_cached` builds with it."""
    return Path(shutil.copytree(warm.cache, tmp_path / "cache", symlinks=True))


def test_a_rebuilt_report_draws_only_the_figures_whose_inputs_changed(warm, cache, tmp_path, drawn):
    ds, fits = warm.ds, warm.fits
    assert warm.first == warm.fresh  # the first report, built with an empty cache
    every = warm.every
    assert len(every) >= 5 and len(_entries(tmp_path)) == len(every)

    # a new title: no figure changes, none is drawn, and the page is a fresh build's
    titled = {**SPEC, "report": {"title": "renamed"}}
    drawn.clear()
    assert _cached(ds, fits, titled, tmp_path, "b") == _fresh(ds, fits, titled, tmp_path, "f2")
    assert drawn[0] == []  # nothing asked of _render: the first call is the cached build's
    # other fit settings: the fits' figures are drawn, the ensemble's are taken from the cache
    refit = fit_ensemble(ds, {"confidence": 0.9, "bootstrap": 100})
    drawn.clear()
    assert _cached(ds, refit, SPEC, tmp_path, "c") == _fresh(ds, refit, SPEC, tmp_path, "fresh3")
    redrawn = drawn[0]
    assert "power_law" in redrawn and "weight_var_against_ratio" not in redrawn and "shard_times" not in redrawn
    # one measured value more precise: every figure that shows weight_var is drawn again
    moved = ds.copy(deep=True)
    moved["weight_var"][3] *= 1.01
    drawn.clear()
    assert _cached(moved, refit, SPEC, tmp_path, "d") == _fresh(moved, refit, SPEC, tmp_path, "fresh4")
    assert "weight_var_against_ratio" in drawn[0]
    # the cache keeps the last report's figures only
    assert len(_entries(tmp_path)) == len(every)


def test_a_damaged_entry_new_code_or_an_unusable_cache_draw_again(warm, cache, tmp_path, drawn, monkeypatch):
    ds, fits = warm.ds, warm.fits
    expected = (warm.fresh[0], None)  # the page of a report built without a cache
    first, second = _entries(tmp_path)[:2]
    png = tmp_path / "cache" / first / "figure.png"
    png.write_bytes(png.read_bytes()[:-10] + b"0123456789")  # damaged: its SHA-256 no longer matches
    (tmp_path / "cache" / second / "sha256.json").write_text("{not json")
    drawn.clear()
    assert _cached(ds, fits, SPEC, tmp_path, "b") == expected
    assert len(drawn[0]) == 2  # the two damaged entries, drawn and stored anew
    drawn.clear()
    assert _cached(ds, fits, SPEC, tmp_path, "c") == expected and drawn[0] == []

    # new code (another version of sgdsweep or of the libraries that draw): every figure drawn
    real = figure_cache.code_digest
    monkeypatch.setattr(figure_cache, "code_digest", lambda: "another version of the code")
    drawn.clear()
    assert _cached(ds, fits, SPEC, tmp_path, "new") == expected and drawn[0] and len(drawn[0]) == len(
        _entries(tmp_path))
    # then other matplotlib settings (a matplotlibrc), the code unchanged since: every figure
    # drawn, as it would look now
    with plt.rc_context({"lines.linewidth": 6}):
        drawn.clear()
        assert _cached(ds, fits, SPEC, tmp_path, "rc")[0] == _fresh(ds, fits, SPEC, tmp_path, "rc-fresh")[0]
        assert drawn[0] and len(drawn[0]) == len(_entries(tmp_path))
    monkeypatch.setattr(figure_cache, "code_digest", real)

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ("f" * 64)).mkdir()  # looks like an entry: never removed through the link
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    (tmp_path / "cache").symlink_to(victim)
    assert _cached(ds, fits, SPEC, tmp_path, "d") == expected
    assert not (tmp_path / "cache").is_symlink() and (victim / ("f" * 64)).is_dir()
    assert list(victim.iterdir()) == [victim / ("f" * 64)]
    # a cache that cannot be written (a file in its place) only costs the drawing
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").write_text("a file where the cache would be")
    drawn.clear()
    assert _cached(ds, fits, SPEC, tmp_path, "e") == expected and drawn[0] and (tmp_path / "cache").is_file()


def test_planted_entries_are_misses_that_never_block_and_a_shared_folder_keeps_what_is_not_the_caches(
        warm, cache, tmp_path):
    ds, fits = warm.ds, warm.fits
    folder = cache  # a folder given to --figure-cache that holds other things too
    (folder / ".bashrc").write_text("keep")
    (folder / ".git").mkdir()
    (folder / "notes.txt").write_text("keep")
    expected = (warm.fresh[0], None)  # the page of a report built without a cache
    _cached(ds, fits, SPEC, tmp_path, "a")  # with the folder's other things: every figure taken from the cache
    keys = [p.name for p in folder.iterdir() if len(p.name) == 64]
    assert len(keys) >= 3 and {".bashrc", ".git", "notes.txt"} <= {p.name for p in folder.iterdir()}
    fifo, zero, deep = (folder / k for k in keys[:3])
    os.unlink(fifo / "figure.png")
    os.mkfifo(fifo / "figure.png")  # would block a plain read forever
    sums = json.loads((zero / "sha256.json").read_text())
    (zero / "sha256.json").write_text(json.dumps({**sums, "/dev/zero": "0" * 64}))  # a name outside the entry
    (deep / "sha256.json").write_text("[" * 100000 + "]" * 100000)  # deeper than json can parse
    assert figure_cache.FigureCache(folder).get(keys[0], True) is None
    assert _cached(ds, fits, SPEC, tmp_path, "b") == expected
    assert {".bashrc", ".git", "notes.txt"} <= {p.name for p in folder.iterdir()}
    assert (folder / ".bashrc").read_text() == "keep"


def test_the_code_digest_is_taken_as_the_code_is_imported(monkeypatch):
    """A source file saved while a report runs does not pass for the code that drew its figures:
    the digest is taken once, as the module is imported, and no file is read for it later."""
    before = figure_cache.code_digest()

    def no_reading(*args):
        raise AssertionError("a source file read after the import")

    monkeypatch.setattr(Path, "read_bytes", no_reading)
    monkeypatch.setattr(Path, "read_text", no_reading)
    assert figure_cache.code_digest() == before


_DIGEST = """
import sys
sys.path.insert(0, {tests!r}); sys.path.insert(0, {analysis!r})
from test_report import _ensemble
from sgdsweep.analysis.figure_cache import digest_of, figure_key
from sgdsweep.analysis.figures import shard_times
print(digest_of(_ensemble(1.0)), figure_key(shard_times, (_ensemble(1.0),)))
"""


def test_the_key_is_the_value_of_the_inputs_in_any_process():
    ds = _ensemble(1.0)
    code = _DIGEST.format(tests=str(REPO / "tests"), analysis=str(REPO / "tests" / "analysis"))
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [figure_cache.digest_of(ds), figure_cache.figure_key(shard_times, (ds,))]

    base = figure_cache.digest_of(ds)
    changed = [ds.assign_attrs(sweep="other"), ds.rename({"weight_var_se": "weight_var_err"}),
               ds.assign(burn_in=ds["burn_in"].astype(np.int32)), ds.isel(point=slice(0, 15)),
               ds.assign_coords(lr=ds["lr"] * (1 + 1e-15))]
    assert len({base, *(figure_cache.digest_of(c) for c in changed)}) == 1 + len(changed)
    # a dict in its order (a figure's labels follow it); lists, tuples and numbers by their type
    assert figure_cache.digest_of({"a": 1, "b": [1.0, None]}) != figure_cache.digest_of({"b": [1.0, None], "a": 1})
    assert figure_cache.digest_of([1]) != figure_cache.digest_of((1,)) != figure_cache.digest_of([1.0])
    assert figure_cache.figure_key(shard_times, (ds,)) != figure_cache.figure_key(shard_times, (ds.isel(point=[0]),))
    assert figure_cache.figure_key(shard_times, (object(),)) is None  # no digest: never cached
    names = np.array(["p0", "p1", None], dtype=object)
    assert figure_cache.digest_of(names) != figure_cache.digest_of(np.array(["p0", "p1", "None"], dtype=object))
    with pytest.raises(figure_cache.Uncacheable):  # a set has no order to digest in
        figure_cache.digest_of(np.array([{1, 2}], dtype=object))
    def holding(item) -> np.ndarray:  # an object array of one item
        out = np.empty(1, dtype=object)
        out[0] = item
        return out

    mixed = [holding((1, 2)), holding([1, 2]), holding({1: 0}), holding({"1": 0}), holding("\ud800")]
    assert len({figure_cache.digest_of(a) for a in mixed}) == len(mixed)  # a lone surrogate too
    fields = [np.zeros(2, dtype=[("a", "f8"), ("b", "f8")]), np.zeros(2, dtype=[("c", "f8"), ("d", "f8")])]
    assert figure_cache.digest_of(fields[0]) != figure_cache.digest_of(fields[1])  # same bytes, other fields
    with pytest.raises(figure_cache.Uncacheable):  # a mask is not in the bytes
        figure_cache.digest_of(np.ma.masked_array([1.0, 2.0], mask=[True, False]))
    # one dataset shown by many figures is digested once (by its id), to the same keys
    memo: dict[int, str] = {}
    assert figure_cache.figure_key(shard_times, (ds,), memo) == figure_cache.figure_key(shard_times, (ds,), memo)
    assert list(memo) == [id(ds)]


def test_a_new_group_leaves_the_other_groups_fit_figures_cached(tmp_path, drawn):
    """Points of a new momentum: every group's Holm-adjusted p-values and the sweep's attributes
    change, but neither is drawn in a group's fit figure, so only the new group's are drawn (and
    the figures that show the whole ensemble); the page is a fresh build's."""
    import xarray as xr

    def grown(momenta):
        parts = [_ensemble(1.05, seed=i).assign_coords(momentum=("point", np.full(16, mu)),
                                                      point=[f"m{i}p{j}" for j in range(16)])
                 for i, mu in enumerate(momenta)]
        ds = xr.concat(parts, dim="point")
        ds.attrs.update(swept_axes='["lr", "batch_size", "momentum"]', points_digest=str(len(momenta)))
        return ds, fit_ensemble(ds, {"confidence": 0.95, "bootstrap": 50})

    ds, fits = grown([0.0, 0.5])
    _cached(ds, fits, SPEC, tmp_path, "a")
    assert drawn[0].count("power_law") == 2
    more, refits = grown([0.0, 0.5, 0.8])
    assert fits["power_law"][0]["params"]["a"]["pvalue_holm"] != refits["power_law"][0]["params"]["a"]["pvalue_holm"]
    drawn.clear()
    assert _cached(more, refits, SPEC, tmp_path, "b") == _fresh(more, refits, SPEC, tmp_path, "fresh")
    # the new group's power law and linear collapse, and the momentum collapse over every group
    assert drawn[0].count("power_law") == 1 and drawn[0].count("collapse") == 2, drawn[0]
    assert "weight_var_against_ratio" in drawn[0]
