"""A fit job takes the fits of groups whose points and settings did not change from the previous
fits (sgdsweep.analysis.fit.cache) and fits the others: the results are those of fits made from
nothing, whatever changed, and a damaged or planted entry is fitted again."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from test_report import _ensemble, _with_momentum

from sgdsweep.analysis.fit import fit_ensemble
from sgdsweep.analysis.fit.cache import GROUPS_FILE, MAX_GROUPS_BYTES, FitCache

SETTINGS = {"confidence": 0.95, "bootstrap": 100}


def _text(fits) -> str:
    return json.dumps(fits, indent=1)


def _cached(ds, tmp_path, settings=SETTINGS) -> tuple[str, FitCache]:
    cache = FitCache(tmp_path / "cache")
    fits = fit_ensemble(ds, settings, cache)
    cache.save()
    return _text(fits), cache


def test_only_groups_whose_points_or_settings_changed_are_fitted_again(tmp_path):
    ds = _with_momentum(_ensemble(1.0), values=(0.0, 0.3, 0.6))
    first, cache = _cached(ds, tmp_path)
    assert first == _text(fit_ensemble(ds, SETTINGS))
    groups = cache.made
    assert groups >= 6 and cache.reused == 0  # power_law and linear_scaling per momentum, momentum_scaling
    again, cache = _cached(ds, tmp_path)
    assert again == first and (cache.made, cache.reused) == (0, groups)

    # what describes the whole sweep (its config and grid, size, when and where it was built): reused;
    # what a fit reads (the swept axes, the value of an axis not swept): fitted again
    rebuilt = ds.assign_attrs(created_utc="another day", points_digest="another", code_version="another",
                              title="ensemble (200 points)", config='{"grid": {}}', history="built again")
    assert _cached(rebuilt, tmp_path)[1].made == 0
    assert _cached(ds.assign_attrs(samples_per_param=8.0), tmp_path)[1].reused == 0
    assert _cached(ds, tmp_path)[1].reused == 0  # the previous job's groups only: those are gone
    # a momentum value more: its groups are fitted, and the fits over every momentum
    grown = _with_momentum(_ensemble(1.0), values=(0.0, 0.3, 0.6, 0.8))
    text, cache = _cached(grown, tmp_path)
    assert text == _text(fit_ensemble(grown, SETTINGS))
    assert cache.reused == groups - 1 and cache.made == 3  # power_law, linear_scaling at 0.8; momentum_scaling
    # one point measured again in the group at μ = 0.3: that group's fits and momentum_scaling
    moved = grown.copy(deep=True)
    at = int(np.flatnonzero(moved["momentum"].values == 0.3)[2])
    moved["weight_var"][at] *= 1.02
    text, cache = _cached(moved, tmp_path)
    assert text == _text(fit_ensemble(moved, SETTINGS)) and cache.made == 3
    # other settings: every group again
    other = {**SETTINGS, "confidence": 0.9}
    text, cache = _cached(moved, tmp_path, other)
    assert text == _text(fit_ensemble(moved, other)) and cache.reused == 0
    # the cache keeps the last job's groups only, in one file
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [GROUPS_FILE]
    assert len(json.loads((tmp_path / "cache" / GROUPS_FILE).read_text())) == cache.made


def test_a_damaged_or_planted_entry_is_fitted_again_and_a_link_is_not_followed(tmp_path):
    ds = _with_momentum(_ensemble(1.0), values=(0.0, 0.5))
    expected = _text(fit_ensemble(ds, SETTINGS))
    _cached(ds, tmp_path)
    file = tmp_path / "cache" / GROUPS_FILE
    stored = json.loads(file.read_text())
    keys = list(stored)
    stored[keys[0]]["result"]["params"] = {"a": {"estimate": 0.5}}  # edited: no longer its SHA-256
    stored[keys[1]] = {"sha256": "0" * 64}  # no result
    stored[keys[2]] = ["not", "an", "entry"]
    forged = {"params": "not a fit"}  # its digest right, its shape not a fit's: fitted again
    stored[keys[3]] = {"sha256": hashlib.sha256(json.dumps(forged).encode()).hexdigest(), "result": forged}
    file.write_text(json.dumps(stored))
    text, cache = _cached(ds, tmp_path)
    assert text == expected and cache.made == 4
    assert _cached(ds, tmp_path)[1].made == 0  # stored anew
    # a file that is no JSON, is deeper than json parses, or a FIFO (a plain read would wait
    # forever): an empty cache
    for plant in ("{truncated", "[" * 100000 + "]" * 100000, None):
        file.unlink()
        if plant is None:
            os.mkfifo(file)
        else:
            file.write_text(plant)
        text, cache = _cached(ds, tmp_path)
        assert text == expected and cache.reused == 0 and file.is_file()

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / GROUPS_FILE).write_text("not ours")
    (tmp_path / "cache").rename(tmp_path / "old")
    (tmp_path / "cache").symlink_to(victim)
    text, cache = _cached(ds, tmp_path)
    assert text == expected and cache.reused == 0
    assert not (tmp_path / "cache").is_symlink() and (victim / GROUPS_FILE).read_text() == "not ours"


def test_a_replica_table_with_point_second_is_fitted_without_the_cache(tmp_path):
    """The fits read rows (point first): a variable laid out otherwise is not keyed as read, so
    the job makes every fit (a change in one group's replicas must not reuse another's fit)."""
    ds = _with_momentum(_ensemble(1.0), values=(0.0, 0.3))
    ds["weight_var_replica"] = ds["weight_var_replica"].transpose("replica", "point")
    text, cache = _cached(ds, tmp_path)
    assert text == _text(fit_ensemble(ds, SETTINGS)) and cache.reused == 0
    assert _cached(ds, tmp_path)[1].reused == 0


def test_an_oversized_cache_file_counts_as_empty(tmp_path):
    ds = _ensemble(1.0)
    expected, _ = _cached(ds, tmp_path)
    with open(tmp_path / "cache" / GROUPS_FILE, "a") as fh:
        fh.truncate(MAX_GROUPS_BYTES + 1)  # beyond the bound: not parsed
    text, cache = _cached(ds, tmp_path)
    assert text == expected and cache.reused == 0 and cache.made > 0


def test_a_fit_with_an_unwritable_cache_is_made_as_without(tmp_path):
    ds = _ensemble(1.0)
    (tmp_path / "cache").write_text("a file where the cache would be")
    text, cache = _cached(ds, tmp_path)
    assert text == _text(fit_ensemble(ds, SETTINGS)) and cache.made > 0 and (tmp_path / "cache").is_file()
