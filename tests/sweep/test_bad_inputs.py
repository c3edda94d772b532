"""The bad-input catalogue: every bad config value, command-line argument, environment variable
and path gets a clear message and a non-zero exit code from the ``sgdsweep`` command.

The catalogue is listed in docs/bad-inputs.md; this file is its executable form.
"""

from __future__ import annotations

import copy
import sys
import zipfile

import pytest
from conftest import REPO, TINY, make_finished_sweep, run_snakemake, tiny_config, write_yaml
from test_config import BAD_CONFIGS, _laughs, _set, bounded_run

from sgdsweep.run.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("changes,expected", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_through_the_command(tmp_path, capsys, changes, expected):
    cfg = copy.deepcopy(TINY)
    for key, value in changes.items():
        _set(cfg, key, value)
    path = write_yaml(tmp_path / "bad.yaml", cfg)
    for verb in ("validate", "plan", "run"):
        code, text = _run(capsys, verb, str(path))
        assert code == 2, (verb, text)
        assert all(part in text for part in expected), (verb, text)
    assert not (tmp_path / "results").exists()  # nothing was written


def _finished(tmp_path):
    return make_finished_sweep(tmp_path)


OTHER_BAD_INPUTS = [
    # (id, argv builder(tmp_path) -> list, environment, expected substrings)
    ("no_command", lambda t: [], {}, ["required"]),
    ("unknown_command", lambda t: ["frobnicate"], {}, ["invalid choice", "frobnicate"]),
    ("validate_without_file", lambda t: ["validate"], {}, ["the following arguments are required: config"]),
    ("cores_zero", lambda t: ["run", str(REPO / "config" / "config.yaml"), "--cores", "0"], {},
     ["--cores", "positive integer", "'0'"]),
    ("cores_not_a_number", lambda t: ["run", str(REPO / "config" / "config.yaml"), "--cores", "two"], {},
     ["positive integer", "'two'"]),
    ("extra_args_for_validate", lambda t: ["validate", "x.yaml", "--", "--forceall"], {},
     ["only accepted by 'sgdsweep run'"]),
    ("config_missing", lambda t: ["validate", str(t / "nope.yaml")], {}, ["nope.yaml", "existing YAML file"]),
    ("config_is_a_directory", lambda t: ["validate", str(t)], {}, ["existing YAML file"]),
    ("config_not_yaml", lambda t: ["validate", str(_text(t / "c.yaml", "grid: {lr: [0.1"))], {}, ["YAML parse error"]),
    ("config_not_a_mapping", lambda t: ["validate", str(_text(t / "c.yaml", "- 1\n- 2\n"))], {}, ["mapping"]),
    ("config_empty", lambda t: ["validate", str(_text(t / "c.yaml", ""))], {},
     ["c.yaml is empty", "needs at least `grid`", "lr, batch_size, samples_per_param"]),
    ("config_only_comments", lambda t: ["run", str(_text(t / "c.yaml", "# a sweep\n\n# to be written\n"))], {},
     ["c.yaml is empty", "nothing but blank lines or comments", "config/config.yaml is a complete example"]),
    ("config_python_tag", lambda t: ["validate", str(_text(t / "c.yaml", "sweep: !!python/name:os.system\n"))], {},
     ["YAML parse error"]),
    ("scheduler_env_not_an_address", lambda t: ["run", str(write_yaml(t / "c.yaml", tiny_config()))],
     {"SGDSWEEP_SCHEDULER": "localhost:8786"}, ["SGDSWEEP_SCHEDULER", "localhost:8786", "tcp://"]),
    ("results_dir_blocked_by_a_file", lambda t: ["run", str(write_yaml(t / "c.yaml", tiny_config(
        results_dir=str(_text(t / "file", "x") / "results"))))], {}, ["is not writable", "results_dir"]),
    ("export_unfinished_sweep", lambda t: ["export", str(t), str(t / "x.zip")], {}, ["not a finished sweep"]),
    ("export_not_zip", lambda t: ["export", str(_finished(t)), str(t / "x.tar")], {}, ["must end in .zip"]),
    ("verify_missing_file", lambda t: ["verify", str(t / "none.zip")], {}, ["not found", "none.zip"]),
    ("verify_not_a_zip", lambda t: ["verify", str(_text(t / "fake.zip", "hello"))], {}, ["not a complete zip file"]),
    ("verify_foreign_zip", lambda t: ["verify", str(_zip(t / "foreign.zip"))], {}, ["not an sgdsweep export"]),
    ("import_not_a_zip", lambda t: ["import", str(_text(t / "fake.zip", "hello"))], {}, ["not a complete zip file"]),
    ("merge_single_file", lambda t: ["merge", str(t / "a.zip"), "--out", str(t / "b.zip")], {}, ["at least two"]),
    ("config_not_utf8", lambda t: ["validate", str(_bytes(t / "c.yaml", b"sweep: caf\xe9\n"))], {},
     ["c.yaml", "a UTF-8 encoded YAML file"]),
    ("config_repeated_key", lambda t: ["validate", str(_text(t / "c.yaml", "sweep: a\nsweep: b\n"))], {},
     ["found the key 'sweep' twice"]),
    ("config_yaml_alias", lambda t: ["validate", str(_text(t / "c.yaml", "sweep: &a a\n"))], {},
     ["c.yaml", "Line 1, column 8 has the anchor &a", "without anchors"]),
    ("replicas_beyond_memory", lambda t: ["validate", str(write_yaml(t / "c.yaml", tiny_config(
        dynamics={"replicas": 10**9})))], {}, ["dynamics.replicas", "1000000000", "execution.max_memory",
                                              "estimated memory is", "TiB", "fewer replicas"]),
    ("max_memory_below_the_estimate", lambda t: ["plan", str(write_yaml(t / "c.yaml", tiny_config(
        execution={"max_memory": "100MiB"})))], {}, ["execution.max_memory = 100 MiB", "per worker process",
                                                     "raise execution.max_memory"]),
    ("config_sweep_name_trailing_newline", lambda t: ["validate", str(write_yaml(t / "c.yaml", tiny_config(
        sweep="x\n")))], {}, ["config key 'sweep'", "got 'x\\n'", "letters, digits"]),
    ("fit_missing_ensemble", lambda t: ["fit", str(t / "nope.zarr"), "--spec", str(_text(t / "s.json", "{}")),
                                        "--out", str(t / "f.json")], {}, ["ensemble not found", "nope.zarr"]),
    ("report_not_an_ensemble", lambda t: ["report", "--ensemble", str(_text(t / "e.txt", "x")), "--fits",
                                          str(_text(t / "f.json", "{}")), "--spec", str(_text(t / "s.json", "{}")),
                                          "--out", str(t / "r.html")], {}, ["e.txt is not an ensemble"]),
]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_an_empty_config_names_what_a_sweep_needs(tmp_path, capsys, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    path = _text(tmp_path / "config.yaml", text)
    for verb in ("validate", "plan", "run"):
        code, out = _run(capsys, verb, str(path))
        assert code == 2, (verb, out)
        assert f"{path} is empty" in out and "A sweep needs at least `grid`" in out, out
        assert "Traceback" not in out and "got None" not in out
    assert not (tmp_path / "results").exists()


def _text(path, text):
    path.write_text(text)
    return path


def _bytes(path, data):
    path.write_bytes(data)
    return path


def _zip(path):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data.txt", "x")
    return path


@pytest.mark.parametrize("argv,env,expected", [c[1:] for c in OTHER_BAD_INPUTS], ids=[c[0] for c in OTHER_BAD_INPUTS])
def test_bad_arguments_environment_and_paths(tmp_path, capsys, monkeypatch, argv, env, expected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    args = argv(tmp_path)
    code, text = _run(capsys, *args)
    assert code != 0 and code is not None
    for part in expected:
        assert part in text, text


def test_import_never_overwrites(tmp_path, capsys, monkeypatch):
    from sgdsweep.share.archive import export_sweep

    export_sweep(_finished(tmp_path / "src"), str(tmp_path / "t.zip"))
    monkeypatch.chdir(tmp_path)
    assert _run(capsys, "import", str(tmp_path / "t.zip"))[0] == 0
    code, text = _run(capsys, "import", str(tmp_path / "t.zip"))
    assert code == 2 and "already exists" in text and "never overwrites" in text


def test_import_refuses_paths_escaping_the_results_directory(tmp_path, capsys, monkeypatch):
    """A crafted export whose manifest lists ../ members is refused, and nothing is written outside."""
    import hashlib
    import json

    from sgdsweep.share.archive import COMMENT_PREFIX, MANIFEST, SCHEMA_VERSION

    evil = tmp_path / "evil.zip"
    payload = b"owned"
    manifest = {"schema_version": SCHEMA_VERSION, "sweep": "evil", "config": {"sweep": "evil"},
                "members": {"../../escape.txt": {"sha256": hashlib.sha256(payload).hexdigest(), "size": 5},
                            "fits.json": {"sha256": hashlib.sha256(b"{}").hexdigest(), "size": 2}},
                "points": []}
    text = json.dumps(manifest).encode()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../escape.txt", payload)
        zf.writestr("fits.json", b"{}")
        zf.writestr(MANIFEST, text)
        zf.comment = COMMENT_PREFIX + hashlib.sha256(text).hexdigest().encode()
    monkeypatch.chdir(tmp_path)
    code, out = _run(capsys, "import", str(evil))
    assert code == 2 and "escape the results directory" in out
    assert not (tmp_path.parent / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "results" / "evil").exists()


def test_yaml_alias_bomb_is_refused_by_every_reader(tmp_path):
    """A 9-level "billion laughs" (under 500 bytes, 9⁹ values) is refused, with its line, by
    validate, plan and run and by snakemake reading the file itself, each in a process limited
    to 2 GiB of address space and 120 s; and so is the nesting of mappings that Snakemake's own
    config merge would expand, by `sgdsweep run` before Snakemake starts."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs())
    assert len(bomb.read_bytes()) < 500
    mappings = tmp_path / "mappings.yaml"
    lines = ["sweep: laughs", "m0: &m0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    lines += [f"m{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(9)) + "}" for i in range(1, 9)]
    mappings.write_text("\n".join(lines) + "\n")
    sgdsweep = [sys.executable, "-m", "sgdsweep"]
    runs = [sgdsweep + [verb, str(bomb)] for verb in ("validate", "plan", "run")]
    runs += [sgdsweep + ["run", str(mappings)]]
    runs += [[sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "1",
              "--configfile", str(bomb), "--dry-run"]]
    for cmd in runs:
        proc = bounded_run(cmd, tmp_path)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Line 2, column 5 has the anchor" in text, (cmd, text[-2000:])
        assert "without anchors (&name) or aliases (*name)" in text, text[-2000:]
        if cmd[:3] == sgdsweep:
            assert proc.returncode == 2 and "Traceback" not in text, text[-2000:]
    assert not (tmp_path / "results").exists()


def test_a_sweep_beyond_max_memory_is_refused_by_snakemake_before_the_plan(tmp_path):
    """snakemake run directly on a config whose simulation does not fit refuses it in the main
    process, naming the estimate, before any plan file or job."""
    cfg = write_yaml(tmp_path / "c.yaml", tiny_config(execution={"max_memory": "100MiB"}))
    proc = run_snakemake(tmp_path, cfg)
    assert proc.returncode != 0
    assert "execution.max_memory = 100 MiB" in proc.stderr and "estimated memory is" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "results" / "tiny" / "plan").exists()


def test_a_finished_sweep_is_not_refused_for_memory(tmp_path, capsys, monkeypatch):
    """Only the points without a store count: a finished (or imported) sweep simulates nothing
    and runs its fits and report whatever execution.max_memory says."""
    sweep_dir = make_finished_sweep(tmp_path)
    cfg = write_yaml(tmp_path / "c.yaml", tiny_config(results_dir=str(sweep_dir.parent),
                                                     dynamics={"steps": 1500, "replicas": 4},
                                                     execution={"max_memory": "100MiB"}))
    code, text = _run(capsys, "plan", str(cfg))
    assert code == 0 and "4 stored, 0 to simulate" in text and "cost: nothing to simulate" in text, text


def test_catalogue_size():
    n = len(BAD_CONFIGS) + len(OTHER_BAD_INPUTS) + 2
    assert n >= 30, n
