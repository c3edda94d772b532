"""The parts of an export beyond its data: the sweep's report and figures, the workflow that
made it, and the directory form of an export (``sgdsweep export --format directory``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
import zipfile
from pathlib import Path

from sgdsweep.errors import UsageError
from sgdsweep.share.verify import COMMENT_PREFIX

log = logging.getLogger("sgdsweep.share.archive")
#: The file of a directory export holding its manifest's SHA-256 (a zip export's comment).
MANIFEST_SHA256 = "sgdsweep-manifest.sha256"


def answer_members(sweep_dir: Path) -> dict[str, bytes | Path]:
    """The sweep's report (``report.html``) and figures (``figures/<name>.png|svg``), when the
    report is there and not older than ``fits.json`` (a report of earlier fits is left out, with
    a warning); empty otherwise."""
    report, fits = sweep_dir / "report.html", sweep_dir / "fits.json"
    if not report.is_file() or report.is_symlink():
        log.warning("%s has no report.html: the export carries no report (run the workflow to the end, "
                    "then export again, to include it)", sweep_dir)
        return {}
    if report.stat().st_mtime < fits.stat().st_mtime:
        log.warning("%s is older than %s: the export carries no report (run the workflow to bring it up to "
                    "date, then export again)", report, fits)
        return {}
    members: dict[str, bytes | Path] = {"report.html": report}
    figures = sweep_dir / "figures"
    if figures.is_dir():
        for path in sorted(figures.iterdir()):
            if (path.suffix in (".png", ".svg") and path.is_file() and not path.is_symlink()
                    and re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", path.name)):
                members[f"figures/{path.name}"] = path
    return members


def workflow_members() -> dict[str, Path]:
    """The workflow that made the sweep: ``workflow/Snakefile`` and ``workflow/rules/*.smk``."""
    from sgdsweep.core.paths import workflow_root

    root = workflow_root()
    files = {"workflow/Snakefile": root / "Snakefile"}
    files.update({f"workflow/rules/{p.name}": p for p in sorted((root / "workflow" / "rules").glob("*.smk"))})
    return {name: path for name, path in files.items() if path.is_file()}


def unzip_to_directory(local: Path, dest: Path) -> None:
    """The verified export ``local`` written as the new directory ``dest``: every member under
    its name, and ``sgdsweep-manifest.sha256`` (the manifest's SHA-256, the zip comment); staged
    beside ``dest`` and renamed into place only once complete, never over an existing path."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".export-{uuid.uuid4().hex[:8]}"
    try:
        with zipfile.ZipFile(local) as zf:
            for info in zf.infolist():  # names checked by verify: relative, plain, no links
                out = staging / info.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(out, "xb") as fh:
                    shutil.copyfileobj(src, fh)
            (staging / MANIFEST_SHA256).write_bytes(zf.comment[len(COMMENT_PREFIX):] + b"\n")
        if os.path.lexists(dest):
            raise UsageError(f"{dest} already exists; sgdsweep never overwrites a file or directory. Remove it or "
                             "choose another name")  # again: it may have appeared meanwhile
        os.rename(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
