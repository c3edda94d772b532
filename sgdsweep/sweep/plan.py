"""The plan: files that tell each workflow job what to do, rewritten only when they change.

Snakemake decides what to rerun from file modification times. The plan is one JSON *spec* per
shard listing that shard's points, and one spec each for aggregation, fits, the report and the
execution settings. :func:`plan_texts` computes their content in memory (the workflow does so
when it is parsed, and writes nothing then).

The workflow's jobs read each spec under a name made from its content,
``plan/by-content/<name>.<digest>.json`` (:meth:`PlanFiles.by_content`): a changed spec is a file
that does not exist yet, which the workflow's plan rule (``workflow/rules/plan.smk``) writes,
newer than every output, so exactly what depends on it reruns. Whoever wrote the plan before
(``sgdsweep run``, a plain ``snakemake`` in this or another working directory, :func:`write_plan`)
and whatever Snakemake recorded there, the files decide; writing a spec removes its other
versions, so returning to an earlier config writes its spec anew and reruns what it changes.
``plan/<name>.json`` is a copy of the current version, for people and tools to read:

- adding an ``lr`` value changes one shard's spec: that shard's job reruns and simulates only
  the new points (finished points are found in the content-addressed store);
- editing only ``fit`` or ``report`` changes only the fit's or the report's spec;
- reordering keys or writing ``0.1`` as ``1e-1`` changes nothing.

The execution settings (``plan/execution.json``) never change results and are no input of any
job: they are written before the jobs start (by ``sgdsweep run``, or the workflow's ``onstart``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgdsweep.core.paths import write_if_changed
from sgdsweep.errors import UsageError
from sgdsweep.store.points import complete_points
from sgdsweep.sweep.config import Point, Sweep
from sgdsweep.sweep.cost import check_memory
from sgdsweep.sweep.grid import AXES

#: The directory under ``plan/`` of the specs named by their content (:meth:`PlanFiles.by_content`).
BY_CONTENT = "by-content"
#: Folder under ``plan/`` where the workflow's start puts the plan files its plan jobs move into
#: place (:func:`stage_plan_files`).
STAGED = "staged"
#: Hex digits of a plan file's SHA-256 in the names of its versions.
DIGEST_DIGITS = 16


def content_digest(text: str) -> str:
    """The digest that names a plan file's version: the first :data:`DIGEST_DIGITS` hex digits of
    the SHA-256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_DIGITS]


