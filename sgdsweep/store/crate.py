"""The RO-Crate of an export: ``ro-crate-metadata.json``, written with the ``rocrate`` library.

It describes, in schema.org terms as RO-Crate 1.1+ and WorkflowHub read them:

- the root dataset (the export): the sweep's name, its licence (an SPDX identifier), when it
  was made, and every measured variable of the ensemble (``variableMeasured``: name, long name,
  units and description as the ensemble's attributes give them);
- its files: the ensemble (the Zarr group at the root, ``zarr.json``), ``fits.json``, the report
  and its figures when the sweep has them, the config (``config.yaml``), the manifest and README;
- the workflow as WorkflowHub describes a Snakemake workflow: ``workflow/Snakefile`` (a
  ``ComputationalWorkflow`` in the Snakemake language, the crate's ``mainEntity``) and its rule
  files;
- the creating software (``sgdsweep`` and its version) and a ``CreateAction`` linking the
  config and the workflow to the results it made.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sgdsweep.errors import UsageError

#: The file name RO-Crate gives its metadata.
CRATE = "ro-crate-metadata.json"
#: The licence an export declares unless ``sgdsweep export --license`` says another.
DEFAULT_LICENSE = "CC-BY-4.0"
_SPDX = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}")
_DESCRIPTIONS = {
    "zarr.json": ("The ensemble", ("The sweep's results as a Zarr (format 3) group, the root of this crate: "
                  "one row per point, measured values next to their standard errors and theory.")),
    "fits.json": ("Scaling-law fits", "The fits of the ensemble (also in its root attribute 'fits')."),
    "report.html": ("Report", "The self-contained HTML report of the sweep: figures, fits and verdicts."),
    "config.yaml": ("Sweep configuration", "The resolved configuration that made these results."),
    "README.txt": ("README", "How to open, verify and import this export."),
    "sgdsweep-manifest.json": ("Manifest", ("The SHA-256 and size of every member, the config and provenance; "
                               "sgdsweep verify checks them.")),
}


def check_license(license_id: str) -> str:
    """``license_id`` if it looks like an SPDX identifier (``CC-BY-4.0``, ``CC0-1.0``, ``MIT``).

    Raises: UsageError naming what was given and what is allowed.
    """
    if not isinstance(license_id, str) or not _SPDX.fullmatch(license_id):
        raise UsageError(f"export --license {license_id!r}: allowed: an SPDX licence identifier such as "
                         f"{DEFAULT_LICENSE} or CC0-1.0 (letters, digits and . + -)")
    return license_id


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sgdsweep")
    except PackageNotFoundError:
        return "unknown"


def crate_metadata(sweep: str, members: list[str], variables: dict[str, dict[str, Any]],
                   license_id: str, created: str | None, workflow_files: dict[str, Path]) -> bytes:
    """The bytes of ``ro-crate-metadata.json`` for an export of ``sweep`` holding ``members``
    (member names), whose ensemble has ``variables`` (name → attributes), under ``license_id``,
    made at ``created`` (ISO 8601, UTC), with ``workflow_files`` (member name → local file, the
    first the Snakefile)."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    crate = ROCrate(gen_preview=False)
    root = crate.root_dataset
    root["name"] = f"sgdsweep sweep '{sweep}'"
    root["description"] = (f"Results of the SGD parameter sweep '{sweep}' made by sgdsweep: the ensemble (a Zarr "
                           "group), its fits, report and the point stores they were built from.")
    spdx = bool(_SPDX.fullmatch(license_id))  # else the words of the config's metadata.license
    licence = crate.add(ContextEntity(crate, f"https://spdx.org/licenses/{license_id}" if spdx else "#license",
                                      properties={"@type": "CreativeWork", "name": license_id,
                                                  **({"identifier": license_id} if spdx else {})}))
    root["license"] = licence
    if created:
        root["datePublished"] = created
    root["variableMeasured"] = [
        crate.add(ContextEntity(crate, f"#variable-{name}", properties={
            "@type": "PropertyValue", "name": name, "alternateName": str(attrs.get("long_name", name)),
            "unitText": str(attrs.get("units", "")), "description": str(attrs.get("description", ""))}))
        for name, attrs in sorted(variables.items())]
    software = crate.add(ContextEntity(crate, "#sgdsweep", properties={
        "@type": "SoftwareApplication", "name": "sgdsweep", "version": _version(),
        "description": "Parameter sweeps of SGD dynamics on models with known physics."}))
    names = list(workflow_files)
    workflow = crate.add_workflow(workflow_files[names[0]], dest_path=names[0], main=True, lang="snakemake",
                                  properties={"name": "sgdsweep workflow", "version": _version()})
    parts = []
    for name in names[1:]:
        parts.append(crate.add_file(workflow_files[name], dest_path=name,
                                    properties={"encodingFormat": "text/x-snakemake"}))
    if parts:
        workflow["hasPart"] = parts
    files = {}
    for name in members:
        if name in _DESCRIPTIONS:
            title, text = _DESCRIPTIONS[name]
            files[name] = crate.add_file(dest_path=name, properties={"name": title, "description": text})
        elif name.startswith("figures/"):
            files[name] = crate.add_file(dest_path=name, properties={
                "name": f"Figure {Path(name).stem}", "encodingFormat": "image/png" if name.endswith(".png")
                else "image/svg+xml"})
    if "zarr.json" in files:
        files["zarr.json"]["encodingFormat"] = "application/json"
        files["zarr.json"]["conformsTo"] = {"@id": "https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html"}
    results = [files[n] for n in ("zarr.json", "fits.json", "report.html") if n in files]
    action = crate.add(ContextEntity(crate, "#run", properties={
        "@type": "CreateAction", "name": f"sgdsweep run of sweep '{sweep}'"}))
    action["instrument"] = workflow
    action["agent"] = software
    action["result"] = results
    if "config.yaml" in files:
        action["object"] = [files["config.yaml"]]
    if created:
        action["endTime"] = created
    root["mentions"] = [action]
    return _dump(crate.metadata.generate())


def _dump(document: dict[str, Any]) -> bytes:
    import json

    return json.dumps(document, indent=1, sort_keys=True).encode()
