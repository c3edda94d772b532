"""One workflow run per sweep at a time, and a clear refusal for the second.

The lock is an advisory ``flock`` on ``<results>/<sweep>/.sgdsweep.lock``. ``sgdsweep run``
takes it before anything starts and passes it on to its Snakemake process; a plain
``snakemake`` run takes it when it starts running jobs (the workflow's ``onstart`` handler, never
while the workflow is only parsed). The kernel releases it when the processes holding it end in
any way — also on ``kill -9`` — so, unlike Snakemake's own directory lock, it never goes stale.
The lock file records who holds it (pid, host, start time, Snakemake's pid) for the refusal
message. It is opened with ``O_NOFOLLOW``: a symbolic link in its place is refused, naming it,
and the file the link points to is left untouched.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import IO, Any

from sgdsweep.core.paths import SWEEP_MARKER
from sgdsweep.errors import SgdsweepError, UsageError

LOCK_NAME = SWEEP_MARKER


class SweepLocked(SgdsweepError):
    """Another workflow run holds the sweep."""

    exit_code = 3


def ensure_writable(directory: Path, what: str = "results directory",
                    fix: str = "or set results_dir in the config to a writable directory") -> None:
    """Create ``directory`` if needed and prove that files can be written in it.

    Args:
        directory: the directory to check.
        what: what the directory is, for the message.
        fix: the way out besides fixing its permissions or mount, for the message.

    Raises:
        UsageError: naming the directory, the operating system's reason and the fix.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # a new file of a random name (O_EXCL): nothing already there is written through
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(
            f"{what} {directory} is not writable ({exc.strerror or exc}); nothing was changed. Fix "
            f"its permissions or mount (an immutable one: chattr -i), {fix}") from None


def check_writable(directory: Path, what: str = "results directory",
                   fix: str = "or set results_dir in the config to a writable directory") -> None:
    """Check, without writing anything, that ``directory`` could be created and written:
    its nearest existing ancestor is a directory, not on a read-only file system, and writable
    by this process (for the workflow's parse, which writes nothing; :func:`ensure_writable`
    proves it by writing).

    Raises:
        UsageError: naming the directory, the reason and the fix, as :func:`ensure_writable`.
    """
    existing = Path(directory).absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        reason = errno.ENOTDIR
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:
        reason = errno.EROFS
    elif not os.access(existing, os.W_OK):
        reason = errno.EACCES
    else:
        return
    raise UsageError(f"{what} {directory} is not writable ({os.strerror(reason)}); nothing was changed. Fix "
                     f"its permissions or mount (an immutable one: chattr -i), {fix}")


def acquire(sweep_dir: Path) -> IO[str]:
    """Take the sweep's lock without waiting; keep the returned file open to hold it.

    Raises:
        SweepLocked: another live process holds it (the message says which).
    """
    sweep_dir = Path(sweep_dir)
    ensure_writable(sweep_dir)
    fh = os.fdopen(_open_lock_file(sweep_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        fh.seek(0)
        holder = fh.read().strip()
        fh.close()
        raise SweepLocked(f"another sgdsweep workflow is running on {sweep_dir}: {_describe(holder)}; "
                          "wait for it to finish or stop it — two runs on the same results would "
                          "race") from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": platform.node(),
                         "since": _dt.datetime.now().isoformat(timespec="seconds")}))
    fh.flush()
    return fh