def _dump(obj: Any) -> str:
    # compact: json's C encoder (indent= falls back to the pure-Python one, 10× slower on 10⁴ points)
    return json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class PlanFiles:
    """Paths of one sweep's plan and outputs (all under ``sweep.directory``)."""

    root: Path

    @property
    def points_dir(self) -> Path:
        return self.root / "points"

    def shard_spec(self, shard: str) -> Path:
        return self.root / "plan" / "shards" / f"{shard}.json"

    def shard_receipt(self, version: str) -> Path:
        """The receipt of the shard job that ran the shard spec ``version``
        (:meth:`version`: ``<shard>.<digest>``)."""
        return self.root / "shards" / f"{version}.json"

    def shard_log(self, version: str) -> Path:
        """The log of the shard job that ran the shard spec ``version``."""
        return self.log(f"simulate/{version}")

    def log(self, name: str) -> Path:
        """The log of the workflow's job ``name`` (``aggregate``, ``simulate/<version>``, …; a
        Snakemake wildcard pattern such as ``plan/{name}.{digest}`` too): ``logs/<name>.log``."""
        return self.root / "logs" / f"{name}.log"

    def by_content_file(self, stem: str) -> Path:
        """``plan/by-content/<stem>.json``: a plan file's version named ``stem``
        (``<name>.<digest>``, :meth:`by_content`), or a Snakemake wildcard pattern of them
        (``shards/{version}``)."""
        return self.root / "plan" / BY_CONTENT / f"{stem}.json"

    def staged(self, by_content: str | Path) -> Path:
        """Where the workflow's start puts the version named by content ``by_content`` (a path
        under ``plan/by-content/``) for its plan job to move into place:
        ``plan/staged/<name>.<digest>.json``."""
        return self.root / "plan" / STAGED / Path(by_content).relative_to(self.root / "plan" / BY_CONTENT)

    def version(self, path: Path, text: str) -> str:
        """``<name>.<digest>``: the plan file ``path`` while its content is ``text``, as named
        in :meth:`by_content` (without the directories and ``.json``)."""
        return self.by_content(path, text).name[: -len(".json")]

    def done(self, rule: str, path: Path, text: str) -> Path:
        """The marker that the workflow's job ``rule`` ran the plan file ``path`` while its
        content was ``text``: ``plan/done/<rule>.<digest>``."""
        return self.root / "plan" / "done" / f"{rule}.{self.version(path, text).rsplit('.', 1)[1]}"

    @property
    def sweep_spec(self) -> Path:
        return self.root / "plan" / "sweep.json"

    @property
    def fit_spec(self) -> Path:
        return self.root / "plan" / "fit.json"

    @property
    def report_spec(self) -> Path:
        return self.root / "plan" / "report.json"

    @property
    def execution_spec(self) -> Path:
        return self.root / "plan" / "execution.json"

    def by_content(self, path: Path, text: str) -> Path:
        """Where the workflow's jobs read the plan file ``path`` (one of :func:`plan_texts`'s
        keys, under ``plan/``) while its content is ``text``:
        ``plan/by-content/<name>.<first 16 hex digits of the SHA-256 of text>.json``."""
        name = Path(path).relative_to(self.root / "plan").with_suffix("")
        digest = content_digest(text)
        return self.by_content_file(f"{name.as_posix()}.{digest}")

    @property
    def ensemble(self) -> Path:
        return self.root / "ensemble.zarr"

    @property
    def ensemble_receipt(self) -> Path:
        """Written by the aggregate job after the ensemble: the workflow's record that it is current."""
        return self.root / "ensemble.json"

    @property
    def fits(self) -> Path:
        return self.root / "fits.json"

    @property
    def edge(self) -> Path:
        """With ``search:``: the search's result (:func:`sgdsweep.sweep.search.edge_summary`)."""
        return self.root / "edge.json"

    @property
    def fit_archive(self) -> Path:
        """With ``precision.fits``: each round's fits, ``<points digest>.json``
        (:func:`sgdsweep.core.identity.points_digest`)."""
        return self.root / "rounds" / "fits"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def figures(self) -> Path:
        """The report's figures as PNG files (for ``snakemake --report``)."""
        return self.root / "figures"

    @property
    def fit_cache(self) -> Path:
        """The previous fits of each group of points by the digest of its points and settings,
        reused by the next fit job where those have not changed (:mod:`sgdsweep.analysis.fit.cache`)."""
        return self.root / ".fit-cache"

    @property
    def figure_cache(self) -> Path:
        """The previous report's figures by the digest of their inputs, reused by the next
        report where those have not changed (:mod:`sgdsweep.analysis.figure_cache`)."""
        return self.root / ".figure-cache"

    @property
    def cluster_dir(self) -> Path:
        """Where ``sgdsweep run`` keeps its local Dask cluster's scheduler file, status and log."""
        return self.root / ".cluster"


def axis_key(point: Point) -> list[Any]:
    """The point's values of the six named axes: what "the same point" means across edits."""
    return [point.params.get(a) for a in AXES]


def _previous_repair(spec: Path) -> int:
    try:
        return int(json.loads(spec.read_text()).get("repair", 0))
    except (OSError, ValueError, TypeError):
        return 0


def _append_order(files: PlanFiles, sweep: Sweep) -> list[Point]:
    """The sweep's points in the order the sweep spec lists them: those of the previous sweep
    spec (``plan/sweep.json``) in its order, then the others in the sweep's order. So a grown
    sweep lists its old points first, and its ensemble grows by appending rows
    (:mod:`sgdsweep.store.aggregate_incremental`)."""
    try:  # the spec as _dump writes it: each point {"hash":"…",…}; read without building every entry
        rank = {h: i for i, h in enumerate(dict.fromkeys(_SPEC_HASH.findall(files.sweep_spec.read_text())))}
    except (OSError, ValueError):
        rank = {}
    return sorted(sweep.points, key=lambda p: rank.get(p.hash, len(rank)))  # stable: new points in sweep order


_SPEC_HASH = re.compile(r'\{"hash":"([0-9a-f]+)"')


