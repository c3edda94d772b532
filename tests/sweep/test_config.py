"""Config validation: defaults, grid expansion, and a catalogue of bad configs."""

from __future__ import annotations

import copy
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY, tiny_config, write_yaml

from sgdsweep.errors import ConfigError
from sgdsweep.sweep.config import build_sweep, load_sweep


def test_default_config_is_valid_and_has_16_points():
    sweep = load_sweep(REPO / "config" / "config.yaml")
    assert len(sweep.points) == 16
    assert {p.params["lr"] for p in sweep.points} == {0.05, 0.1, 0.2, 0.4}
    assert {p.params["batch_size"] for p in sweep.points} == {2, 4, 8, 16}
    assert all(p.params["replicas"] >= 64 for p in sweep.points)
    assert len(sweep.shards) == 1  # one data set: one Snakemake job


def test_defaults_are_filled():
    sweep = build_sweep({"grid": {"lr": 0.1, "batch_size": 4, "samples_per_param": 8}})
    cfg = sweep.config
    assert cfg["sweep"] == "default" and cfg["results_dir"] == "results" and cfg["seed"] == 0
    assert cfg["model"] == {"kind": "linear", "n_inputs": 20, "n_outputs": 1, "label_noise": 0.5,
                            "inputs": "isotropic", "wishart_ratio": 2.0, "labels": "teacher"}
    assert cfg["dynamics"]["burn_in"] == "auto" and cfg["dynamics"]["replicas"] == 64
    assert cfg["dynamics"]["method"] == "sgd" and cfg["dynamics"]["observe"]["cov_max_dim"] == 64
    assert cfg["grid"]["momentum"] == 0.0
    assert sweep.points[0].params["noise"] == "minibatch" and sweep.points[0].params["init"] == "zero"
    assert cfg["fit"]["power_law"] == {"enabled": True} and cfg["fit"]["confidence"] == 0.95
    assert cfg["execution"]["scheduler"] is None
    (point,) = sweep.points
    assert point.burn_in > 0 and point.params["momentum"] == 0.0


def test_cartesian_product_zip_and_points():
    cfg = tiny_config(grid={"lr": [0.1, 0.2, 0.3], "batch_size": [2, 4, 8], "momentum": [0.0, 0.5],
                            "zip": [["lr", "batch_size"]]})
    sweep = build_sweep(cfg)
    pairs = {(p.params["lr"], p.params["batch_size"], p.params["momentum"]) for p in sweep.points}
    assert pairs == {(lr, s, m) for lr, s in [(0.1, 2), (0.2, 4), (0.3, 8)] for m in (0.0, 0.5)}
    cfg = tiny_config(grid={"lr": 0.1, "batch_size": 2},
                      points=[{"lr": 0.3, "batch_size": 4}, {"momentum": 0.5}])
    got = [(p.params["lr"], p.params["batch_size"], p.params["momentum"]) for p in build_sweep(cfg).points]
    assert got == [(0.1, 2, 0.0), (0.3, 4, 0.0), (0.1, 2, 0.5)]  # the complete grid point, then the points
    cfg = tiny_config(grid={"batch_size": 2, "lr": 0.1}, points=[{"lr": 0.3}, {"lr": 0.4}])
    del cfg["grid"]["lr"]  # grid alone is no complete point: its values are the points' defaults
    got = [(p.params["lr"], p.params["batch_size"]) for p in build_sweep(cfg).points]
    assert got == [(0.3, 2), (0.4, 2)]
    cfg = tiny_config(points=[{"lr": 0.3, "batch_size": 4}])  # grid lists + explicit point
    assert len(build_sweep(cfg).points) == 5


def test_zipped_axes_may_repeat_values_and_integers_are_normalised():
    cfg = tiny_config(grid={"lr": [0.1, 0.2, 0.4], "batch_size": [4, 4.0, 8], "zip": [["lr", "batch_size"]]})
    sweep = build_sweep(cfg)
    assert [p.params["batch_size"] for p in sweep.points] == [4, 4, 8]
    assert all(type(p.params["batch_size"]) is int for p in sweep.points)
    same = build_sweep(tiny_config(grid={"lr": [0.1, 0.2, 0.4], "batch_size": [4, 4, 8],
                                         "zip": [["lr", "batch_size"]]}))
    assert [p.hash for p in sweep.points] == [p.hash for p in same.points]
    dup = tiny_config(grid={"lr": [0.1, 0.1], "batch_size": [4, 4], "zip": [["lr", "batch_size"]]})
    with pytest.raises(ConfigError, match="appears twice"):
        build_sweep(dup)


