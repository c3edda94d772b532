"""Reading an sgdsweep export where it lies: a zip or an export directory over http(s) (or any
fsspec URL), without downloading it first.

- :func:`open_export_source` opens an export for ``sgdsweep verify`` and ``sgdsweep import``: a
  local file as it is, a URL through fsspec's seekable file object (HTTP range requests), which
  :mod:`zipfile` reads like a local file. The bytes read through it are counted and bounded
  (:data:`MAX_READ_FACTOR` times the size the server declares, plus :data:`READ_SLACK_BYTES`):
  the checks of :mod:`sgdsweep.share.verify` read each member once to hash it and the
  arrays' metadata once more, so a server that serves more than that is refused instead of
  being read without end. Every check runs as on a local file.
- :func:`export_store` is the read-only Zarr store over an open export (local or remote), for
  the checks that read its arrays' metadata through Zarr.
- :func:`open_remote_ensemble` is what :func:`sgdsweep.open_ensemble` opens a URL with:
  ``zip::https://host/sweep.zip`` (a zip export), ``https://host/sweep/`` (an export directory,
  ``sgdsweep export --format directory``) or any fsspec URL; fsspec fetches only the blocks of
  :data:`HTTP_BLOCK_BYTES` that hold the metadata and the chunks read.
"""

from __future__ import annotations

import contextlib
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sgdsweep.errors import UsageError

#: Bytes fsspec fetches per HTTP range request when sgdsweep reads a remote export: 64 KiB
#: (an ensemble chunk or a metadata document is a few kB; the default, 5 MiB, would fetch a
#: small export whole to read one variable).
HTTP_BLOCK_BYTES = 1 << 16
#: fsspec's HTTP options for a remote export: blocks of :data:`HTTP_BLOCK_BYTES`, the last 256
#: of them kept (16 MiB), so that Zarr's reads of many keys in turn fetch each block once.
HTTP_OPTIONS: dict[str, Any] = {"block_size": HTTP_BLOCK_BYTES, "cache_type": "blockcache",
                                "cache_options": {"maxblocks": 256}}
#: A remote export is read at most this many times its declared size over (each member once to
#: hash it, the arrays' metadata once more through Zarr, the zip's directory once per opening).
MAX_READ_FACTOR = 4
#: Bytes read from a remote export beyond ``MAX_READ_FACTOR`` times its size (its zip directory
#: and metadata read again for a small file).
READ_SLACK_BYTES = 64 << 20


def is_url(src: str | Path) -> bool:
    """Whether ``src`` is a URL (``scheme://…``, or an fsspec chain such as ``zip::https://…``)."""
    return isinstance(src, str) and "://" in src


class BoundedReader(io.RawIOBase):
    """A seekable binary file over ``raw`` (fsspec's file object) that counts the bytes read
    through it and raises :class:`~sgdsweep.share.verify.ShareError` once they would pass
    ``limit``."""

    def __init__(self, raw: Any, size: int, limit: int, src: str) -> None:
        super().__init__()
        self.raw, self.size, self.limit, self.src, self.count = raw, size, limit, src, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, n: int = -1) -> bytes:
        from sgdsweep.share.verify import ShareError

        if n is None or n < 0:
            n = max(self.size - self.raw.tell(), 0)
        if self.count + n > self.limit:
            raise ShareError(f"{self.src}: reading it would take more than {self.limit} bytes from the server "
                             f"(it declares {self.size} bytes; sgdsweep reads an export at most {MAX_READ_FACTOR} "
                             "times over); the server sends more than the file it declares, do not use it")
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()
        super().close()


