"""Share a finished sweep as one verifiable file: export, verify, import, merge.

An export is a zip file that is at the same time a Zarr (format 3) store: its root group is the
ensemble, so ``xarray.open_zarr(zarr.storage.ZipStore(path, mode="r"))`` opens it directly. It
also holds

- ``points/<hash>.npz`` — every point's store, its bytes as the sweep keeps them
  (:mod:`sgdsweep.share.point_members`; an export of the earlier schema 1 holds Zarr groups
  ``points/<hash>.zarr/…`` instead, still read), so that an imported sweep re-runs its fits and
  report (or the whole workflow) without simulating anything;
- ``fits.json`` — the fits (also in the root group's ``fits`` attribute); with ``precision:``,
  also ``rounds/fits/<name>.json``, each round's fits, from which an import replays the rounds
  (:mod:`sgdsweep.share.rounds`);
- ``report.html`` and ``figures/<name>.png|svg`` — the sweep's report and figures, when it has
  them, so that a collaborator sees the results before running anything;
- ``config.yaml`` — the resolved config (also in the manifest, which an import uses);
- ``workflow/Snakefile`` and ``workflow/rules/*.smk`` — the workflow that made it;
- ``ro-crate-metadata.json`` — its RO-Crate (:mod:`sgdsweep.store.crate`): the dataset, its
  variables and licence, the software, config and workflow;
- ``README.txt`` — how to open and verify the file;
- ``sgdsweep-manifest.json`` — schema version, sweep name, resolved config and its hash,
  provenance, the point hashes, and the SHA-256 and size of every other member.

The zip comment holds the manifest's own SHA-256, so a changed manifest is detected too. No
pickle anywhere: JSON, Zarr and NumPy's ``.npy`` only. Every member, the report and the crate included, is checked
by ``sgdsweep verify`` against its SHA-256.

An export is read where it lies, too (:mod:`sgdsweep.share.remote`): ``verify`` and
``import`` of a URL read the zip through range requests with the checks of a local file, and
:func:`sgdsweep.open_ensemble` opens ``zip::https://…/x.zip`` lazily. ``--format directory``
writes the same members unzipped into a new directory (its root a Zarr group with consolidated
metadata), which any static web server can publish.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from sgdsweep.errors import StoreError, UsageError
from sgdsweep.share.parts import answer_members, unzip_to_directory, workflow_members
from sgdsweep.share.point_members import extract_points, member_name
from sgdsweep.share.remote import is_url, open_export_source
from sgdsweep.share.verify import (
    COMMENT_PREFIX,
    MANIFEST,
    SCHEMA_VERSION,
    ShareError,
    member_blocks,
    verified,
)
from sgdsweep.store import packs
from sgdsweep.store import points as point_store
from sgdsweep.store.crate import CRATE, DEFAULT_LICENSE, check_license, crate_metadata
from sgdsweep.store.leftovers import remove_stale_imports
from sgdsweep.store.packs import pack_points

__all__ = ["COMMENT_PREFIX", "FORMATS", "MANIFEST", "SCHEMA_VERSION", "ShareError", "export_sweep",
           "import_sweep", "merge_exports", "verify"]
#: What ``sgdsweep export --format`` writes: one zip file, or the same members in a new directory.
FORMATS = ("zip", "directory")
#: Members an import places at the top of the sweep directory as they are named (the report,
#: its figures and the crate); ``config.yaml`` and ``workflow/`` are verified but not placed (an
#: import writes its own config; the installed sgdsweep's workflow runs it).
_ANSWER = ("report.html", CRATE)
_NOT_PLACED = ("config.yaml",)
log = logging.getLogger(__name__)

README = """sgdsweep export of sweep '{sweep}'
====================================

report.html is the sweep's report (open it in a browser), when the sweep had one; figures/
holds its figures.

This zip file is a Zarr (format 3) store. Its root group is the ensemble:

    import xarray as xr, zarr
    ds = xr.open_zarr(zarr.storage.ZipStore("{name}", mode="r"))

or, published on a web server, without downloading it:

    import sgdsweep
    ds = sgdsweep.open_ensemble("zip::https://HOST/PATH/{name}")

Variables: weight_var, weight_var_se, weight_var_theory, loss, loss_theory, diverged, ... along
the `point` dimension, with one coordinate per swept axis (lr, batch_size, momentum, ...). Every
variable has long_name, units and description attributes; the root attributes hold the
provenance and the fits (attribute `fits`, JSON).