def test_gridding_a_model_key():
    cfg = tiny_config(grid={"label_noise": [0.1, 0.5]})
    cfg["model"].pop("label_noise")
    sweep = build_sweep(cfg)
    assert len(sweep.points) == 8 and len(sweep.shards) == 2  # label noise changes the data
    assert "label_noise" in sweep.coords


def _set(cfg, dotted, value):
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


_DELETE = object()

# (id, {dotted key: value}, substrings the message must contain)
BAD_CONFIGS = [
    ("unknown_top_level_key", {"sweeps": "x"}, ["'sweeps'", "Did you mean 'sweep'"]),
    ("misspelled_axis", {"grid.learning_rate": [0.1]}, ["grid.learning_rate", "Did you mean 'lr'"]),
    ("misspelled_axis_close", {"grid.batch_sizes": [2]}, ["grid.batch_sizes", "Did you mean 'batch_size'"]),
    ("lr_zero", {"grid.lr": [0.1, 0.0]}, ["grid.lr[1]", "0.0", "> 0"]),
    ("lr_negative_scalar", {"grid.lr": -0.1}, ["grid.lr", "-0.1", "> 0"]),
    ("batch_size_above_samples", {"grid.batch_size": [2, 41]}, ["grid.batch_size", "41", "P = 40"]),
    ("non_integer_hidden_width", {"grid.hidden_width": 2.5}, ["grid.hidden_width", "2.5", "integer"]),
    ("hidden_width_for_linear", {"grid.hidden_width": 4}, ["grid.hidden_width", "linear", "samples_per_param"]),
    ("unknown_noise", {"grid.noise": "pink"}, ["grid.noise", "'pink'", "minibatch"]),
    ("label_noise_without_teacher", {"grid.noise": "label", "model.labels": "noise"},
     ["grid.noise", "'label'", "labels: teacher"]),
    ("noise_not_supported_by_model", {"model": {"kind": "quadratic"}, "grid.samples_per_param": _DELETE,
                                      "grid.noise": "minibatch"},
     ["grid.noise", "'minibatch'", "gaussian, student_t"]),
    ("model_key_of_another_kind", {"model.kind": "quadratic"}, ["model.n_inputs", "curvatures, noise_cov"]),
    ("axis_not_used_by_model", {"model": {"kind": "digits"}}, ["grid.samples_per_param", "digits", "lr, batch_size"]),
    ("sde_with_momentum", {"dynamics.method": "sde", "grid.noise": "gaussian", "grid.momentum": 0.5},
     ["grid.momentum", "0.5", "sde"]),
    ("sde_with_sampling_noise", {"dynamics.method": "sde"}, ["grid.noise", "'minibatch'", "gaussian_matched"]),
    ("sde_step_not_a_fraction", {"dynamics.method": "sde", "grid.noise": "gaussian", "dynamics.dt_over_lr": 0.3},
     ["dynamics.dt_over_lr", "0.3", "1/k"]),
    ("dt_without_sde", {"dynamics.dt_over_lr": 0.5}, ["dynamics.dt_over_lr", "sde"]),
    ("gradient_noise_with_added_noise", {"dynamics.observe.gradient_noise": True, "grid.noise": "gaussian"},
     ["dynamics.observe.gradient_noise", "minibatch"]),
    ("escape_without_landscape", {"dynamics.observe.escape": True}, ["dynamics.observe.escape", "landscape"]),
    ("gradient_noise_of_two_layers", {"model": {"kind": "two_layer"}, "grid.hidden_width": 2,
                                      "dynamics.observe.gradient_noise": True},
     ["dynamics.observe.gradient_noise", "model.kind linear, matrix or digits", "epoch or label"]),
    ("two_layer_from_its_minimum", {"model": {"kind": "two_layer"}, "grid.hidden_width": 2, "dynamics.init": "minimum"},
     ["dynamics.init", "'minimum'", "auto or zero for two_layer", "manifold"]),
    ("gaussian_on_two_layers", {"model": {"kind": "two_layer"}, "grid.hidden_width": 2, "grid.noise": "gaussian"},
     ["grid.noise", "'gaussian'", "two_layer", "gaussian_matched"]),
    ("saddle_stiffer_than_minimum", {"model": {"kind": "landscape", "curvature_saddle": 2.0},
                                     "grid.samples_per_param": _DELETE, "grid.noise": "gaussian"},
     ["model.curvature_saddle", "2.0", "curvature_min"]),
    ("quadratic_noise_cov_shape", {"model": {"kind": "quadratic", "curvatures": [1.0, 2.0], "noise_cov": [1.0]},
                                   "grid.samples_per_param": _DELETE, "grid.noise": "gaussian"},
     ["model.noise_cov", "2×2"]),
    ("empty_axis", {"grid.lr": []}, ["grid.lr", "[]", "at least 1"]),
    ("duplicate_values", {"grid.lr": [0.1, 0.2, 0.1]}, ["grid.lr", "distinct"]),
    ("duplicate_values_spelled_differently", {"grid.lr": [0.1, 1e-1]}, ["grid.lr", "distinct"]),
    ("burn_in_at_least_steps", {"dynamics.burn_in": 3000}, ["dynamics.burn_in", "3000", "below steps"]),
    ("auto_burn_in_too_long", {"grid.lr": [0.001, 0.2]}, ["dynamics.burn_in", "'auto'", "Raise steps"]),
    ("one_replica", {"dynamics.replicas": 1}, ["dynamics.replicas", "1", ">= 2"]),
    ("momentum_one", {"grid.momentum": 1.0}, ["grid.momentum", "< 1"]),
    ("divergence_threshold_below_one", {"dynamics.divergence_threshold": 0.5},
     ["dynamics.divergence_threshold", "0.5", ">= 1"]),
    ("zip_unequal_lengths", {"grid.zip": [["lr", "batch_size"]], "grid.batch_size": [2, 4, 8]},
     ["grid.zip[0]", "equal lengths"]),
    ("zip_unknown_axis", {"grid.zip": [["lr", "speed"]]}, ["grid.zip[0]", "'speed'"]),
    ("missing_lr", {"grid.lr": _DELETE}, ["grid.lr", "None", "add it to grid"]),
    ("samples_per_param_at_most_one", {"grid.samples_per_param": 1.0}, ["samples_per_param", "P <= N"]),
    ("steps_not_integer", {"dynamics.steps": 100.5}, ["dynamics.steps", "100.5", "integer"]),
    ("sweep_name_escapes", {"sweep": "../elsewhere"}, ["'sweep'", "../elsewhere", "matching"]),
    ("negative_label_noise", {"model.label_noise": -1}, ["model.label_noise", "-1", ">= 0"]),
    ("unknown_model", {"model.kind": "mlp"}, ["model.kind", "'mlp'", "linear"]),
    ("bad_scheduler_address", {"execution.scheduler": "localhost:8786"}, ["execution.scheduler", "localhost:8786"]),
    ("key_in_model_and_grid", {"grid.label_noise": [0.1, 0.2]}, ["grid.label_noise", "both model and grid"]),
    ("point_misses_swept_axis", {"points": [{"batch_size": 2}]}, ["points[0]", "'lr'"]),
    ("point_unknown_key", {"points": [{"lr": 0.1, "speed": 2}]}, ["points[0].speed"]),
    ("confidence_out_of_range", {"fit.confidence": 95}, ["fit.confidence", "95", "< 1"]),
    ("bootstrap_negative", {"fit.bootstrap": -1}, ["fit.bootstrap", "-1", ">= 0"]),
    ("wigner_pair_of_three", {"fit.wigner.pair": [0, 1, 2]}, ["fit.wigner.pair", "[0, 1, 2]"]),
    ("wigner_pair_repeated", {"fit.wigner.pair": [1, 1]}, ["fit.wigner.pair", "[1, 1]", "two different"]),
    ("grid_not_a_mapping", {"grid": [0.1, 0.2]}, ["'grid'", "object"]),
    ("lr_nan", {"grid.lr": [0.1, float("nan")]}, ["grid.lr[1]", "nan", "a finite number"]),
    ("confidence_nan", {"fit.confidence": float("nan")}, ["fit.confidence", "nan", "a finite number"]),
    ("divergence_threshold_inf", {"dynamics.divergence_threshold": float("inf")},
     ["dynamics.divergence_threshold", "inf", "a finite number"]),
    ("key_not_a_name", {"grid": {**TINY["grid"], 5: 1}}, ["grid.5", "a key that is a name", "int"]),
    ("two_layer_without_hidden_width", {"model": {"kind": "two_layer"}},
     ["grid.hidden_width", "None", "Every two_layer sweep sets 'hidden_width'"]),
    ("wishart_ratio_below_one", {"model.inputs": "wishart", "model.wishart_ratio": 0.5},
     ["model.wishart_ratio", "0.5", ">= 1"]),
    ("quadratic_noise_cov_ragged", {"model": {"kind": "quadratic", "curvatures": [1.0, 2.0],
                                              "noise_cov": [[1.0], [1.0, 2.0]]},
                                    "grid.samples_per_param": _DELETE, "grid.noise": "gaussian"},
     ["model.noise_cov", "2×2"]),
    ("data_set_too_large", {"grid.samples_per_param": 1e12}, ["grid.samples_per_param", "P = 4e+12",
                                                              "a data set of at most"]),
    ("digits_degenerate", {"model": {"kind": "digits", "pixel_scale": 1e-300}, "grid.samples_per_param": _DELETE},
     ["'model'", "'pixel_scale': 1e-300", "degenerate"]),
    ("steps_beyond_int64", {"dynamics.steps": 18446744073709551617},
     ["dynamics.steps", "18446744073709551617", "<= 1000000000"]),
    ("steps_beyond_limit_in_grid", {"dynamics.steps": _DELETE, "grid.steps": [3000, 1000000001]},
     ["grid.steps[1]", "1000000001", "<= 1000000000"]),
    ("sde_integrator_steps_beyond_limit", {"dynamics.method": "sde", "grid.noise": "gaussian",
                                           "dynamics.dt_over_lr": 1e-6},
     ["dynamics.dt_over_lr", "1e-06", "integrator steps", "3000 steps of 1000000 SDE steps"]),
    ("max_memory_not_a_size", {"execution.max_memory": "lots"}, ["execution.max_memory", "'lots'", "auto"]),
    ("precision_target_not_below_one", {"precision": {"observables": {"weight_var": {"rel_se": 1.5}}}},
     ["precision.observables.weight_var.rel_se", "1.5", "< 1"]),
    ("precision_misspelled_observable", {"precision": {"observables": {"weigth_var": {"rel_se": 0.01}}}},
     ["precision.observables.weigth_var", "Did you mean 'weight_var'"]),
    ("precision_fit_target_of_no_parameter", {"precision": {"fits": {"power_law.c": 0.01}}},
     ["precision.fits", "'power_law.c'", "power_law"]),
    ("precision_budget_below_minimum", {"precision": {"observables": {"loss": {"rel_se": 0.01}},
                                                      "budget": {"max_replicas": 1}}},
     ["precision.budget.max_replicas", "1", ">= 2"]),
    ("precision_and_search", {"precision": {"observables": {"loss": {"rel_se": 0.01}}}, "search": {"edge": "lr"}},
     ["'search'", "no search in a sweep with precision targets"]),
    ("search_of_one_value", {"search": {"edge": "lr"}, "grid.lr": 0.2},
     ["grid.lr", "0.2", "at least two values of lr"]),
    ("precision_budget_below_the_first_round", {"precision": {"observables": {"loss": {"rel_se": 0.01}},
                                                              "budget": {"max_replicas": 4}}},
     ["precision.budget.max_replicas", "4", "at least dynamics.replicas = 8"]),
    ("precision_with_replicas_swept", {"precision": {"observables": {"loss": {"rel_se": 0.01}}},
                                       "dynamics.replicas": _DELETE, "grid.replicas": [8, 16]},
     ["grid.replicas", "one dynamics.replicas for every point", "The rounds decide"]),
    ("precision_fit_target_of_a_disabled_fit", {"precision": {"fits": {"power_law.a": 0.01}},
                                                "fit.power_law": {"enabled": False}},
     ["precision.fits.power_law.a", "fit.power_law.enabled is false"]),
    ("search_of_an_unknown_axis", {"search": {"edge": "batch_size"}}, ["search.edge", "'batch_size'", "lr"]),
    ("report_lead_unknown", {"report.lead": "weight_variance"},
     ["report.lead", "'weight_variance'", "one of", "'weight_var'", "'momentum'", "'escape'"]),
    ("report_lead_not_drawable", {"report.lead": "momentum"},
     ["report.lead", "'momentum'", "needs momentum swept", "auto picks one"]),
]


