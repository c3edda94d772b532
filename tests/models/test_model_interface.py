"""A model is one module: every registered model module provides the interface that
``sgdsweep.models`` documents, the noise types are defined once (the schema's list is the
registry's), and a new model plugs into config, theory and results through its hooks alone."""

from __future__ import annotations

import copy
import inspect
import types
from pathlib import Path

import numpy as np
import pytest

from sgdsweep import models
from sgdsweep.core import noise_types
from sgdsweep.errors import ConfigError
from sgdsweep.models import defaults
from sgdsweep.models.base import KERNELS, Layer, Problem
from sgdsweep.sweep import grid as gridmod
from sgdsweep.sweep import schema
from sgdsweep.sweep.config import build_sweep

ROOT = Path(__file__).resolve().parents[2]

#: one point per problem class, and the kernel family it names
KERNEL_CASES = [
    ({"kind": "quadratic"}, {"lr": 0.1, "batch_size": 1}, "additive"),
    ({"kind": "linear", "n_inputs": 3}, {"lr": 0.1, "batch_size": 2, "samples_per_param": 5}, "affine"),
    ({"kind": "two_layer", "n_inputs": 3}, {"lr": 0.1, "batch_size": 2, "samples_per_param": 5, "hidden_width": 2},
     "two_layer"),
    ({"kind": "matrix"}, {"lr": 0.1, "batch_size": 2, "samples_per_param": 10}, "affine"),
    ({"kind": "landscape"}, {"lr": 0.1, "batch_size": 1}, "additive"),
    ({"kind": "landscape", "landscape": "thesis"}, {"lr": 1e-4, "batch_size": 1}, "thesis"),
    ({"kind": "digits"}, {"lr": 0.001, "batch_size": 5}, "affine"),
]


def test_the_schemas_noise_types_are_the_registrys():
    assert schema.load_schema()["$defs"]["noise"]["enum"] == list(noise_types.ALL)
    assert list(noise_types.NOISE) == list(noise_types.ALL)