def _open_lock_file(path: Path, flags: int) -> int:
    """A descriptor of the lock file ``path`` opened with ``flags``, never through a symbolic
    link (``O_NOFOLLOW``): a link planted there would make the lock's record overwrite the file
    it points to.

    Raises:
        UsageError: ``path`` is a symbolic link (naming it and where it points), or cannot be
            opened (naming it and the operating system's reason)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            raise UsageError(f"the sweep's lock file {path} is a symbolic link (to {target}); "
                             "sgdsweep does not write through links there. Remove the link (rm "
                             f"{path}; the file it points to is untouched) and rerun") from None
        raise UsageError(f"cannot open the sweep's lock file {path} ({exc.strerror or exc}); remove it "
                         "if it is not a file, or make its directory writable, and rerun") from None


def create_afresh(path: Path, mode: str = "wb") -> IO[Any]:
    """``path`` created afresh and opened for writing in ``mode`` (``"wb"`` or ``"w"``, UTF-8):
    what was there before — an earlier run's file, or a symbolic link, which is removed, never
    followed — is gone, and a file or link placed there meanwhile makes the creation fail
    (``O_EXCL | O_NOFOLLOW``) rather than be written through. For the logs a run writes in the
    sweep directory.

    Raises:
        UsageError: naming the file and the operating system's reason, when it cannot be created."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot create {path} ({exc.strerror or exc}); nothing was started. Remove what "
                         f"is there and check that {path.parent} is writable") from None
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
    except (OSError, TypeError, ValueError):
        return False
    return True


def _describe(holder: str) -> str:
    """Who holds the lock, from the lock file's record: ``sgdsweep run`` and the Snakemake process
    it started (which goes on holding the lock if ``sgdsweep run`` itself was killed)."""
    try:
        info = json.loads(holder)
    except ValueError:
        return holder or "an unknown process"
    if not isinstance(info, dict):
        return holder
    where = f" on {info['host']}" if info.get("host") else ""
    since = f" since {info['since']}" if info.get("since") else ""
    snakemake = info.get("snakemake_pid")
    if snakemake is not None and info.get("pid") != snakemake and not _alive(info.get("pid")):
        return (f"its Snakemake process (pid {snakemake}{where}{since}) goes on although the sgdsweep "
                f"run that started it (pid {info.get('pid')}) is gone; stop it with kill {snakemake}")
    text = f"pid {info.get('pid')}{where}{since}"
    return text + (f", Snakemake pid {snakemake}" if snakemake not in (None, info.get("pid")) else "")


#: Environment variable: the descriptor of the sweep lock that ``sgdsweep run`` took and passed
#: on to its Snakemake process (see :func:`acquire_or_inherit`).
LOCK_FD_ENV = "SGDSWEEP_SWEEP_LOCK_FD"


def acquire_or_inherit(sweep_dir: Path) -> IO[str] | int:
    """The sweep's lock for a Snakemake process: inherited from ``sgdsweep run``, or taken here.

    ``sgdsweep run`` takes the lock before anything else (so a second run is refused before it
    starts a Dask cluster) and passes its descriptor to Snakemake in :data:`LOCK_FD_ENV`. Sharing
    the open file shares the lock, so the lock lives as long as either process. A descriptor that
    is not this sweep's lock file, or not open, is ignored and the lock is taken as usual.

    Raises:
        SweepLocked: another live process holds it.
    """
    fd_text = os.environ.get(LOCK_FD_ENV, "")
    if fd_text.isdigit():
        fd = int(fd_text)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(Path(sweep_dir) / LOCK_NAME))
        except OSError:
            same = False
        if same:
            try:  # succeeds at once when this open file already holds the lock
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass
            else:
                record_holder(Path(sweep_dir) / LOCK_NAME, os.getpid())
                return fd
    fh = acquire(sweep_dir)
    record_holder(Path(sweep_dir) / LOCK_NAME, os.getpid())
    return fh


def record_holder(lock_file: Path, snakemake_pid: int) -> None:
    """Add the Snakemake process ``snakemake_pid`` to the lock file's record of who holds the
    lock (for the refusal's message; a failure to write it is ignored)."""
    try:
        with os.fdopen(_open_lock_file(Path(lock_file), os.O_RDWR), "r+") as fh:
            info = json.loads(fh.read())
            info["snakemake_pid"] = snakemake_pid
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(info))
    except (OSError, ValueError, TypeError, UsageError):
        pass
