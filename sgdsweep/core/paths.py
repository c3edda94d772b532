"""Where things live: the workflow files and a sweep's results directory.

Layout of one sweep's results (``<results_dir>/<sweep>/``)::

    config.resolved.json      the validated config with defaults (provenance)
    plan/points.json          the sweep's points in order (written only when it changes)
    plan/shards/<id>.json     one shard's points (written only when it changes)
    points/<hash>.npz         one simulated point (content-addressed, written atomically; one file)
    shards/<id>.json          a shard job's receipt (which points it simulated, timings)
    ensemble.zarr             the aggregate xarray dataset
    fits.json                 scaling-law fits
    report.html               the self-contained report
    logs/                     one log per job
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def workflow_root() -> Path:
    """Directory holding ``Snakefile`` and ``workflow/``.

    The repository checkout next to the package when there is one (editable installs, running
    from a clone), else the copy shipped inside the wheel.
    """
    repo = _PACKAGE_DIR.parent
    if (repo / "Snakefile").is_file() and (repo / "workflow" / "schemas").is_dir():
        return repo
    return _PACKAGE_DIR / "_workflow"


def sweep_dir(results_dir: str | Path, sweep: str) -> Path:
    """``<results_dir>/<sweep>``; the sweep name is schema-checked to stay inside results_dir."""
    return Path(results_dir) / sweep


#: The file every sweep directory holds once a run took it (:mod:`sgdsweep.run.locking`).
SWEEP_MARKER = ".sgdsweep.lock"


def nested_sweep(directory: str | Path) -> tuple[Path, str] | None:
    """Another sweep's directory that ``directory`` lies inside or holds, and which of the two,
    or None. A sweep directory is one with :data:`SWEEP_MARKER` or a ``plan/sweep.json``.

    One sweep's results inside another's are lost: the outer sweep's runs replace its ensemble,
    figures and plan, and clear what they do not know. Cost: a look at each parent, and a walk of
    ``directory`` if it exists (one listing of its points)."""
    directory = Path(directory).resolve()

    def is_sweep(path: Path) -> bool:
        return (path / SWEEP_MARKER).is_file() or (path / "plan" / "sweep.json").is_file()

    for parent in directory.parents:
        if is_sweep(parent):
            return parent, "inside"
    if directory.is_dir():
        for root, dirs, files in os.walk(directory):
            if Path(root) != directory and (SWEEP_MARKER in files or is_sweep(Path(root))):
                return Path(root), "holds"
            dirs[:] = [d for d in dirs if d != "points"]  # point stores are files
    return None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename). The temporary file is
    created afresh (``O_EXCL | O_NOFOLLOW``, after removing what an earlier process of the same
    pid left under its name): a symbolic link planted there is removed, never written through."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_if_changed(path: str | Path, text: str) -> bool:
    """Write ``text`` atomically unless the file already holds exactly it.

    Keeping the modification time of unchanged files is what lets Snakemake rerun only the
    shards whose points changed. Returns whether the file was written.
    """
    path = Path(path)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    atomic_write_text(path, text)
    return True