def plan_texts(sweep: Sweep, done: set[str] | None = None) -> dict[Path, str]:
    """The content of every plan file of ``sweep``, by path; nothing is written.

    Reads the point stores (which points are pending; ``done``: those with a complete store,
    when the caller has just computed them) and the current shard specs (their repair counts).

    Raises:
        ConfigError: if simulating the points without a complete store needs more memory than
            ``execution.max_memory`` (:func:`sgdsweep.sweep.cost.check_memory`).
    """
    files = PlanFiles(sweep.directory)
    pending = pending_points(sweep, done)
    check_memory(sweep, [h for hashes in pending.values() for h in hashes])
    texts: dict[Path, str] = {}
    try:
        ran = {name.split(".")[0] for name in os.listdir(files.root / "shards")}
    except OSError:
        ran = set()
    for shard, points in sweep.shards.items():
        spec = files.shard_spec(shard)
        repair = _previous_repair(spec)
        if shard in pending and (shard in ran or files.ensemble.exists()):
            # Stores are missing or corrupt although the shard ran before: only a spec of new
            # content makes the workflow rerun the shard (and what depends on it), so count the
            # repairs in the spec.
            repair += 1
        texts[spec] = _dump({"shard": shard, "points_dir": str(files.points_dir), "repair": repair,
                             "points": [p.spec() for p in points]})
    rebuilds = _previous_repair(files.sweep_spec)
    if files.ensemble_receipt.exists() and not files.ensemble.exists():
        rebuilds += 1  # the ensemble was deleted: a change of content makes Snakemake rebuild it
    texts[files.sweep_spec] = _dump({
        "sweep": sweep.name, "sweep_hash": sweep.sweep_hash, "repair": rebuilds,
        "simulation_config": sweep.simulation_config(), "coords": list(sweep.coords),
        "points_dir": str(files.points_dir),
        **({"metadata": sweep.config["metadata"]} if sweep.config.get("metadata") else {}),  # the ensemble's attrs
        "points": [{"hash": p.hash, "shard": p.shard, "key": axis_key(p)} for p in _append_order(files, sweep)]})
    texts[files.fit_spec] = _dump(sweep.config["fit"])
    shown = {k: v for k, v in sweep.config.items() if k != "execution"}  # execution never changes results
    report = {"report": sweep.config["report"], "config": shown, "config_hash": sweep.config_hash}
    if sweep.rounds:  # precision or search: what each round did, for the report
        report["rounds"] = sweep.rounds
    texts[files.report_spec] = _dump(report)
    texts[files.execution_spec] = _dump(sweep.config["execution"])
    return texts


def write_plan(sweep: Sweep) -> PlanFiles:
    """Write every plan file of ``sweep`` whose content changed (:func:`plan_texts`); return the
    paths.

    Raises:
        ConfigError: before writing anything, as :func:`plan_texts`.
    """
    files = PlanFiles(sweep.directory)
    for path, text in plan_texts(sweep).items():
        write_plan_file(files, path, text)
    return files


def write_plan_file(files: PlanFiles, path: Path, text: str) -> bool:
    """Make ``text`` the current content of the plan file ``path``: its version named by content
    (:meth:`PlanFiles.by_content`, written unless it already holds exactly ``text``, then its
    other versions removed) and its readable copy ``path`` (written only when it changed).
    Returns whether the version named by content was written, which makes what reads it rerun.
    The execution settings, which no job reads as an input, have only the copy ``path``."""
    if Path(path) == files.execution_spec:
        return write_if_changed(path, text)
    target = files.by_content(path, text)
    for directory in (files.root / "plan" / BY_CONTENT, target.parent):
        _own_directory(directory)
    wrote = write_if_changed(target, text)
    write_if_changed(path, text)
    version = re.compile(rf"{re.escape(target.name.rsplit('.', 2)[0])}\.[0-9a-f]{{{DIGEST_DIGITS}}}\.json")
    for other in target.parent.iterdir():
        if other != target and version.fullmatch(other.name):
            other.unlink(missing_ok=True)
    return wrote


def read_plan_file(path: str | Path) -> str:
    """The text of the plan file at ``path`` as a job reads it. A version named by content
    (``plan/by-content/<name>.<digest>.json``) must hold what its name says (:meth:`PlanFiles.by_content`):
    one changed after it was written is refused, never used under a name that says otherwise.

    Raises:
        UsageError: the file is missing, or holds other content than its name says."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    named = re.fullmatch(rf".+\.([0-9a-f]{{{DIGEST_DIGITS}}})\.json", path.name)
    if named and BY_CONTENT in path.parts:
        digest = content_digest(text)
        if digest != named.group(1):
            raise UsageError(f"the plan file {path} does not hold what its name says (its content's digest is "
                             f"{digest}): it was changed after it was written. Delete it and run again; the "
                             "workflow writes it afresh")
    return text


def _own_directory(directory: Path) -> None:
    """``directory`` made a directory of its own: a symbolic link planted in its place (or a
    file) is removed, never written through or cleaned out."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def remove_stale_results(files: PlanFiles, points_digest: str) -> list[Path]:
    """After the aggregate job changed the ensemble: remove the fits (``fits.json``), the report
    and its figures of ``files``' sweep when the fits were made from other points than those of
    ``points_digest`` (:func:`sgdsweep.core.identity.points_digest`; an unreadable fits file
    counts as other points). A target that stops at the ensemble (``snakemake ensemble``) then
    leaves no fits or report that looks current; the next full run makes them again. Links are
    removed, never followed. Returns what was removed."""
    try:
        made_from = json.loads(files.fits.read_text())["settings"]["points_digest"]
    except FileNotFoundError:
        made_from = None
    except (OSError, ValueError, KeyError, TypeError):
        made_from = ""
    if made_from == points_digest:
        return []
    removed = []
    for path in (files.fits, files.report, files.figures):
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed


