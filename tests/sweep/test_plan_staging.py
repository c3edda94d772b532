"""The plan's writing when a plain ``snakemake`` run starts: the missing versions of its plan
files staged for the plan jobs (shell commands) to move into place."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from conftest import tiny_config

from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import PlanFiles, plan_texts, stage_plan_files, write_plan


def _texts(sweep) -> dict[str, str]:
    return {str(path): text for path, text in plan_texts(sweep).items()}


def test_only_missing_versions_are_staged_and_the_rest_of_the_plan_made_current(tmp_path):
    first = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    files = write_plan(first)
    before = {p: p.stat().st_mtime_ns for p in (files.root / "plan" / "by-content").rglob("*.json")}
    assert stage_plan_files(files, _texts(first)) == []  # every version there: nothing to stage
    for version in before:  # but each linked there, for a plan job forced to run again
        assert files.staged(version).samefile(version)

    changed = build_sweep(tiny_config(results_dir=str(tmp_path / "results"), grid={"lr": [0.2, 0.4, 0.5]}))
    texts = _texts(changed)
    staged = stage_plan_files(files, texts)
    # the sweep's spec and its one shard's changed; the fit's did not; the report's holds the config
    assert sorted(p.relative_to(files.root / "plan" / "staged").as_posix().split(".")[0] for p in staged) == [
        "report", "shards/" + next(iter(changed.shards)), "sweep"]
    for path, text in texts.items():
        target = files.by_content(path, text) if path != str(files.execution_spec) else None
        if target is not None and files.staged(target) in staged:
            assert files.staged(target).read_text() == text and not target.exists()
            assert not [p for p in target.parent.glob(target.name.rsplit(".", 2)[0] + ".*.json")]  # old gone
        if path != str(files.execution_spec):
            assert Path(path).read_text() == text  # the readable copy is this plan's
    fit = files.by_content(files.fit_spec, texts[str(files.fit_spec)])
    assert fit in before and fit.stat().st_mtime_ns == before[fit]  # untouched

    # the next start with the first config again: the second's staged files are gone
    again = stage_plan_files(files, _texts(first))
    assert not any(p.exists() for p in staged if p not in again)
    current = {files.staged(files.by_content(path, text)) for path, text in _texts(first).items()
               if path != str(files.execution_spec)}
    assert set((files.root / "plan" / "staged").rglob("*.json")) == current


def test_the_plan_job_moves_its_staged_file_into_place_or_names_a_spec_of_no_current_plan(tmp_path):
    """The plan rule's shell command, as Snakemake runs it (bash), on a staged file and on none."""
    import re

    rule = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "plan.smk").read_text()
    (command,) = re.findall(r'shell:\n((?:\s+".*"\n)+)', rule)
    command = "".join(re.findall(r'"(.*)"', command))
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    files = PlanFiles(sweep.directory)
    texts = _texts(sweep)
    (staged, *_) = stage_plan_files(files, texts)
    output = files.root / "plan" / "by-content" / staged.relative_to(files.root / "plan" / "staged")
    log = tmp_path / "plan.log"

    def run(staged_path: str, current: str = "yes") -> subprocess.CompletedProcess:
        """The command with the values quoted as Snakemake's ``:q`` quotes them."""
        params = type("P", (), {"staged": shlex.quote(staged_path), "current": current})
        line = command.replace(":q}", "}").format(params=params, output=shlex.quote(str(output)),
                                                  log=shlex.quote(str(log)))
        return subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True, check=False)

    proc = run(str(staged))
    assert proc.returncode == 0, proc.stderr
    assert output.read_text() == texts[next(p for p, t in texts.items() if files.by_content(p, t) == output)]
    assert not staged.exists() and log.read_text().startswith("wrote ")
    # a plan job forced to run again (snakemake --forceall) on a version that is there: Snakemake
    # removes the output first, the job puts the version linked at the start back
    stage_plan_files(files, texts)
    output.unlink()
    assert run(str(staged)).returncode == 0 and output.read_text() == texts[
        next(p for p, t in texts.items() if files.by_content(p, t) == output)]
    output.unlink()
    proc = run(str(output) + "/", "no")  # a version the current plan does not have, asked for by name
    assert proc.returncode == 1 and "is no spec of the current plan" in proc.stderr and not output.exists()
    proc = run(str(staged) + ".gone")  # a current version whose staged copy was removed meanwhile
    assert proc.returncode == 1 and "is gone" in proc.stderr and "run again" in proc.stderr
    assert not output.exists()