class _KeptOpen(io.RawIOBase):
    """``inner`` (a seekable binary file) that closing leaves open: a view of the export's file for
    fsspec's zip file system, which closes what it is given when it is collected."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def read(self, n: int = -1) -> bytes:
        return self.inner.read(n)

    def readinto(self, buffer: Any) -> int:
        return self.inner.readinto(buffer)


def _remote_file(src: str) -> tuple[Any, int]:
    """fsspec's seekable file of ``src`` and its size in bytes.

    Raises: UsageError naming the URL: not found, an unknown protocol, a server that says no size.
    """
    import fsspec

    try:
        fh = fsspec.open(src, "rb", block_size=HTTP_BLOCK_BYTES).open()
    except FileNotFoundError:
        raise UsageError(f"export file not found: {src}") from None
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(f"export file {src!r}: {exc}; give a local path or a URL (https://…, or an fsspec "
                         "URL whose filesystem is installed) of an export .zip") from None
    size = getattr(fh, "size", None)
    if not isinstance(size, int) or size <= 0:
        fh.close()
        raise UsageError(f"export file {src!r}: the server does not say its size, so sgdsweep cannot read it "
                         "in place; download it and give the local file")
    return fh, size


@contextlib.contextmanager
def open_export_source(src: str | Path) -> Iterator[tuple[zipfile.ZipFile, int]]:
    """The export ``src`` (a path or a URL) open as a zip file, with its size in bytes.

    Raises:
        UsageError: the file is not found, or the URL cannot be read in place.
        ShareError: not a complete zip file; a remote one that sends more than it declares.
    """
    from sgdsweep.share.verify import open_export

    if not is_url(src):
        path = Path(src)
        if not path.is_file():
            raise UsageError(f"export file not found: {src} (give an export .zip written by sgdsweep export "
                             "or sgdsweep merge)")
        with open_export(path, src) as zf:
            yield zf, path.stat().st_size
        return
    raw, size = _remote_file(str(src))
    reader = BoundedReader(raw, size, MAX_READ_FACTOR * size + READ_SLACK_BYTES, str(src))
    try:
        with open_export(reader, src) as zf:  # type: ignore[arg-type]  # a seekable binary file
            yield zf, size
    finally:
        reader.close()


@contextlib.contextmanager
def export_store(source: Path | zipfile.ZipFile) -> Iterator[Any]:
    """A read-only Zarr store over the export ``source`` (a local path, or an open export):
    Zarr's ``ZipStore`` of a local file, or, for a remote one, fsspec's zip file system over the
    same (bounded) file object."""
    import zarr

    if isinstance(source, Path) or source.filename:
        with zarr.storage.ZipStore(Path(source if isinstance(source, Path) else str(source.filename)),
                                   mode="r") as store:
            yield store
        return
    from fsspec.implementations.zip import ZipFileSystem

    fs = ZipFileSystem(fo=_KeptOpen(source.fp), skip_instance_cache=True)  # its zip directory read again: bounded too
    try:
        yield zarr.storage.FsspecStore.from_mapper(fs.get_mapper(""), read_only=True)
    finally:
        fs.close()  # closes its own view of the zip, not the file object


def _remote_fs(url: str) -> tuple[Any, str]:
    """fsspec's file system and path of ``url``, HTTP read in blocks of :data:`HTTP_BLOCK_BYTES`.

    Raises: UsageError naming the URL and the forms allowed.
    """
    import fsspec

    protocols = [part.split("://")[0] for part in url.split("::") if "://" in part]
    options = {p: HTTP_OPTIONS for p in protocols if p in ("http", "https")}
    if "::" not in url:
        options = options.get(url.split("://")[0], {})
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError, OSError) as exc:
        raise UsageError(f"ensemble URL {url!r}: {exc}; allowed: zip::https://HOST/SWEEP.zip (an export), "
                         "https://HOST/DIR (an export directory, sgdsweep export --format directory), or an "
                         "fsspec URL whose filesystem is installed") from None


def open_remote_ensemble(url: str) -> Any:
    """The ensemble at ``url`` opened lazily as an ``xarray.Dataset``, after the check
    :func:`sgdsweep.open_ensemble` runs on a local one
    (:func:`sgdsweep.store.integrity.check_ensemble`: its metadata against its record, every
    chunk present). The chunks present are read from the zip's directory for ``zip::…``, from
    the export's manifest (``sgdsweep-manifest.json``) for an export directory, and from the
    server's listing otherwise. Only the metadata and the chunks read are transferred.

    Raises:
        UsageError: the URL cannot be read, or holds no Zarr group.
        StoreError: the ensemble fails the check, naming the array.
    """
    import json

    import xarray as xr
    import zarr

    from sgdsweep.share.verify import MANIFEST
    from sgdsweep.store.integrity import check_ensemble

    fs, root = _remote_fs(url)
    root = root.rstrip("/")
    keys: set[str] | None = None
    try:
        if url.startswith("zip::"):
            keys = {name[len(root):].lstrip("/") for name in fs.find(root)}
        elif fs.exists(f"{root}/{MANIFEST}"):
            keys = set(json.loads(fs.cat_file(f"{root}/{MANIFEST}")).get("members", {})) | {MANIFEST}
        store = zarr.storage.FsspecStore.from_mapper(fs.get_mapper(root), read_only=True)
        check_ensemble(url, store=store, keys=keys)
        return xr.open_zarr(store)
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        raise UsageError(f"ensemble URL {url!r}: no sgdsweep ensemble there; allowed: zip::https://HOST/SWEEP.zip "
                         "(an export), https://HOST/DIR (an export directory, sgdsweep export --format directory "
                         "published on a web server)") from None
    except (ValueError, OSError) as exc:  # StoreError (the check's) is neither: it passes
        raise UsageError(f"ensemble URL {url!r} cannot be read ({exc}); check the address and that the "
                         "server is up") from None