def stage_plan_files(files: PlanFiles, texts: Mapping[str, str]) -> list[Path]:
    """The plan's writing at the workflow's start (its ``onstart``, under the sweep's lock, never
    at parse time): each plan file of ``texts`` (path as a string → content) whose version named
    by content is missing is made current (:func:`write_plan_file`: its readable copy, its other
    versions and their jobs' logs removed) and its version named by content is put under
    :meth:`PlanFiles.staged`, where the plan job that Snakemake runs for it, a shell command,
    moves it into place (no Python started for it). A version that is there is linked there too
    (no copy), for a plan job forced to run again (``snakemake --forceall``: Snakemake removes a
    job's output before it runs). ``plan/staged/`` is made afresh each time: what an earlier
    start left there is removed, and a symbolic link planted there (or inside) is removed, never
    written through. Returns the files staged for the missing versions."""
    root = files.root / "plan" / STAGED
    if root.is_symlink() or root.is_file():
        root.unlink()
    elif root.exists():
        shutil.rmtree(root)  # removes links inside, never what they point to
    staged = []
    for path, text in texts.items():
        if Path(path) == files.execution_spec:
            continue
        target = files.by_content(Path(path), text)
        place = files.staged(target)
        place.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            os.link(target, place)
            continue
        write_plan_file(files, Path(path), text)
        log = files.log(f"plan/{target.relative_to(files.root / 'plan' / BY_CONTENT).with_suffix('').as_posix()}")
        stem = log.name.rsplit(".", 2)[0]
        for old in log.parent.glob(f"{stem}.*.log"):
            old.unlink(missing_ok=True)
        os.replace(target, place)
        staged.append(place)
    return staged


_DONE = re.compile(rf"[a-z]+\.[0-9a-f]{{{DIGEST_DIGITS}}}")
_SHARD_VERSION = re.compile(rf"([0-9a-f]+)\.[0-9a-f]{{{DIGEST_DIGITS}}}")


def remove_other_versions(files: PlanFiles, current: set[str]) -> int:
    """Remove the done markers (:meth:`PlanFiles.done`) not in ``current`` (paths as strings): the
    records of earlier plans. The workflow does so when a run starts, before any job rewrites
    what they record; a config taken back to an earlier version then finds its records gone and
    reruns what that version needs. (A shard's receipts are pruned by its own job:
    :func:`remove_other_shard_versions`.) Returns how many files were removed."""
    removed = 0
    directory = files.root / "plan" / "done"
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if _DONE.fullmatch(name) and str(directory / name) not in current:
            (directory / name).unlink(missing_ok=True)
            removed += 1
    return removed


def remove_other_shard_versions(receipt: Path) -> int:
    """After a shard job wrote ``receipt`` (``<sweep>/shards/<shard>.<digest>.json``), remove the
    shard's receipts and job logs of other spec versions. Only the shard's own job does so, once
    it is done: the plan (:func:`plan_texts`) reads which shards ran before from the receipts,
    and every job that parses the workflow meanwhile must compute the same plan. Returns how many
    files were removed (none for a receipt not named by a version)."""
    receipt = Path(receipt)
    own = _SHARD_VERSION.fullmatch(receipt.name[: -len(".json")])
    if own is None:
        return 0
    files = PlanFiles(receipt.parent.parent)
    removed = 0
    for directory, suffix in ((receipt.parent, ".json"), (files.shard_log(own.group(0)).parent, ".log")):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            other = _SHARD_VERSION.fullmatch(name[: -len(suffix)]) if name.endswith(suffix) else None
            if other is not None and other.group(1) == own.group(1) and other.group(0) != own.group(0):
                (directory / name).unlink(missing_ok=True)
                removed += 1
    return removed


def pending_points(sweep: Sweep, done: set[str] | None = None) -> dict[str, list[str]]:
    """Shard id → hashes of its points that have no complete store of their own yet (a store
    under a point's name that holds another point's results does not count:
    :func:`sgdsweep.store.points.complete_points`; ``done``: that set, when the caller has just
    computed it)."""
    files = PlanFiles(sweep.directory)
    if done is None:
        done = complete_points(files.points_dir, (p.hash for p in sweep.points))
    out: dict[str, list[str]] = {}
    for shard, points in sweep.shards.items():
        todo = [p.hash for p in points if p.hash not in done]
        if todo:
            out[shard] = todo
    return out