def test_the_schemas_model_kinds_are_the_registered_modules():
    kinds = schema.load_schema()["properties"]["model"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(models.MODELS)


@pytest.mark.parametrize("kind", list(models.MODELS))
def test_every_model_module_provides_the_hooks(kind):
    model = models.MODELS[kind]
    missing = [name for name in models.REQUIRED if not hasattr(model, name)]
    assert not missing, f"{kind} lacks {missing}"
    assert set(model.AXES) <= set(gridmod.AXES)
    option_keys = set(schema.load_schema()["properties"]["model"]["properties"])
    assert set(model.OPTIONS) <= option_keys, set(model.OPTIONS) - option_keys
    assert model.NOISE_TYPES and set(model.NOISE_TYPES) <= set(noise_types.ALL)
    assert set(models.allowed_noise(model, model.OPTIONS)) <= set(model.NOISE_TYPES)
    for name in ("check_point", "data_params", "make_problem"):
        assert callable(getattr(model, name))
    observes = models.hook(model, "OBSERVES")
    assert isinstance(observes, frozenset) and observes <= {"gradient_noise", "escape"}
    # a module's own hook takes the default's arguments
    for name in ("check_dynamics", "theory", "escape", "stability_edge"):
        assert list(inspect.signature(models.hook(model, name)).parameters) == list(
            inspect.signature(getattr(defaults, name)).parameters)


def test_hook_names_only_defaulted_hooks():
    with pytest.raises(ValueError, match="not a defaulted model hook"):
        models.hook(models.MODELS["linear"], "theroy")


@pytest.mark.parametrize("model,grid,kernel", KERNEL_CASES, ids=[c[2] + "-" + c[0]["kind"] for c in KERNEL_CASES])
def test_every_problem_class_names_its_kernel_family(model, grid, kernel):
    sweep = build_sweep({"sweep": "k", "model": model, "grid": grid, "dynamics": {"burn_in": 10}})
    problem = models.make_problem(sweep.points[0].params)
    assert problem.kernel == kernel and problem.kernel in KERNELS
    assert set(problem.noise_types) <= set(noise_types.ALL)


def test_the_noise_subsets_are_the_lists_the_physics_uses():
    """Every subset is chosen by properties; these are the lists the models, the theory and the
    engine have always used."""
    from sgdsweep.models import landscape
    from sgdsweep.theory import escape_exact
    from sgdsweep.theory import linear as linear_theory

    nt = noise_types
    assert nt.SAMPLING_NOISE == ("minibatch", "minibatch_replace", "epoch", "label")
    assert nt.ADDED_NOISE == ("gaussian", "gaussian_matched", "student_t")
    assert nt.SDE_NOISE == ("gaussian", "gaussian_matched")
    assert nt.DATA_FREE_NOISE == ("gaussian", "student_t")
    assert nt.UNLABELLED_NOISE == ("minibatch", "minibatch_replace", "epoch", "gaussian", "gaussian_matched",
                                   "student_t")
    assert nt.MINIBATCH_NOISE == escape_exact.SAMPLED == ("minibatch", "minibatch_replace")
    assert linear_theory.NOISE_TYPES == ("minibatch", "minibatch_replace", "label", "gaussian",
                                         "gaussian_matched", "student_t")
    assert [linear_theory._scheme(n) for n in linear_theory.NOISE_TYPES] == [
        "without", "with", "without", "none", "without", "without"]
    assert landscape.LOCAL_NOISE == ("minibatch", "minibatch_replace", "gaussian_matched")
    assert models.MODELS["two_layer"].NOISE_TYPES == tuple(n for n in nt.ALL if n != "gaussian")
    with pytest.raises(TypeError, match="no noise-type property"):
        nt.select(gausian=True)


# ---- a model added as one module ------------------------------------------------------------


class Spring(Problem):
    """½ k w² in one dimension with additive noise of unit variance per sample."""

    kind = "spring"
    dim = 1
    noise_types = noise_types.DATA_FREE_NOISE

    def __init__(self, k: float) -> None:
        self.k = k
        self.w_min = np.zeros(1)
        self.noise_cov = np.eye(1)
        self.layers = (Layer("w", 0, 1, 1),)

    def grad(self, w, idx=None, label_eps=None):
        return self.k * w

    def loss(self, w):
        return 0.5 * self.k * w[:, 0] ** 2

    def curvatures(self):
        return np.array([self.k])


def _spring_module() -> types.ModuleType:
    spring = types.ModuleType("spring")
    spring.AXES = ("lr", "batch_size", "momentum", "noise")
    spring.OPTIONS = {"stiffness": 2.0}
    spring.NOISE_TYPES = noise_types.DATA_FREE_NOISE
    spring.OBSERVES = frozenset({"escape"})
    spring.check_point = lambda params, where: None
    spring.data_params = lambda params: {"model": "spring", "stiffness": params["stiffness"]}
    spring.make_problem = lambda d: Spring(float(d["stiffness"]))

    def check_dynamics(params, where):
        if params["momentum"] > 0.5:
            raise ConfigError("grid.momentum", params["momentum"], "at most 0.5 for spring", f"At {where}.")

    def theory(problem, params, pred, step, gain):  # SGD on ½kw²: λ²C/S / (1 − (1 − λk)²)
        var = step**2 * gain / params["batch_size"] / (1 - (1 - step * problem.k) ** 2)
        pred.weight_cov = np.array([[var]])
        pred.loss = 0.5 * problem.k * var
        pred.hessian, pred.noise_cov = np.array([[problem.k]]), np.eye(1) / params["batch_size"]

    spring.check_dynamics, spring.theory = check_dynamics, theory
    return spring


@pytest.fixture
def spring_registered(monkeypatch):
    """The spring module registered as ``model.kind spring``, its option in the schema."""
    patched = copy.deepcopy(schema.load_schema())
    section = patched["properties"]["model"]["properties"]
    section["kind"]["enum"].append("spring")
    section["stiffness"] = {"type": "number", "exclusiveMinimum": 0}
    monkeypatch.setattr(schema, "load_schema", lambda: patched)
    monkeypatch.setitem(models.MODELS, "spring", _spring_module())


def test_a_new_model_is_one_module(spring_registered):
    """Config reads the module's axes, options, noise types, observables and restrictions; the
    theory is the module's hook; nothing else names the model."""
    from sgdsweep.models.predict import predict

    sweep = build_sweep({"sweep": "s", "model": {"kind": "spring", "stiffness": 4.0},
                         "grid": {"lr": [0.1, 0.2], "batch_size": 2}})
    params = sweep.points[0].params
    assert params["noise"] == "gaussian" and params["observe"]["escape"] is True  # escape: auto
    pred = predict(models.make_problem(params), params)
    var = 0.1**2 / 2 / (1 - (1 - 0.4) ** 2)
    assert pred.weight_cov[0, 0] == pytest.approx(var) and "weight_cov" not in pred.reasons
    assert pred.weight_cov_continuous is not None  # the common approximations from H and C
    with pytest.raises(ConfigError, match="grid.noise") as err:
        build_sweep({"sweep": "s", "model": {"kind": "spring"}, "grid": {"lr": 0.1, "batch_size": 2,
                                                                         "noise": "minibatch"}})
    assert "gaussian, student_t" in str(err.value)
    with pytest.raises(ConfigError, match="at most 0.5 for spring"):
        build_sweep({"sweep": "s", "model": {"kind": "spring"}, "grid": {"lr": 0.1, "batch_size": 2,
                                                                         "momentum": 0.9}})
    with pytest.raises(ConfigError, match="dynamics.observe.gradient_noise"):
        build_sweep({"sweep": "s", "model": {"kind": "spring"}, "grid": {"lr": 0.1, "batch_size": 2},
                     "dynamics": {"observe": {"gradient_noise": True}}})
    with pytest.raises(ConfigError, match="model.kind landscape or spring"):  # the list comes from the modules
        build_sweep({"sweep": "s", "model": {"kind": "quadratic"}, "grid": {"lr": 0.1, "batch_size": 2},
                     "dynamics": {"observe": {"escape": True}}})


def test_no_model_is_named_outside_its_module():
    """config, predict and results ask the model's hooks or the problem: no model kind appears
    in them as a string, and no ``.kind`` is compared."""
    import ast

    for rel in ("sgdsweep/sweep/config.py", "sgdsweep/models/predict.py", "sgdsweep/sim/results.py"):
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        named = sorted({node.value for node in ast.walk(tree)
                        if isinstance(node, ast.Constant) and node.value in models.MODELS})
        assert not named, f"{rel} names {named}"
        kind_tests = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
                      and any(isinstance(n, ast.Attribute) and n.attr == "kind"
                              for n in [node.left, *node.comparators])]
        assert not kind_tests, f"{rel} compares .kind at lines {kind_tests}"


def test_the_page_on_adding_a_model_names_every_hook():
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    section = page[page.index("## Adding a model"):]
    for name in (*models.REQUIRED, *models.OPTIONAL):
        assert f"`{name}" in section, name
    assert "sgdsweep/core/noise_types.py" in page