points/<hash>.npz is each point's own store (its arrays, some per replica; `hash` is the ensemble's
`point` coordinate), a NumPy archive: numpy.load(f, allow_pickle=False).

Check integrity:   sgdsweep verify {name}
Use it:            sgdsweep import {name}   (places the sweep under results/{sweep}/ with its
                   config; `sgdsweep run results/{sweep}/config.yaml` then simulates nothing)

{manifest} lists the SHA-256 of every member, the resolved configuration and the provenance.
"""


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_under(root: Path) -> Iterable[Path]:
    for dirpath, _, filenames in os.walk(root):
        for f in sorted(filenames):
            yield Path(dirpath) / f


def _sweep_parts(sweep_dir: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(report spec with the config, fits, point hashes) of a finished sweep directory."""
    ensemble = sweep_dir / "ensemble.zarr"
    needed = [ensemble / "zarr.json", sweep_dir / "fits.json", sweep_dir / "plan" / "report.json",
              sweep_dir / "plan" / "sweep.json"]
    for path in needed:
        if not path.is_file():
            raise UsageError(f"{sweep_dir} is not a finished sweep: {path} is missing; run the workflow "
                             "first (sgdsweep run CONFIG)")
    report_spec = json.loads((sweep_dir / "plan" / "report.json").read_text())
    fits = json.loads((sweep_dir / "fits.json").read_text())
    points = [p["hash"] for p in json.loads((sweep_dir / "plan" / "sweep.json").read_text())["points"]]
    rounds = report_spec.get("rounds") or {}
    if rounds.get("kind") == "precision":  # every round's points: an import replays the rounds from them
        earlier = [h for p in rounds["points"].values() for h in p.get("hashes", [])]
        points += sorted(set(earlier) - set(points))
    return report_spec, fits, points


def _write_zip(dest: Path, members: Iterable[tuple[str, bytes | Path]], manifest_base: dict[str, Any]) -> None:
    """Write members (name, bytes or file) plus manifest and README into ``dest`` (stored, not deflated)."""
    table: dict[str, dict[str, Any]] = {}
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, src in members:
            data = src.read_bytes() if isinstance(src, Path) else src
            zf.writestr(name, data)
            table[name] = {"sha256": _sha256_bytes(data), "size": len(data)}
        readme = README.format(sweep=manifest_base["sweep"], name=dest.name if dest.name else "FILE.zip",
                               manifest=MANIFEST).encode()
        zf.writestr("README.txt", readme)
        table["README.txt"] = {"sha256": _sha256_bytes(readme), "size": len(readme)}
        manifest = {**manifest_base, "schema_version": SCHEMA_VERSION, "members": table}
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        zf.writestr(MANIFEST, text)
        zf.comment = COMMENT_PREFIX + _sha256_bytes(text).encode()


def _ensemble_members(ensemble: Path, fits: dict[str, Any]) -> dict[str, bytes | Path]:
    """The ensemble's files as zip members at the root; the fits added to the root attributes."""
    members: dict[str, bytes | Path] = {}
    for path in _files_under(ensemble):
        rel = path.relative_to(ensemble).as_posix()
        if rel == "zarr.json":
            meta = json.loads(path.read_text())
            meta.setdefault("attributes", {})["fits"] = json.dumps(fits, sort_keys=True)
            members[rel] = json.dumps(meta, indent=2).encode()
        else:
            members[rel] = path
    return members


def _new_destination(dest: str, fmt: str = "zip") -> None:
    """Refuse an export destination that is not a ``.zip`` name (a local directory name not
    ending in ``.zip``, for ``fmt="directory"``) or that already exists (a file, a directory or a
    link: sgdsweep never overwrites one), before any work is done."""
    if fmt not in FORMATS:
        raise UsageError(f"export --format {fmt!r}: allowed: {', '.join(FORMATS)}")
    if fmt == "directory":
        if is_url(dest) or str(dest).endswith(".zip"):
            raise UsageError(f"export destination {dest!r} with --format directory: give a local directory "
                             "that does not exist yet (not a URL, not ending in .zip); copy it to a web server "
                             "to publish it")
    elif not str(dest).endswith(".zip"):
        raise UsageError(f"export destination {dest!r} must end in .zip (or give --format directory)")
    if "://" in dest:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(dest)
        except (ValueError, ImportError) as exc:
            raise UsageError(f"export destination {dest!r}: {exc}; give a local path or an fsspec URL "
                             "(file://, s3://, …) whose filesystem is installed") from None
        exists = fs.exists(path)
    else:
        exists = os.path.lexists(dest)
    if exists:
        raise UsageError(f"{dest} already exists; sgdsweep never overwrites a file. Remove it or choose "
                         "another name")