@pytest.mark.parametrize("changes,expected", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_with_a_clear_message(changes, expected):
    cfg = copy.deepcopy(TINY)
    for key, value in changes.items():
        _set(cfg, key, value)
    with pytest.raises(ConfigError) as info:
        build_sweep(cfg)
    msg = str(info.value)
    for part in expected:
        assert part in msg, f"{part!r} not in message: {msg}"


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="existing YAML file"):
        load_sweep(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: [unclosed\n")
    with pytest.raises(ConfigError, match="YAML parse error"):
        load_sweep(bad)
    write_yaml(tmp_path / "list.yaml", [1, 2])
    with pytest.raises(ConfigError, match="mapping"):
        load_sweep(tmp_path / "list.yaml")
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("sweep: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="YAML parse error"):
        load_sweep(unsafe)  # safe_load refuses Python tags


def test_config_is_not_mutated():
    cfg = tiny_config()
    before = yaml.safe_dump(cfg)
    build_sweep(cfg)
    assert yaml.safe_dump(cfg) == before


def test_yaml_file_with_a_repeated_key_or_not_utf8_is_refused(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a second ``sweep:`` would send the results
    to another sweep's directory. A file that is not UTF-8 is named as such."""
    path = tmp_path / "c.yaml"
    path.write_text("sweep: a\ngrid: {lr: 0.1, batch_size: 2}\nsweep: b\n")
    with pytest.raises(ConfigError, match="found the key 'sweep' twice"):
        load_sweep(path)
    path.write_text("sweep: a\ngrid: {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(ConfigError, match="found the key 'lr' twice"):
        load_sweep(path)
    path.write_bytes(b"sweep: caf\xe9\n")  # Latin-1
    with pytest.raises(ConfigError, match="UTF-8"):
        load_sweep(path)


def test_default_noise_is_one_the_model_options_allow():
    """The double well (the landscape model's default) has no data set: its points default to
    added Gaussian noise; the thesis landscape keeps minibatch sampling."""
    cfg = {"sweep": "w", "model": {"kind": "landscape"}, "grid": {"lr": 0.1, "batch_size": 1}}
    (point,) = build_sweep(cfg).points
    assert point.params["noise"] == "gaussian"
    thesis = {"sweep": "t", "model": {"kind": "landscape", "landscape": "thesis"}, "dynamics": {"steps": 100_000},
              "grid": {"lr": 0.001, "batch_size": 1}}
    (point,) = build_sweep(thesis).points
    assert point.params["noise"] == "minibatch"


def test_every_number_key_of_the_schema_reads_exponent_spellings(tmp_path):
    """``5e-1`` (a string to YAML 1.1) is a number for every key the schema gives numbers, model
    and dynamics keys included, derived from the schema rather than listed by hand."""
    from sgdsweep.sweep.schema import number_keys

    assert {"lr", "barrier", "dt_over_lr", "curvatures", "noise_cov", "wishart_ratio", "confidence"} <= number_keys()
    assert not {"batch_size", "steps", "noise", "sweep"} & number_keys()
    path = tmp_path / "c.yaml"
    path.write_text("sweep: w\nmodel: {kind: landscape, barrier: 5e-1, curvature_min: 2e0}\n"
                    "grid: {lr: 1e-1, batch_size: 1}\n")
    (point,) = load_sweep(path).points
    assert (point.params["barrier"], point.params["curvature_min"], point.params["lr"]) == (0.5, 2.0, 0.1)


def test_float_spellings_in_yaml_are_one_value(tmp_path):
    text = "grid:\n  lr: [{}]\n  batch_size: 2\n  samples_per_param: 10\nmodel: {{n_inputs: 4}}\n"
    hashes = []
    for spelling in ("0.1", "1e-1", "0.10", "1.0e-1"):
        path = tmp_path / "c.yaml"
        path.write_text(text.format(spelling))
        (point,) = load_sweep(path).points
        assert point.params["lr"] == 0.1
        hashes.append(point.hash)
    assert len(set(hashes)) == 1
    path.write_text(text.format("0.1, 1e-1"))
    with pytest.raises(ConfigError, match="distinct"):
        load_sweep(path)


def test_number_spellings_outside_the_grid_are_one_value(tmp_path):
    """Integers written as floats and floats written as integers in ``seed``, ``model`` and
    ``dynamics`` (not swept) give the same points as their plain spellings."""
    plain = tiny_config(results_dir=str(tmp_path), seed=3, model={"label_noise": 1.0},
                        dynamics={"steps": 3000, "replicas": 8, "burn_in": 500})
    spelled = tiny_config(results_dir=str(tmp_path), seed=3.0, model={"label_noise": 1},
                          dynamics={"steps": 3000.0, "replicas": 8.0, "burn_in": 500.0})
    points, others = build_sweep(plain).points, build_sweep(spelled).points
    assert [p.hash for p in points] == [p.hash for p in others]
    assert [(p.params["steps"], p.params["label_noise"]) for p in others] == [(3000, 1.0)] * len(points)
    assert all(isinstance(p.params[k], int) for p in others for k in ("steps", "replicas", "seed"))


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "config" / "models").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_model_example_configs_are_valid(path):
    """Every model's example config builds a sweep whose points use that model."""
    from sgdsweep.sweep.config import load_sweep

    sweep = load_sweep(path)
    assert sweep.points and sweep.config["sweep"] == path.stem
    assert {p.params["model"] for p in sweep.points} == {sweep.config["model"]["kind"]}


def _laughs(levels: int = 9) -> str:
    """A "billion laughs" YAML document: ``levels`` lists of nine aliases of the one before
    (9^levels values from a few hundred bytes)."""
    lines = ["sweep: laughs", "l0: &l0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_anchors_and_aliases_are_refused_naming_the_line(tmp_path):
    """An alias is refused where the parser meets it, so nothing is expanded; a harmless one too
    (one rule, stated in the error)."""
    path = tmp_path / "c.yaml"
    path.write_text("sweep: a\ngrid: {lr: 0.1, batch_size: 2, samples_per_param: 8}\n"
                    "fit: {wigner: {pair: &p [0, 1]}}\n")
    with pytest.raises(ConfigError, match=r"Line 3, column 22 has the anchor &p.*Write the values out"):
        load_sweep(path)
    path.write_text("sweep: a\ngrid: {lr: 0.1, batch_size: 2, samples_per_param: 8}\n"
                    "model: {<<: {n_inputs: 4}}\ndynamics: {steps: *s}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*Line 4, column 19 has the alias \*s"):
        load_sweep(path)
    # a bomb, in a bounded process: tests/sweep/test_bad_inputs.py::test_yaml_alias_bomb_is_refused_by_every_reader


#: Address space and time that a refused alias bomb may take; expanded, the bombs of these tests
#: take gigabytes and minutes, so a regression fails (MemoryError or timeout) instead of eating
#: the machine.
BOMB_ADDRESS_SPACE = 2 * 2**30
BOMB_TIMEOUT_S = 120


def bounded_run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` limited to :data:`BOMB_ADDRESS_SPACE` bytes of address space and
    :data:`BOMB_TIMEOUT_S` seconds."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (BOMB_ADDRESS_SPACE, BOMB_ADDRESS_SPACE))

    return subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=BOMB_TIMEOUT_S,
                          preexec_fn=limit)


def test_shared_parts_of_a_config_mapping_are_refused_before_any_walk(tmp_path):
    """A mapping loaded elsewhere (Snakemake's ``--config``, another YAML loader) may hold one
    object twice: build_sweep refuses it before anything walks (and would expand) it. Checked in
    a bounded process: 9⁹ values if expanded."""
    code = ("from sgdsweep.sweep.config import build_sweep\n"
            "from sgdsweep.errors import ConfigError\n"
            "lol = ['lol'] * 9\n"
            "for _ in range(8):\n"
            "    lol = [lol] * 9\n"
            "try:\n"
            f"    build_sweep({{**{TINY!r}, 'laughs': [lol, lol]}})\n"
            "except ConfigError as exc:\n"
            "    print(exc)\n")
    proc = bounded_run([sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "config key 'laughs[1]': got 'the same list as laughs[0]'" in proc.stdout, proc.stdout
    lr = [0.1, 0.2]
    with pytest.raises(ConfigError, match=r"points\[1\].*the same dict as points\[0\]"):
        build_sweep(tiny_config(points=[{"lr": lr}] * 2))


def test_each_points_data_set_and_start_are_its_own():
    """A sweep's data sets are kept, while it is built, under the grid point's axes outside the
    data set's in-shard keys: each point's data set must still be the hash of its own parameters
    outside them, and its ``init: auto`` start its own problem's (fails if that key missed an axis,
    or let two data sets share a problem)."""
    from sgdsweep.core.identity import content_hash
    from sgdsweep.models import get_model
    from sgdsweep.sweep.config import IN_SHARD_KEYS

    cfg = tiny_config(grid={"lr": [0.05, 0.1], "batch_size": [2, 4], "samples_per_param": [4, 8],
                            "label_noise": [0.1, 0.5], "n_inputs": [3, 4]},
                      dynamics={"init": "auto"},
                      points=[{"lr": 0.07, "batch_size": 2, "samples_per_param": 6, "label_noise": 0.1, "n_inputs": 3},
                              {"n_inputs": 3, "label_noise": 0.1, "samples_per_param": 6, "batch_size": 4, "lr": 0.07}])
    cfg["model"].pop("label_noise", None)
    cfg["model"].pop("n_inputs", None)
    sweep = build_sweep(cfg)
    model = get_model("linear")
    for p in sweep.points:
        assert p.hash == content_hash(p.params)
        assert p.data_set == content_hash({k: v for k, v in p.params.items() if k not in IN_SHARD_KEYS})
        assert p.params["init"] == model.make_problem(model.data_params(p.params)).auto_init
    assert len({p.data_set for p in sweep.points}) == 2 * 2 * 2 + 1
    assert len(sweep.points) == 32 + 2


def test_minus_zero_is_zero():
    """-0.0 and 0.0 of a float key are one value, as 1 and 1.0 are: one point, one data set. Their
    canonical JSON told them apart while planning's problem caches (by ==) did not."""
    grid = {"lr": [0.2], "batch_size": 2, "samples_per_param": 10}
    minus = build_sweep(tiny_config(grid={**grid, "momentum": -0.0}, model={"label_noise": -0.0}))
    plus = build_sweep(tiny_config(grid={**grid, "momentum": 0.0}, model={"label_noise": 0.0}))
    assert [(p.hash, p.data_set) for p in minus.points] == [(p.hash, p.data_set) for p in plus.points]
    zipped = tiny_config(grid={**grid, "label_noise": [0.0, -0.0, 0.0], "momentum": [0.5, 0.0, 0.0],
                               "zip": [["label_noise", "momentum"]]})
    zipped["model"].pop("label_noise")
    with pytest.raises(ConfigError, match="appears twice"):
        build_sweep(zipped)


def test_a_point_moved_to_another_shard_keeps_every_other_field():
    """``Point.in_shard`` names each field (for speed): a field it forgets fails here."""
    import dataclasses

    from sgdsweep.sweep.config import Point

    values = {f.name: f"value of {f.name}" for f in dataclasses.fields(Point)}
    point = Point(**values)
    assert point.in_shard("another") == dataclasses.replace(point, shard="another")
