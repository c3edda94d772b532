"""Point identity (content hashes) and sharding."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from conftest import STREAM_VERSION_ENV, tiny_config

from sgdsweep.core.identity import HashTemplate, canonical_json, content_hash
from sgdsweep.sweep.config import build_sweep


def test_key_order_and_float_spelling_do_not_change_the_hash():
    a = {"lr": 0.1, "batch_size": 4, "noise": "minibatch"}
    b = {"noise": "minibatch", "batch_size": 4, "lr": 1e-1}
    c = {"batch_size": 4, "lr": float("0.10"), "noise": "minibatch"}
    assert content_hash(a) == content_hash(b) == content_hash(c)
    assert canonical_json(a) == canonical_json(b)


def test_different_values_change_the_hash():
    base = {"lr": 0.1, "batch_size": 4}
    assert content_hash(base) != content_hash({"lr": 0.1000001, "batch_size": 4})
    assert content_hash(base) != content_hash({"lr": 0.1, "batch_size": 5})
    assert content_hash(base) != content_hash({"lr": 0.1, "batch_size": 4, "momentum": 0.0})


def test_a_hash_template_gives_content_hash_for_every_value():
    """A data set's template writes each point's numbers into the once-encoded JSON of the rest: the
    digest must be content_hash's for every number json writes, every key's place, and anything
    else (booleans, NumPy scalars, strings, a missing or an extra key) through content_hash
    itself; a non-finite float is refused alike (fails if a number is written otherwise than
    json writes it, or into the wrong place)."""
    varying = ("lr", "batch_size", "momentum", "replicas", "not_there")
    base = {"model": "linear", "seed": 0,
            "observe": {"noise_lags": [1, 2], "escape": False, "note": "a\x00b", "as text": "100% of %s %d"},
            "init": "zero", "z": None, "lr": 0.05, "batch_size": 4, "momentum": 0.0, "replicas": 16}
    template = HashTemplate(base, varying)
    assert template.text is not None and template.keys == ("batch_size", "lr", "momentum", "replicas")
    values = [0.0, -0.0, 1e-05, 1e16, 1e-300, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3, 12345.678, 1, 0, -1,
              10**30, True, np.float64(0.5), np.int64(3), "x", None]
    rng = random.Random(7)
    for _ in range(3000):
        point = {**base, **{k: rng.choice(values) if rng.random() < 0.5
                            else rng.uniform(-1e3, 1e3) * 10.0 ** rng.randint(-30, 30) for k in varying[:4]}}
        assert template.hash(point) == content_hash(point), point
    extra, renamed = {**base, "steps": 10}, {**{k: v for k, v in base.items() if k != "lr"}, "rate": 0.05}
    assert template.hash(extra) == content_hash(extra) and template.hash(renamed) == content_hash(renamed)
    swapped = {**{k: v for k, v in base.items() if k != "z"}, "y": None}  # as many keys, one of them another
    assert template.hash(swapped) == content_hash(swapped)
    twice = HashTemplate(base, ("lr", "lr", "replicas"))  # a key named twice is one key
    assert twice.hash({**base, "lr": 0.3}) == content_hash({**base, "lr": 0.3})
    with pytest.raises(ValueError, match="non-finite"):
        template.hash({**base, "lr": float("nan")})
    holds_marker = HashTemplate({**base, "init": "\x000\x00"}, varying)  # a value that is a marker itself
    assert holds_marker.text is None and holds_marker.hash(base) == content_hash(base)


def test_non_finite_values_are_refused():
    with pytest.raises(ValueError, match="non-finite"):
        content_hash({"lr": float("nan")})


def test_defaults_filled_before_hashing():
    explicit = tiny_config(dynamics={"burn_in": "auto", "init": "zero"}, grid={"momentum": 0.0, "noise": "minibatch"})
    implicit = tiny_config()
    assert [p.hash for p in build_sweep(explicit).points] == [p.hash for p in build_sweep(implicit).points]


def test_integer_and_float_spellings_of_a_float_key_hash_alike():
    a = build_sweep(tiny_config(grid={"lr": [1, 0.5], "batch_size": 2}, dynamics={"burn_in": 100}))
    b = build_sweep(tiny_config(grid={"lr": [1.0, 0.5], "batch_size": 2}, dynamics={"burn_in": 100}))
    assert [p.hash for p in a.points] == [p.hash for p in b.points]


def test_fit_report_and_execution_do_not_change_point_hashes():
    base = build_sweep(tiny_config())
    other = build_sweep(tiny_config(fit={"confidence": 0.9}, report={"title": "x"},
                                    execution={"workers": 1, "points_per_task": 1}))
    assert [p.hash for p in base.points] == [p.hash for p in other.points]
    assert base.sweep_hash == other.sweep_hash and base.config_hash != other.config_hash


def test_model_parameter_changes_every_hash():
    base = build_sweep(tiny_config())
    other = build_sweep(tiny_config(model={"label_noise": 0.3}))
    assert not {p.hash for p in base.points} & {p.hash for p in other.points}


def test_shards_group_points_sharing_data():
    sweep = build_sweep(tiny_config(grid={"samples_per_param": [10, 20], "momentum": [0.0, 0.5]}))
    assert len(sweep.points) == 16
    assert len(sweep.shards) == 2  # lr, batch_size and momentum vary inside a shard
    for points in sweep.shards.values():
        assert len({p.params["samples_per_param"] for p in points}) == 1
        assert len(points) == 8


@pytest.mark.skipif(bool(os.environ.get(STREAM_VERSION_ENV)), reason="the streams are reseeded on purpose")
def test_a_new_simulation_version_reruns_points_on_the_same_streams(monkeypatch):
    """The point hash moves with SIMULATION_VERSION (points rerun); the key of the random numbers
    does not: it is pinned here to the value SIMULATION_VERSION 3 gave, the one every result and
    statistical test of this repository was drawn with."""
    from sgdsweep.core import identity
    params = {"lr": 0.1, "batch_size": 8, "model": "linear", "seed": 0}
    assert identity.stream_hash(params) == "8ba3164855c90693"
    before = identity.content_hash(params)
    monkeypatch.setattr(identity, "SIMULATION_VERSION", identity.SIMULATION_VERSION + 1)
    assert identity.content_hash(params) != before
    assert identity.stream_hash(params) == "8ba3164855c90693"