def _upload(local: Path, dest: str) -> None:
    _new_destination(dest)  # again: it may have appeared while the export was written
    if "://" in dest:
        import fsspec

        with open(local, "rb") as src, fsspec.open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
    else:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(local), dest)


def _download(src: str, tmpdir: Path) -> Path:
    if "://" not in src:
        path = Path(src)
        if not path.is_file():
            raise UsageError(f"export file not found: {src}")
        return path
    import fsspec

    local = tmpdir / "download.zip"
    try:
        with fsspec.open(src, "rb") as fh, open(local, "wb") as out:
            shutil.copyfileobj(fh, out)
    except FileNotFoundError:
        raise UsageError(f"export file not found: {src}") from None
    except (ValueError, ImportError) as exc:  # an unknown protocol, or its filesystem not installed
        raise UsageError(f"export file {src!r}: {exc}; give a local path or an fsspec URL whose "
                         "filesystem is installed") from None
    return local


def export_sweep(sweep_dir: str | Path, dest: str, license_id: str | None = None,
                 fmt: str = "zip") -> dict[str, Any]:
    """Export a finished sweep directory (``results/<sweep>``) to ``dest`` (a path or fsspec URL),
    with its report and figures (:func:`sgdsweep.share.parts.answer_members`), config, workflow and RO-Crate
    declaring ``license_id`` (an SPDX identifier; by default the config's ``metadata.license``, or
    :data:`sgdsweep.store.crate.DEFAULT_LICENSE`). ``fmt="directory"``: the same members, the
    manifest and ``sgdsweep-manifest.sha256`` (its checksum, the zip comment of a zip) written
    into the new local directory ``dest``, to publish on a static web server.

    Before anything is written, the ensemble is read whole as :func:`sgdsweep.open_ensemble`
    and the fits read it (:func:`sgdsweep.store.aggregate.load_ensemble`: its metadata against
    its record, every chunk present and matching its CRC-32C), and every point store is checked
    complete and its point's own (:meth:`sgdsweep.store.points.PointStore.check_identity`).

    Returns:
        The manifest written.

    Raises:
        UsageError: ``dest`` exists or is not a ``.zip`` (a directory name for ``fmt="directory"``);
            the licence is not an SPDX identifier; the sweep is not finished, or its
            ensemble or a point store fails those checks (naming it and the fix).
    """
    from sgdsweep.store.aggregate import load_ensemble

    sweep_dir = Path(sweep_dir)
    _new_destination(dest, fmt)
    if license_id is not None:
        check_license(license_id)
    report_spec, fits, points = _sweep_parts(sweep_dir)
    license_id = license_id or str((report_spec["config"].get("metadata") or {}).get("license") or DEFAULT_LICENSE)
    try:
        ensemble = load_ensemble(sweep_dir / "ensemble.zarr")
    except StoreError as exc:
        raise UsageError(f"{sweep_dir} is not exported: {exc}") from None
    ens_attrs = json.loads((sweep_dir / "ensemble.zarr" / "zarr.json").read_text()).get("attributes", {})
    members = _ensemble_members(sweep_dir / "ensemble.zarr", fits)
    points_dir = sweep_dir / "points"
    single = set(os.listdir(points_dir)) if points_dir.is_dir() else set()
    packed = packs.index(points_dir)  # each store's path as point_path gives it, from one listing of each
    paths = {h: packs.member_path(packed[h], h) if h in packed and f"{h}{point_store.POINT_SUFFIX}" not in single
             else points_dir / f"{h}{point_store.POINT_SUFFIX}" for h in points}
    for h, path in paths.items():
        try:
            with point_store.PointStore(path) as store:
                store.check_identity(h)
        except StoreError as exc:
            raise UsageError(f"{sweep_dir} is not exported: {exc}; re-run the workflow before exporting") from None
    members["fits.json"] = json.dumps(fits, indent=1, sort_keys=True).encode()
    if "precision" in report_spec["config"]:  # each round's fits: an import replays the rounds from them
        for path in sorted((sweep_dir / "rounds" / "fits").glob("*.json")):
            members[f"rounds/fits/{path.name}"] = path
    provenance = {k: ens_attrs.get(k) for k in ("code_version", "host", "python", "created_utc", "sweep_hash")}
    provenance["package_versions"] = json.loads(ens_attrs.get("package_versions", "{}"))
    base = {"sweep": report_spec["config"]["sweep"], "config": report_spec["config"],
            "config_hash": report_spec["config_hash"], "provenance": provenance, "points": points}
    members.update(answer_members(sweep_dir))
    members["config.yaml"] = yaml.safe_dump(report_spec["config"], sort_keys=False).encode()
    workflow = workflow_members()
    members.update(workflow)
    variables = {str(n): dict(ensemble[n].attrs) for n in list(ensemble.data_vars) + list(ensemble.coords)}
    members[CRATE] = crate_metadata(base["sweep"], [*members, "README.txt", MANIFEST], variables, license_id,
                                    provenance.get("created_utc"), workflow)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / (Path(dest).name if "://" not in dest and fmt == "zip" else "export.zip")
        _write_zip(local, itertools.chain(members.items(), _point_members(paths)), base)
        manifest = verify(local)  # before it is placed: a file that fails is never left at dest
        if fmt == "directory":
            unzip_to_directory(local, Path(dest))
            return manifest
        _upload(local, dest)
    return verify(dest) if "://" in dest else manifest  # what arrived, where it was sent


