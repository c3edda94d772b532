"""Share a finished sweep as one verifiable file: export, verify, import, merge.

An export is a zip file that is at the same time a Zarr (format 3) store: its root group is the
ensemble, so ``xarray.open_zarr(zarr.storage.ZipStore(path, mode="r"))`` opens it directly. It
also holds

- ``points/<hash>.zarr/…`` — every point store's files (Zarr keys under the point's name; an
  import places each as its ``<hash>.zarr.zip``), so that an imported sweep re-runs its fits and
  report (or the whole workflow) without simulating anything;
- ``fits.json`` — the fits (also in the root group's ``fits`` attribute);
- ``README.txt`` — how to open and verify the file;
- ``sgdsweep-manifest.json`` — schema version, sweep name, resolved config and its hash,
  provenance, the point hashes, and the SHA-256 and size of every other member.

The zip comment holds the manifest's own SHA-256, so a changed manifest is detected too. No
pickle anywhere: JSON and Zarr only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from . import store
from .errors import SgdsweepError, UsageError

SCHEMA_VERSION = "sgdsweep-export/1"
MANIFEST = "sgdsweep-manifest.json"
COMMENT_PREFIX = b"sgdsweep-manifest-sha256="

README = """sgdsweep export of sweep '{sweep}'
====================================

This zip file is a Zarr (format 3) store. Its root group is the ensemble:

    import xarray as xr, zarr
    ds = xr.open_zarr(zarr.storage.ZipStore("{name}", mode="r"))

Variables: weight_var, weight_var_se, weight_var_theory, loss, loss_theory, diverged, ... along
the `point` dimension, with one coordinate per swept axis (lr, batch_size, momentum, ...). Every
variable has long_name, units and description attributes; the root attributes hold the
provenance and the fits (attribute `fits`, JSON).

Check integrity:   sgdsweep verify {name}
Use it:            sgdsweep import {name}   (places the sweep under results/{sweep}/ with its
                   config; `sgdsweep run results/{sweep}/config.yaml` then simulates nothing)

{manifest} lists the SHA-256 of every member, the resolved configuration and the provenance.
"""


class ShareError(SgdsweepError):
    """An export file is missing, truncated, tampered with or incompatible."""

    exit_code = 2


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


def _new_destination(dest: str) -> None:
    """Refuse an export destination that is not a ``.zip`` name or that already exists (a file,
    a directory or a link: sgdsweep never overwrites one), before any work is done."""
    if not str(dest).endswith(".zip"):
        raise UsageError(f"export destination {dest!r} must end in .zip")
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


def export_sweep(sweep_dir: str | Path, dest: str) -> dict[str, Any]:
    """Export a finished sweep directory (``results/<sweep>``) to ``dest`` (a path or fsspec URL).

    Returns:
        The manifest written.
    """
    sweep_dir = Path(sweep_dir)
    _new_destination(dest)
    report_spec, fits, points = _sweep_parts(sweep_dir)
    ens_attrs = json.loads((sweep_dir / "ensemble.zarr" / "zarr.json").read_text()).get("attributes", {})
    members = _ensemble_members(sweep_dir / "ensemble.zarr", fits)
    points_dir = sweep_dir / "points"
    for h in points:
        if not store.is_complete(store.point_path(points_dir, h)):
            raise UsageError(f"point store {store.point_path(points_dir, h)} is missing or incomplete; re-run the "
                             "workflow before exporting")
    members["fits.json"] = json.dumps(fits, indent=1, sort_keys=True).encode()
    provenance = {k: ens_attrs.get(k) for k in ("code_version", "host", "python", "created_utc", "sweep_hash")}
    provenance["package_versions"] = json.loads(ens_attrs.get("package_versions", "{}"))
    base = {"sweep": report_spec["config"]["sweep"], "config": report_spec["config"],
            "config_hash": report_spec["config_hash"], "provenance": provenance, "points": points}
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / (Path(dest).name if "://" not in dest else "export.zip")
        _write_zip(local, itertools.chain(members.items(), _point_members(points_dir, points)), base)
        _upload(local, dest)
    return verify(dest)


def _point_members(points_dir: Path, hashes: list[str]) -> Iterable[tuple[str, bytes]]:
    """Every point store's files as export members ``points/<hash>.zarr/<key>``, one store open at a time."""
    for h in hashes:
        with store.PointFiles(store.point_path(points_dir, h)) as files:
            for key, data in files.items():
                yield f"points/{h}.zarr/{key}", data


