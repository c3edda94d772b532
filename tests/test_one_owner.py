"""Each concept has one owner that the rest of the package reads: the noise types' properties
(sgdsweep.core.noise_types), what may vary within one engine call (the engine's
BATCH_VARYING), the names and attributes of stored variables (sgdsweep.store.variables)."""

from __future__ import annotations

import ast
import copy
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


def _theory_points() -> list[tuple[dict, object]]:
    """Predictions whose formulas and reasons name every kind of theory quantity: the linear
    model with and without momentum (exact, continuous-time and detailed-balance theories, test
    loss), two_layer with one output (joint eigenvalue, W2's spectrum), both landscapes with each
    escape law (the double well's exact chain solved, the thesis landscape's not: seconds)."""
    from sgdsweep import models
    from sgdsweep.models.predict import predict
    from sgdsweep.sweep.config import build_sweep

    configs = [({"kind": "linear", "n_inputs": 3}, {"lr": 0.1, "batch_size": 2, "samples_per_param": 4,
                                                    "momentum": [0.0, 0.5]}, {}),
               ({"kind": "two_layer", "n_inputs": 3, "n_outputs": 1, "labels": "teacher"},
                {"lr": 0.05, "batch_size": 2, "samples_per_param": 5, "hidden_width": 2}, {}),
               ({"kind": "landscape", "barrier": 0.35, "curvature_min": 2.6, "curvature_saddle": 0.9,
                 "noise_std": 1.3}, {"lr": 0.346, "batch_size": 3, "noise": ["gaussian", "student_t"]}, {}),
               ({"kind": "landscape", "landscape": "thesis"},
                {"lr": 3.2e-3, "batch_size": 2, "noise": ["gaussian", "minibatch"]}, {"observe": {"escape": False}})]
    out = []
    for model, grid, dynamics in configs:
        sweep = build_sweep({"sweep": "names", "seed": 5, "model": model, "grid": grid,
                             "dynamics": {"burn_in": 0, **dynamics}})
        out += [(p.params, predict(models.make_problem(p.params), p.params)) for p in sweep.points]
    return out


def test_a_theory_quantity_has_one_name_for_its_field_its_formula_and_its_column():
    """The name of a theory quantity is its Prediction field's, the key of its formula and reason,
    and, with ``_theory`` after the observable, its stored column (theory_column/theory_name): no
    table translates one into another. Only columns computed from a predicted covariance
    (DERIVED_THEORY) carry another quantity's formula, and that quantity is a Prediction field."""
    import dataclasses

    from sgdsweep.models.predict import Prediction, theory_column, theory_name
    from sgdsweep.store import variables as v

    fields = {f.name for f in dataclasses.fields(Prediction)}
    for column in v.THEORY_COLUMNS:
        assert column in v.VARIABLES or v.layer_vector(column), column  # a stored variable
        assert v.theory_source(column) == v.DERIVED_THEORY.get(column, theory_name(column)), column
    assert set(v.DERIVED_THEORY) <= set(v.THEORY_COLUMNS) and set(v.DERIVED_THEORY.values()) <= fields
    assert theory_column("escape_time", "arrhenius") == "escape_time_theory_arrhenius"
    assert theory_name("escape_time_theory_arrhenius") == "escape_time_arrhenius" in fields
    assert theory_name(theory_column("loss")) == "loss" and theory_name("weight_cov_theory") == "weight_cov"
    with pytest.raises(ValueError, match="no '_theory'"):
        theory_name("escape_time")
    sources = {v.theory_source(column) for column in v.THEORY_COLUMNS}
    seen = set()
    for params, pred in _theory_points():
        for key in {**pred.formulas, **pred.reasons}:
            seen.add(key)
            # a formula or reason is filed under a name some stored column derives by the rule
            assert key in sources, (key, params)
        for key in pred.formulas:  # a quantity with a formula and a field of its own holds its value there
            if key in fields and key not in v.DERIVED_THEORY.values():
                assert getattr(pred, key) is not None, (key, params)
    # every kind of quantity was predicted at least once, the approximations, W2 and each escape law included
    assert {"loss", "weight_cov_eigenvalues_detailed_balance", "q_eigenvalues_continuous",
            "layer_cov_eigenvalues_W2", "joint_eigenvalue", "test_loss",
            *(f"escape_time_{law}" for law in ("arrhenius", "powerlaw", "exact", "exact_matched"))} <= seen
    # stores written before keyed three formulas otherwise: read under the quantities' names
    assert set(v.EARLIER_THEORY_KEYS.values()) <= sources
    assert v.theory_entries({"q_continuous": "f", "loss": "g"}) == {"q_eigenvalues_continuous": "f", "loss": "g"}


def test_each_landscape_answers_its_own_escape_theory():
    """The predict dispatcher asks the model's ``escape`` hook (no ``hasattr`` test of the problem):
    the landscape model hands the question to its problem, the double well answering with Kramers'
    1-D law and its 1-D exact chain (never a power law: its noise is additive), the thesis landscape
    with the halved Eyring–Kramers time and Mori's law; every other model keeps the default (no
    escape theory), even a problem that happens to have a ``barrier``."""
    from sgdsweep import models
    from sgdsweep.models import defaults, landscape
    from sgdsweep.models.escape import NO_POWERLAW
    from sgdsweep.models.predict import predict
    from sgdsweep.theory.escape import FORMULA

    assert "hasattr" not in (PACKAGE / "models" / "predict.py").read_text()
    assert models.hook(landscape, "escape") is landscape.escape
    for cls in (landscape.DoubleWell, landscape.Thesis):
        assert {"escape_theory", "exact_escape"} <= set(vars(cls)), cls
    assert all(models.hook(m, "escape") is defaults.escape for k, m in models.MODELS.items() if k != "landscape")

    by_landscape = {}
    for params, pred in _theory_points():
        if params["model"] == "landscape" and params["noise"] == "gaussian":
            by_landscape[params["landscape"]] = pred
    well, thesis = by_landscape["double_well"], by_landscape["thesis"]
    assert well.formulas["escape_time_arrhenius"].startswith(FORMULA["kramers_steps"])
    assert well.escape_time_exact is not None and well.reasons["escape_time_powerlaw"] == NO_POWERLAW
    assert thesis.formulas["escape_time_arrhenius"].startswith("half the " + FORMULA["eyring_kramers_time"])
    assert thesis.escape_time_arrhenius is not None and "escape_time_exact" not in thesis.formulas

    params = build_point({"kind": "quadratic"}, {"lr": 0.1, "batch_size": 1})
    problem = copy.copy(models.make_problem(params))  # a copy: problems are cached per process
    problem.barrier = 1.0  # an attribute of that name does not make a problem an escape problem
    pred = predict(problem, {**params, "observe": {**params["observe"], "escape": True}})
    assert pred.escape_time_arrhenius is None and not any(k.startswith("escape_time") for k in pred.reasons)


def build_point(model: dict, grid: dict) -> dict:
    """The parameters of the one point of a sweep of ``model`` on ``grid``."""
    from sgdsweep.sweep.config import build_sweep

    return build_sweep({"sweep": "one", "model": model, "grid": grid, "dynamics": {"burn_in": 0}}).points[0].params
