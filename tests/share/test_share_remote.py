"""A shared sweep read where it lies (a real HTTP server on 127.0.0.1 with range requests, the
bytes it serves counted), the export carrying its report, figures and RO-Crate, the directory
form of an export, and the project's CITATION.cff."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xarray as xr
import yaml
from conftest import REPO, cli, make_finished_sweep

import sgdsweep
from sgdsweep.share.archive import export_sweep, import_sweep, verify

#: Size of the stand-in for a report: a real self-contained report of the tiny sweep, figures
#: embedded, is about 1.2 MB.
REPORT_BYTES = 4_000_000


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with HTTP range requests (``Range: bytes=a-b``, answered 206), counting the
    body bytes it sends in :attr:`served` (one entry per response)."""

    served: list[int]

    def log_message(self, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            return super().send_head()  # listings, 404s
        size = path.stat().st_size
        start, end = 0, size - 1
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
        if match:
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
            else:
                start = max(size - int(match.group(2)), 0)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        fh = open(path, "rb")  # noqa: SIM115 - closed by the server after copyfile
        fh.seek(start)
        self._left = end - start + 1 if self.command != "HEAD" else 0
        return fh

    def copyfile(self, source: Any, outputfile: Any) -> None:
        left = getattr(self, "_left", None)
        if left is None:  # a listing
            data = source.read()
            outputfile.write(data)
            self.served.append(len(data))
            return
        sent = 0
        while sent < left:
            block = source.read(min(left - sent, 1 << 16))
            if not block:
                break
            outputfile.write(block)
            sent += len(block)
        self.served.append(sent)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A finished tiny sweep with a report and figures, exported as a zip and as a directory,
    both published by a range-capable HTTP server on 127.0.0.1."""
    root = tmp_path_factory.mktemp("remote")
    sweep_dir = make_finished_sweep(root)
    (sweep_dir / "figures").mkdir()
    (sweep_dir / "figures" / "against_lr.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    (sweep_dir / "report.html").write_text("<html><body><h1>tiny</h1>" + "x" * REPORT_BYTES + "</body></html>")
    public = root / "public"
    export_sweep(sweep_dir, str(public / "tiny.zip"))
    export_sweep(sweep_dir, str(public / "tiny"), fmt="directory")
    served: list[int] = []
    handler = type("Handler", (RangeHandler,), {"served": served})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(public), **k))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"root": root, "sweep_dir": sweep_dir, "public": public, "served": served,
               "url": f"http://127.0.0.1:{server.server_address[1]}"}
    finally:
        server.shutdown()
        server.server_close()


def test_one_variable_over_http_transfers_a_small_fraction(shared):
    """sgdsweep.open_ensemble("zip::URL") opens the export lazily; selecting one variable reads
    the zip's directory, the metadata and that variable's chunks, not the file."""
    size = (shared["public"] / "tiny.zip").stat().st_size
    shared["served"].clear()
    ds = sgdsweep.open_ensemble(f"zip::{shared['url']}/tiny.zip")
    loss = ds["loss"].values
    remote = sum(shared["served"])
    local = xr.open_zarr(shared["sweep_dir"] / "ensemble.zarr")["loss"].values
    assert (loss == local).all()
    print(f"one variable over HTTP: {remote} bytes served in {len(shared['served'])} responses "
          f"of a {size}-byte export ({remote / size:.1%})")
    assert size > REPORT_BYTES and remote < 0.15 * size, (remote, size)
    # plain xarray, as docs/sharing.md shows it
    shared["served"].clear()
    plain = xr.open_zarr(f"zip::{shared['url']}/tiny.zip", storage_options={"http": {"block_size": 1 << 16}})
    assert (plain["loss"].values == local).all() and sum(shared["served"]) < 0.15 * size


def test_export_directory_opens_over_http(shared):
    directory = shared["public"] / "tiny"
    assert (directory / "zarr.json").is_file() and (directory / "report.html").is_file()
    assert "consolidated_metadata" in json.loads((directory / "zarr.json").read_text())
    assert (directory / "sgdsweep-manifest.sha256").read_text().strip() == \
        hashlib.sha256((directory / "sgdsweep-manifest.json").read_bytes()).hexdigest()
    local = xr.open_zarr(shared["sweep_dir"] / "ensemble.zarr")
    ds = sgdsweep.open_ensemble(f"{shared['url']}/tiny")
    assert (ds["weight_var"].values == local["weight_var"].values).all()
    plain = xr.open_zarr(f"{shared['url']}/tiny")
    assert (plain["loss"].values == local["loss"].values).all()


def test_verify_and_import_a_url_read_in_place(shared, tmp_path):
    url = f"{shared['url']}/tiny.zip"
    size = (shared["public"] / "tiny.zip").stat().st_size
    shared["served"].clear()
    proc = cli("verify", url)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr
    print(f"verify over HTTP: {sum(shared['served'])} bytes served for a {size}-byte export")
    assert sum(shared["served"]) < 3 * size
    target = import_sweep(url, tmp_path / "results")
    assert (target / "report.html").read_text().startswith("<html><body><h1>tiny</h1>")
    assert (target / "figures" / "against_lr.png").is_file() and (target / "ro-crate-metadata.json").is_file()
    assert (target / "ensemble.zarr" / "zarr.json").is_file()
    assert not (target / "ensemble.zarr" / "report.html").exists()
    assert not (target / "ensemble.zarr" / "figures").exists() and not (target / "ensemble.zarr" / "workflow").exists()
    proc = cli("import", f"{shared['url']}/missing.zip", "--results-dir", str(tmp_path / "other"))
    assert proc.returncode == 2 and "missing.zip" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "other").exists()


def test_a_tampered_report_fails_verify_over_http(shared):
    public = shared["public"]
    with zipfile.ZipFile(public / "tiny.zip") as zin, zipfile.ZipFile(public / "bad.zip", "w") as zout:
        zout.comment = zin.comment
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, data.replace(b"<h1>tiny</h1>", b"<h1>evil</h1>") if info.filename == "report.html"
                          else data)
    proc = cli("verify", f"{shared['url']}/bad.zip")
    assert proc.returncode == 2 and "'report.html' does not match its SHA-256" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_export_carries_report_figures_and_crate(shared):
    manifest = verify(shared["public"] / "tiny.zip")
    members = manifest["members"]
    assert {"report.html", "figures/against_lr.png", "ro-crate-metadata.json", "config.yaml",
            "workflow/Snakefile"} <= set(members)
    with zipfile.ZipFile(shared["public"] / "tiny.zip") as zf:
        crate = json.loads(zf.read("ro-crate-metadata.json"))
        config = yaml.safe_load(zf.read("config.yaml"))
    assert config == manifest["config"]
    graph = {e["@id"]: e for e in crate["@graph"]}
    root = graph["./"]
    assert graph[root["license"]["@id"]]["identifier"] == "CC-BY-4.0"
    measured = {graph[v["@id"]]["name"]: graph[v["@id"]] for v in root["variableMeasured"]}
    assert {"weight_var", "weight_var_se", "loss"} <= set(measured) and measured["loss"]["unitText"]
    workflow = graph[root["mainEntity"]["@id"]]
    assert root["mainEntity"]["@id"] == "workflow/Snakefile" and "ComputationalWorkflow" in workflow["@type"]
    assert graph[workflow["programmingLanguage"]["@id"]]["name"] == "Snakemake"
    software = graph["#sgdsweep"]
    assert software["version"] == sgdsweep.__version__
    run = graph["#run"]
    assert run["instrument"]["@id"] == "workflow/Snakefile" and run["object"] == [{"@id": "config.yaml"}]
    assert {"report.html", "figures/against_lr.png", "fits.json"} <= set(graph)


def test_export_refuses_bad_licence_and_directory_destination(shared, tmp_path):
    proc = cli("export", str(shared["sweep_dir"]), str(tmp_path / "x.zip"), "--license", "no licence!")
    assert proc.returncode == 2 and "--license 'no licence!'" in proc.stderr and "SPDX" in proc.stderr
    proc = cli("export", str(shared["sweep_dir"]), str(tmp_path / "x.zip"), "--format", "directory")
    assert proc.returncode == 2 and "--format directory" in proc.stderr
    proc = cli("export", str(shared["sweep_dir"]), str(shared["public"] / "tiny"), "--format", "directory")
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert not (tmp_path / "x.zip").exists() and (shared["public"] / "tiny" / "zarr.json").is_file()


def test_citation_cff_describes_the_project():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1]
    assert citation["cff-version"] == "1.2.0" and citation["title"]
    assert str(citation["version"]) == version == sgdsweep.__version__
    assert citation["authors"] and citation["license"] == "MIT"


def test_an_export_without_report_still_shares(tmp_path):
    sweep_dir = make_finished_sweep(tmp_path)
    manifest = export_sweep(sweep_dir, str(tmp_path / "plain.zip"))
    assert "report.html" not in manifest["members"] and "ro-crate-metadata.json" in manifest["members"]
    shutil.rmtree(tmp_path / "results")