def _point_members(paths: dict[str, Path]) -> Iterable[tuple[str, bytes]]:
    """Every point's store (point hash → its path, single or packed) as the export member
    ``points/<hash>.npz``: its bytes as written, one store at a time (checked before, and again
    by the verify that ends the export)."""
    for h, path in paths.items():
        try:
            yield member_name(h), point_store.store_bytes(path)
        except (OSError, KeyError, zipfile.BadZipFile, StoreError) as exc:
            raise UsageError(f"point store {path} became unreadable while it was exported ({exc}); re-run the "
                             "workflow, then export again") from None


def verify(src: str | Path) -> dict[str, Any]:
    """Check an export (:mod:`sgdsweep.share.verify`): the zip and its entries, the sizes they
    declare, the manifest's checksum, version and content (its config a sweep of its own name
    and points), and every member's SHA-256, streamed.

    Returns:
        The manifest.

    Raises:
        ShareError: naming what is wrong (truncated, tampered member, missing or extra member, a
            crafted name, size or config, …).
    """
    with open_export_source(src) as (zf, size):
        return verified(zf, size, src)


def import_sweep(src: str | Path, results_dir: str | Path = "results") -> Path:
    """Verify an export and place it as ``<results_dir>/<sweep>/`` (never over an existing sweep).

    Writes the ensemble, fits, point stores and ``config.yaml``: the export's config with
    ``results_dir`` the absolute path of ``results_dir`` (so that it names this directory from
    any working directory) and without an ``execution`` section (it describes the machine that
    ran the sweep; this machine's defaults apply), so that ``sgdsweep run
    <results_dir>/<sweep>/config.yaml`` re-runs fits and report and simulates nothing. The
    members are copied from the same file that was verified (a URL read in place, through range
    requests), in blocks, hashed again as they stream, into a staging directory renamed to
    ``<sweep>`` only once all is placed (and removed otherwise): a failed import writes nothing.
    The export's report, figures and crate are placed beside the ensemble.
    """
    results_dir = Path(results_dir)
    with open_export_source(src) as (zf, size):
        manifest = verified(zf, size, src)
        target = results_dir / manifest["sweep"]
        if target.exists() or target.is_symlink():
            raise UsageError(f"{target} already exists; sgdsweep never overwrites results. "
                             "Remove it, or import elsewhere with --results-dir DIR")
        _check_import_place(target)
        try:
            results_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise UsageError(f"results directory {results_dir} is not a directory (a file is "
                             "there, or in its path); import elsewhere with --results-dir DIR"
                             ) from None
        remove_stale_imports(results_dir)  # what killed imports left (sgdsweep.store.leftovers)
        staging = results_dir / f".import-{uuid.uuid4().hex[:8]}"
        try:
            _extract(zf, manifest, staging, src)
            config = _imported_config(manifest["config"], results_dir)
            (staging / "config.yaml").write_text(config)
            _place(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    if "execution" in manifest["config"]:
        log.warning("the export's execution section %s was not imported: it describes the machine "
                    "that ran the sweep, not the data; this machine's defaults apply (set "
                    "execution in %s to choose others)", json.dumps(manifest["config"]["execution"]),
                    target / "config.yaml")
    return target


def _place(staging: Path, target: Path) -> None:
    """Rename the finished ``staging`` directory to ``target``; refuse, naming it, when another
    import or run placed a sweep there while this import ran (never writing over it).

    Raises: UsageError naming ``target`` and the fix.
    """
    try:
        os.rename(staging, target)
    except OSError as exc:  # ENOTEMPTY or EEXIST: a sweep appeared there since the check
        if not (target.exists() or target.is_symlink()):
            raise
        raise UsageError(f"{target} appeared while this import ran (another import or run placed it); sgdsweep "
                         "never overwrites results. Remove it, or import elsewhere with --results-dir DIR"
                         ) from exc


def _check_import_place(target: Path) -> None:
    """Refuse to import into ``target`` when it lies inside another sweep's directory or holds
    one: the check ``sgdsweep run`` makes (:func:`sgdsweep.sweep.config.check_place`), made
    before anything is written, since a run of the outer sweep would delete the inner one's
    results.

    Raises: UsageError naming both directories and the fix.
    """
    from sgdsweep.core.paths import nested_sweep

    found = nested_sweep(target)
    if found is not None:
        other, how = found
        where = "inside another sweep's directory" if how == "inside" else "around another sweep's directory"
        raise UsageError(f"import destination {target} lies {where}, {other}: a run of the outer sweep "
                         "would delete the imported sweep's results. Import elsewhere with --results-dir DIR "
                         "(a directory whose sweeps lie side by side, e.g. results)")


def _imported_config(config: dict[str, Any], results_dir: Path) -> str:
    """``config.yaml`` of an imported sweep: the export's ``config`` without ``execution``, its
    ``results_dir`` the absolute ``results_dir``."""
    config = {k: v for k, v in config.items() if k != "execution"}
    config["results_dir"] = str(results_dir.absolute())
    return ("# Resolved configuration of an imported sweep (sgdsweep import). The export's\n"
            "# execution settings, if any, were not imported: add an execution section to choose\n"
            "# this machine's.\n"
            + yaml.safe_dump(config, sort_keys=False))


#: Most points an import packs into one file (a shard job packs a shard's points; an import, whose
#: points came from many shards, packs them this many at a time, so packing holds at most these
#: points' stores in memory).
IMPORT_PACK_POINTS = 1024


def _extract(zf: zipfile.ZipFile, manifest: dict[str, Any], staging: Path, src: str | Path) -> None:
    """Copy a verified export's members into ``staging`` (a new directory): ``fits.json`` and
    the rounds' fits (``rounds/fits/``) as they are named, the ensemble's keys under
    ``ensemble.zarr/``, and each point's store as ``points/<hash>.npz``, checked complete and its
    point's own (:func:`sgdsweep.share.point_members.extract_points`), then packed as shard jobs
    pack theirs (:func:`sgdsweep.store.packs.pack_points`: packs of even sizes, at most
    :data:`IMPORT_PACK_POINTS` points each); each member streamed and hashed
    (:func:`member_blocks`), no file written over another."""
    members = manifest["members"]
    for name, entry in members.items():
        if name in ("README.txt", MANIFEST, *_NOT_PLACED) or name.startswith(("workflow/", "points/")):
            continue
        top = name in ("fits.json", *_ANSWER) or name.startswith(("rounds/", "figures/"))
        out = staging / (name if top else f"ensemble.zarr/{name}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "xb") as fh:
            fh.writelines(member_blocks(zf, name, entry, src))
    extract_points(zf, manifest, staging / "points", src)
    points = manifest["points"]
    count = math.ceil(len(points) / IMPORT_PACK_POINTS)
    first = 0
    for i in range(count):  # sizes differing by one at most
        size = len(points) // count + (i < len(points) % count)
        pack_points(staging / "points", f"imported-{i}", points[first:first + size])
        first += size


def merge_exports(sources: list[str], dest: str) -> dict[str, Any]:
    """Merge exports of compatible sweeps into one export holding the union of their points.

    Compatible: the same config except the grid/points (so the same model and dynamics). A point
    present in several exports must be identical in all of them (same hash and same values);
    otherwise the merge is refused, naming the point.
    """
    import numpy as np
    import xarray as xr
    import zarr

    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.core.identity import content_hash
    from sgdsweep.store.aggregate import write_ensemble

    if len(sources) < 2:
        raise UsageError("merge needs at least two export files")
    _new_destination(dest)
    manifests = [verify(s) for s in sources]
    for src, m in zip(sources, manifests):
        for section in ("precision", "search"):
            if section in m["config"]:
                raise ShareError(f"{src} is a sweep with {section}: its points follow from its rounds, which a merged "
                                 "sweep's explicit points cannot replay; merge sweeps of fixed size, or import it "
                                 "on its own")
    ignore = ("grid", "points", "report", "fit", "execution", "sweep", "results_dir")

    def core(cfg: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in cfg.items() if k not in ignore}

    for src, m in zip(sources[1:], manifests[1:]):
        if core(m["config"]) != core(manifests[0]["config"]):
            diff = sorted(k for k in set(core(m["config"])) | set(core(manifests[0]["config"]))
                          if core(m["config"]).get(k) != core(manifests[0]["config"]).get(k))
            raise ShareError(f"{src} is not compatible with {sources[0]}: config section(s) {diff} differ "
                             "(only grid/points may differ between merged sweeps)")
    datasets = []
    for src in sources:
        with tempfile.TemporaryDirectory() as tmp:
            path = _download(str(src), Path(tmp))
            with zarr.storage.ZipStore(path, mode="r") as zs:
                datasets.append(xr.open_zarr(zs).load())
    seen: dict[str, tuple[int, int]] = {}
    keep: list[list[int]] = []
    for di, ds in enumerate(datasets):
        idx = []
        for pi, h in enumerate(ds["point"].values):
            if h in seen:
                dj, pj = seen[h]
                a, b = ds.isel(point=pi), datasets[dj].isel(point=pj)
                for name in ds.data_vars:
                    if name == "simulation_seconds":
                        continue
                    va, vb = np.asarray(a[name].values), np.asarray(b[name].values)
                    if va.shape != vb.shape or not np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"):
                        raise ShareError(f"point {h} is in {sources[dj]} and {sources[di]} with different "
                                         f"'{name}'; refusing to merge conflicting duplicates")
                continue
            seen[h] = (di, pi)
            idx.append(pi)
        keep.append(idx)
    merged = xr.concat([ds.isel(point=idx) for ds, idx in zip(datasets, keep)], dim="point",
                       data_vars="all", coords="different", compat="equals", join="outer",
                       combine_attrs="override")
    merged.attrs["merged_from"] = json.dumps([m["config_hash"] for m in manifests])
    # The merged sweep's config lists its points explicitly, so that importing the merge and
    # running its config regenerates exactly these point hashes (and simulates nothing).
    axes = [c for c in merged.coords if merged[c].dims == ("point",) and c not in ("point", "shard")]
    config = json.loads(json.dumps(manifests[0]["config"]))
    config["grid"] = {}
    def plain(v: Any) -> Any:
        return v.item() if hasattr(v, "item") else v

    config["points"] = [{a: plain(merged[a].values[i]) for a in axes} for i in range(merged.sizes["point"])]
    fits = fit_ensemble(merged, config["fit"])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sweep_dir = tmp / manifests[0]["sweep"]
        write_ensemble(merged, sweep_dir / "ensemble.zarr")
        members = _ensemble_members(sweep_dir / "ensemble.zarr", fits)
        for n, (src, manifest) in enumerate(zip(sources, manifests)):
            local = _download(str(src), tmp)
            stores = tmp / f"points-{n}"
            with zipfile.ZipFile(local) as zf:  # each store checked again as it is read
                extract_points(zf, manifest, stores, src)
            for h in manifest["points"]:
                members.setdefault(member_name(h), stores / f"{h}{point_store.POINT_SUFFIX}")
        base = {"sweep": manifests[0]["sweep"], "config": config, "config_hash": content_hash(config),
                "provenance": {"merged_from": [m["config_hash"] for m in manifests]},
                "points": [str(h) for h in merged["point"].values]}
        members["fits.json"] = json.dumps(fits, indent=1, sort_keys=True).encode()
        local = tmp / "merged.zip"
        _write_zip(local, members.items(), base)
        _upload(local, dest)
    return verify(dest)
