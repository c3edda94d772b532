"""A replica's random streams: made without spawning, the same generators as ``spawn(3)``; those a
lane does not draw from are not made, and a point's results do not change."""

from __future__ import annotations

import numpy as np

from sgdsweep.core.identity import hash_words
from sgdsweep.run.simulate import simulate_points
from sgdsweep.sim.noise import lane_streams
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import build_sweep


def test_streams_are_those_of_spawn_and_only_the_needed_are_made():
    words = hash_words("0123abcd4567ef89")
    spawned = [[np.random.default_rng(c) for c in np.random.SeedSequence([7, *words, r]).spawn(3)] for r in range(3, 6)]
    ours = replica_streams(7, "0123abcd4567ef89", 6, start=3)
    assert [[g.bit_generator.state for g in gens] for gens in ours] == \
        [[g.bit_generator.state for g in gens] for gens in spawned]
    parent = np.random.SeedSequence(11, spawn_key=(2,))
    assert [g.bit_generator.state for g in lane_streams(parent)] == \
        [np.random.default_rng(c).bit_generator.state for c in np.random.SeedSequence(11, spawn_key=(2,)).spawn(3)]
    uniforms_only = replica_streams(7, "0123abcd4567ef89", 6, start=3, needed=(True, False, False))
    assert all(g[1] is None and g[2] is None for g in uniforms_only)
    assert [g[0].bit_generator.state for g in uniforms_only] == [g[0].bit_generator.state for g in spawned]


def test_a_point_is_the_same_whichever_generators_are_made(tmp_path, monkeypatch):
    """Every noise family (sample selection, added normals, both) with a zero and a random start:
    every array and attribute of the stores (but the time taken) is bitwise that made with all
    three generators of every replica."""
    from sgdsweep.run import simulate

    configs = [
        {"model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
         "grid": {"lr": [0.1, 0.2], "batch_size": 3, "samples_per_param": 4.0, "noise": ["minibatch", "label"]}},
        {"model": {"kind": "quadratic", "curvatures": [1.0, 2.0], "noise_cov": [1.0, 0.5]},
         "grid": {"lr": 0.2, "batch_size": 1, "noise": "gaussian"}},
        {"model": {"kind": "two_layer", "n_inputs": 3},
         "grid": {"lr": 0.05, "batch_size": 2, "samples_per_param": 4.0, "hidden_width": 2, "noise": "minibatch"}},
    ]
    everything = simulate.replica_streams

    def all_three(*args, needed=None, **kwargs):
        return everything(*args, **kwargs)

    for i, cfg in enumerate(configs):
        sweep = build_sweep({"sweep": "t", "seed": 3, "dynamics": {"steps": 300, "replicas": 3, "burn_in": 50}, **cfg})
        groups: dict = {}
        for p in sweep.points:
            groups.setdefault(p.params["noise"], []).append(p.spec())
        for label, patch in (("lean", None), ("full", all_three)):
            if patch is not None:
                monkeypatch.setattr(simulate, "replica_streams", patch)
            for specs in groups.values():
                simulate_points(specs, str(tmp_path / f"{i}-{label}"))
            monkeypatch.undo()
        for p in sweep.points:
            lean, full = (point_store.point_path(tmp_path / f"{i}-{label}", p.hash) for label in ("lean", "full"))
            a, b = (point_store.read_arrays(path, [], prefixes=("",)) for path in (lean, full))
            same = all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True) for k in a)
            assert sorted(a) == sorted(b) and same, (cfg["model"]["kind"], p.params["noise"])
            attrs = [{k: v for k, v in point_store.read_attrs(path).items() if k != "simulation_seconds"}
                     for path in (lean, full)]
            assert attrs[0] == attrs[1]
