"""Each concept has one owner that the rest of the package reads: the noise types' properties
(sgdsweep.core.noise_types), what may vary within one engine call (the engine's
BATCH_VARYING), the names and attributes of stored variables (sgdsweep.store.variables)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sgdsweep.core import noise_types as nt

PACKAGE = Path(__file__).resolve().parents[1] / "sgdsweep"
SHORT = {"steps": 200, "replicas": 2, "burn_in": 50}


def test_simulation_reads_the_noise_registry_not_copies_of_it():
    """The sample-selection modes, Student-t's ν, the kernels' added-noise codes and their
    lists of noise types are the registry's, not literals kept beside it."""
    from sgdsweep.sim import noise, shapes, tangent
    from sgdsweep.sim.kernels import additive, common

    assert shapes.MODE is nt.MODE and noise.MODE is nt.MODE
    assert noise.STUDENT_NU == nt.NOISE["student_t"].nu == 4
    assert [n for n, t in nt.NOISE.items() if t.nu is not None] == ["student_t"]
    assert set(common.ADDED_CODE) == set(nt.ADDED_NOISE)
    assert {common.ADDED_CODE[n] for n in nt.ADDED_NOISE} == {1, 2, 3}
    assert all(common.ADDED_CODE[n] == common.added_code(nt.NOISE[n]) for n in nt.ADDED_NOISE)
    assert tangent.MATCHED is nt.MATCHED_ADDED_NOISE and additive.NOISE is nt.DATA_FREE_NOISE


def _noise_name_literals(path: Path) -> list[str]:
    """Tuple, list, set and dict-key literals of ``path`` that hold two or more noise-type names."""
    names = set(nt.ALL)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) or elts is None:
            continue
        hits = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(hits) >= 2:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {hits}")
    return found


def test_no_simulation_module_lists_noise_types_by_name():
    """A list of noise types in the simulation is chosen from the registry by its properties,
    so a new noise type or a changed property reaches every kernel."""
    found = [hit for path in sorted((PACKAGE / "sim").rglob("*.py")) for hit in _noise_name_literals(path)]
    assert found == []


def test_the_engine_owns_what_varies_within_one_call(tmp_path):
    """The shard job's grouping and the task's check read the engine's BATCH_VARYING, and a
    mixed batch is refused naming the parameter and what may vary."""
    from sgdsweep.run import execute
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.sim import engine, shapes
    from sgdsweep.sweep.config import build_sweep

    assert execute.BATCH_VARYING is engine.BATCH_VARYING is shapes.BATCH_VARYING
    sweep = build_sweep({"sweep": "mix", "results_dir": str(tmp_path), "model": {"kind": "linear", "n_inputs": 3},
                         "dynamics": SHORT, "grid": {"lr": [0.1, 0.2], "momentum": [0.0, 0.3], "batch_size": [1, 2],
                                                     "samples_per_param": 4}})
    specs = [p.spec() for p in sweep.points]
    batches = execute.make_batches(specs, 8)
    assert sorted(len(b) for b in batches) == [4, 4]  # lr × momentum share a call; batch_size does not
    with pytest.raises(ValueError, match=r"differ in \['batch_size'\].*everything but lr, momentum, replicas"):
        simulate_points(specs, str(tmp_path / "points"))


def test_a_point_array_missing_from_the_catalogue_is_refused(tmp_path, monkeypatch):
    """Every array a point store holds is described by sgdsweep.store.variables; an array no
    table names (a misspelt variable) stops the task with its name, and no store is written."""
    from sgdsweep.run import simulate
    from sgdsweep.store import points as point_store
    from sgdsweep.store.variables import point_array_attrs
    from sgdsweep.sweep.config import build_sweep

    assert point_array_attrs("weight_cov")["long_name"] == "weight covariance"  # a point store's own matrix
    assert point_array_attrs("weight_var_replica")["long_name"] == "weight variance per replica"
    assert point_array_attrs("layer_cov_eigenvalues_W1")["cell_methods"]  # generated per layer
    with pytest.raises(KeyError, match="'weight_vra_replica'.*sgdsweep.store.variables"):
        point_array_attrs("weight_vra_replica")

    sweep = build_sweep({"sweep": "cat", "results_dir": str(tmp_path), "model": {"kind": "linear", "n_inputs": 3},
                         "dynamics": SHORT, "grid": {"lr": 0.1, "batch_size": 2, "samples_per_param": 4}})
    spec = sweep.points[0].spec()
    simulate.simulate_points([spec], str(tmp_path / "good"))
    with point_store.PointStore(point_store.point_path(tmp_path / "good", spec["hash"])) as store:
        assert all(attrs.get("long_name") and attrs.get("description") for _, attrs in store.arrays.values())

    real = simulate.point_result

    def misspelt(*args, **kwargs):
        arrays, summary = real(*args, **kwargs)
        arrays["weight_vra_replica"] = arrays.pop("weight_var_replica")
        return arrays, summary

    monkeypatch.setattr(simulate, "point_result", misspelt)
    with pytest.raises(KeyError, match="weight_vra_replica"):
        simulate.simulate_points([spec], str(tmp_path / "bad"))
    assert not point_store.point_path(tmp_path / "bad", spec["hash"]).exists()


def test_affine_problems_keep_no_unused_noise_covariance():
    from sgdsweep.models.affine import AffineProblem

    assert not hasattr(AffineProblem, "minibatch_noise_covariance")