def test_a_link_planted_at_the_staging_directory_is_removed_never_written_through(tmp_path):
    """``plan/staged`` (or a folder inside it) planted as a link to another directory: the start
    removes the link and stages in a directory of its own; nothing in the link's target is
    written or removed."""
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    files = PlanFiles(sweep.directory)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.json").write_text("{}")
    (elsewhere / "shards").mkdir()
    before = sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*"))
    (files.root / "plan").mkdir(parents=True)
    (files.root / "plan" / "staged").symlink_to(elsewhere, target_is_directory=True)
    staged = stage_plan_files(files, _texts(sweep))
    assert staged and not (files.root / "plan" / "staged").is_symlink()
    assert all(p.is_file() and not p.is_symlink() for p in staged)
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before

    shutil.rmtree(files.root / "plan" / "by-content")  # every version to stage again
    (files.root / "plan" / "staged" / "shards").rename(tmp_path / "moved")
    (files.root / "plan" / "staged" / "shards").symlink_to(elsewhere / "shards", target_is_directory=True)
    staged = stage_plan_files(files, _texts(sweep))
    assert any("shards" in p.parts for p in staged) and not (files.root / "plan" / "staged" / "shards").is_symlink()
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before


def test_a_link_planted_at_a_folder_of_the_versions_is_removed_never_followed(tmp_path):
    """``plan/by-content/shards`` planted as a link to another directory holding a file named like
    a version of a shard's spec: writing the plan removes the link and writes in a folder of its
    own; the link's target is neither written to nor cleaned out."""
    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    files = PlanFiles(sweep.directory)
    shard = next(iter(sweep.shards))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{shard}.{'a' * 16}.json").write_text("precious")
    (elsewhere / f"{shard}.aaaa.json").write_text("precious too")
    before = {p.name: p.read_text() for p in elsewhere.iterdir()}
    (files.root / "plan" / "by-content").mkdir(parents=True)
    (files.root / "plan" / "by-content" / "shards").symlink_to(elsewhere, target_is_directory=True)
    write_plan(sweep)
    assert not (files.root / "plan" / "by-content" / "shards").is_symlink()
    assert any((files.root / "plan" / "by-content" / "shards").glob(f"{shard}.*.json"))
    assert {p.name: p.read_text() for p in elsewhere.iterdir()} == before


def test_a_plan_file_changed_after_it_was_written_is_refused_by_the_job_that_reads_it(tmp_path):
    """A version named by content whose text no longer has that digest (edited, or replaced
    between the start and its plan job) is refused by the job that would read it, naming it and
    the fix; an intact one, and a file not named by content, are read."""
    import json

    import pytest
    from conftest import cli

    from sgdsweep.errors import UsageError
    from sgdsweep.sweep.plan import read_plan_file

    sweep = build_sweep(tiny_config(results_dir=str(tmp_path / "results")))
    files = write_plan(sweep)
    spec = files.by_content(files.sweep_spec, files.sweep_spec.read_text())
    assert read_plan_file(spec) == files.sweep_spec.read_text()
    assert read_plan_file(files.sweep_spec) == spec.read_text()  # the readable copy: not named by content
    edited = json.loads(spec.read_text())
    edited["points"] = edited["points"][1:]  # a point left out
    spec.write_text(json.dumps(edited))
    with pytest.raises(UsageError, match="does not hold what its name says"):
        read_plan_file(spec)
    proc = cli("aggregate", str(spec), "--out", str(files.ensemble), "--receipt", str(files.ensemble_receipt))
    assert proc.returncode == 2 and str(spec) in proc.stderr and "Delete it and run again" in proc.stderr
    assert not files.ensemble.exists() and not files.ensemble_receipt.exists()