def verify(src: str | Path) -> dict[str, Any]:
    """Check an export: zip integrity, manifest checksum, schema version, every member's SHA-256.

    Returns:
        The manifest.

    Raises:
        ShareError: naming what is wrong (truncated, tampered member, missing or extra member, …).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = _download(str(src), Path(tmp))
        try:
            zf = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise ShareError(f"{src} is not a complete zip file (truncated or corrupted: {exc})") from None
        with zf:
            names = zf.namelist()
            repeated = sorted(n for n, count in Counter(names).items() if count > 1)
            if repeated:  # zipfile reads the last entry of a name; other tools the first
                raise ShareError(f"{src}: member {repeated[0]!r} is in the file twice (added after export)")
            if MANIFEST not in names:
                raise ShareError(f"{src} has no {MANIFEST}: it is not an sgdsweep export")
            try:
                text = zf.read(MANIFEST)
            except (zipfile.BadZipFile, OSError) as exc:
                raise ShareError(f"{src}: the manifest is unreadable ({exc})") from None
            if zf.comment != COMMENT_PREFIX + _sha256_bytes(text).encode():
                raise ShareError(f"{src}: {MANIFEST} does not match the checksum in the zip comment "
                                 "(the manifest was changed)")
            try:
                manifest = json.loads(text)
            except ValueError as exc:
                raise ShareError(f"{src}: the manifest is not valid JSON ({exc})") from None
            version = manifest.get("schema_version") if isinstance(manifest, dict) else None
            if version != SCHEMA_VERSION:
                raise ShareError(f"{src}: schema version {version!r}; this sgdsweep reads {SCHEMA_VERSION!r}")
            _check_manifest(manifest, src)
            listed = manifest["members"]
            extra = sorted(set(names) - set(listed) - {MANIFEST})
            if extra:
                raise ShareError(f"{src}: member {extra[0]!r} is not listed in the manifest (added after export)")
            for name, entry in listed.items():
                if name not in names:
                    raise ShareError(f"{src}: member {name!r} listed in the manifest is missing")
                try:
                    data = zf.read(name)
                except (zipfile.BadZipFile, OSError, EOFError) as exc:
                    raise ShareError(f"{src}: member {name!r} is unreadable ({exc}); the file is truncated "
                                     "or corrupted") from None
                if len(data) != entry["size"] or _sha256_bytes(data) != entry["sha256"]:
                    raise ShareError(f"{src}: member {name!r} does not match its SHA-256 in the manifest "
                                     "(the file was modified or corrupted)")
    return manifest


def _check_manifest(manifest: dict[str, Any], src: str | Path) -> None:
    """Raise :class:`ShareError` unless the manifest lists its members (name → SHA-256 and size),
    config and points, and names a sweep as the config schema allows one (letters, digits,
    ``_ . -``: a name that stays inside a results directory)."""
    from .schema import load_schema

    members = manifest.get("members")
    if not (isinstance(members, dict) and isinstance(manifest.get("config"), dict)
            and isinstance(manifest.get("points"), list)
            and all(isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int)
                    for e in members.values())):
        raise ShareError(f"{src}: the manifest lacks its members, config or points (a damaged or crafted file)")
    pattern = load_schema()["properties"]["sweep"]["pattern"]
    if not isinstance(manifest.get("sweep"), str) or not re.match(pattern, manifest["sweep"]):
        raise ShareError(f"{src}: the manifest's sweep name {manifest.get('sweep')!r} is not a sweep name "
                         f"(allowed: {pattern}); an import would place it outside the results directory")


def import_sweep(src: str | Path, results_dir: str | Path = "results") -> Path:
    """Verify an export and place it as ``<results_dir>/<sweep>/`` (never over an existing sweep).

    Writes the ensemble, fits, point stores and ``config.yaml`` (the resolved config with
    ``results_dir`` pointing here), so that ``sgdsweep run <results_dir>/<sweep>/config.yaml``
    re-runs fits and report and simulates nothing.
    """
    manifest = verify(src)
    results_dir = Path(results_dir)
    target = results_dir / manifest["sweep"]
    if target.exists() or target.is_symlink():
        raise UsageError(f"{target} already exists; sgdsweep never overwrites results. Remove it, or "
                         "import elsewhere with --results-dir DIR")
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"results directory {results_dir} is not a directory (a file is there, or in its "
                         "path); import elsewhere with --results-dir DIR") from None
    staging = results_dir / f".import-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = _download(str(src), Path(tmp))
            with zipfile.ZipFile(path) as zf:
                point_keys: dict[str, list[str]] = {}  # point hash → its store's members
                for name in manifest["members"]:
                    if name in ("README.txt", "fits.json"):
                        continue
                    rel = Path(name)
                    if rel.is_absolute() or ".." in rel.parts:
                        raise ShareError(f"{src}: member {name!r} would escape the results directory")
                    if rel.parts[0] == "points" and len(rel.parts) > 2 and rel.parts[1].endswith(".zarr"):
                        point_keys.setdefault(rel.parts[1][:-len(".zarr")], []).append(name)
                        continue
                    out = staging / (rel if rel.parts[0] == "points" else Path("ensemble.zarr") / rel)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
                for h, names in point_keys.items():  # each point as one zip store
                    prefix = f"points/{h}.zarr/"
                    store.place_point(store.point_path(staging / "points", h),
                                      {name[len(prefix):]: zf.read(name) for name in names})
                (staging / "fits.json").write_bytes(zf.read("fits.json"))
        config = dict(manifest["config"])
        config["results_dir"] = str(results_dir)
        (staging / "config.yaml").write_text(
            "# Resolved configuration of an imported sweep (sgdsweep import)\n"
            + yaml.safe_dump(config, sort_keys=False))
        os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def merge_exports(sources: list[str], dest: str) -> dict[str, Any]:
    """Merge exports of compatible sweeps into one export holding the union of their points.

    Compatible: the same config except the grid/points (so the same model and dynamics). A point
    present in several exports must be identical in all of them (same hash and same values);
    otherwise the merge is refused, naming the point.
    """
    import numpy as np
    import xarray as xr
    import zarr

    from .aggregate import write_ensemble
    from .fit import fit_ensemble
    from .identity import content_hash

    if len(sources) < 2:
        raise UsageError("merge needs at least two export files")
    _new_destination(dest)
    manifests = [verify(s) for s in sources]
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
        for src in sources:
            local = _download(str(src), tmp)
            with zipfile.ZipFile(local) as zf:
                for name in zf.namelist():
                    if name.startswith("points/") and name not in members:
                        members[name] = zf.read(name)
        base = {"sweep": manifests[0]["sweep"], "config": config, "config_hash": content_hash(config),
                "provenance": {"merged_from": [m["config_hash"] for m in manifests]},
                "points": [str(h) for h in merged["point"].values]}
        members["fits.json"] = json.dumps(fits, indent=1, sort_keys=True).encode()
        local = tmp / "merged.zip"
        _write_zip(local, members.items(), base)
        _upload(local, dest)
    return verify(dest)
