"""The span rows as Parquet under ``AUDIT_SPANS/dt=YYYY-MM-DD/hour=HH/``, durable before a batch
is acknowledged, and the intake's limits.

Durability (local storage): each hour's rows go to a hidden temporary file (``.tmp-…``: Spark
and Hadoop skip names starting with ``.`` or ``_``), which is flushed and fsynced, renamed to
``spans-<host>-<pid>-<uuid>.parquet`` (no two gunicorn workers or machines collide), and the
directory is fsynced; only then does ``write`` return. If any step fails nothing of the batch is
left visible (best effort: a file already renamed is removed again), the caller answers 503 and
the exporter sends the batch again. ``s3a://`` (pyarrow's S3FileSystem; an object appears whole
at the end of its upload) and ``hdfs://`` (HadoopFileSystem: temporary name, then move) are
written through ``pyarrow.fs``; they are not tested here.

Small files: one file per request per hour. At the Collector's default batch (8192 spans, a
few a second) that is thousands of files a day, each costing the audit a task's open and a
footer read. ``compact_hour`` merges a closed hour into one file (no ``manage.py`` command
calls it yet).
"""

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recovery.telemetry.schema import SPAN_SCHEMA

PREFIX = "spans-"
TMP = ".tmp-"
HOST = socket.gethostname().split(".")[0].replace("-", "_") or "host"


class Unavailable(Exception):
    """The intake cannot take a batch now (503 with Retry-After): full, or short of disk."""


def hour_dir(day, hour):
    return f"dt={day}/hour={hour}"


def file_name():
    return f"{PREFIX}{HOST}-{os.getpid()}-{uuid.uuid4().hex}.parquet"


def table_of(columns):
    return pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)


def remote(base):
    """(pyarrow filesystem, root path) for s3a:// and hdfs:// bases; None for a local one."""
    if base.startswith(("s3a://", "s3://")):
        from pyarrow import fs

        bucket_path = base.split("://", 1)[1]
        return fs.S3FileSystem(), bucket_path.rstrip("/")
    if base.startswith("hdfs://"):
        from pyarrow import fs

        filesystem, path = fs.FileSystem.from_uri(base)
        return filesystem, path.rstrip("/")
    return None


def write(base, flattened):
    """Write each hour of a ``spans.Flattened`` as one Parquet file, durably; the paths."""
    if not flattened.by_hour:
        return []
    target = remote(base)
    if target is not None:
        return _write_remote(*target, flattened)
    return _write_local(Path(base), flattened)


def _write_local(base, flattened):
    staged = []  # (directory, temporary, final)
    try:
        for (day, hour), columns in sorted(flattened.by_hour.items()):
            directory = base / hour_dir(day, hour)
            directory.mkdir(parents=True, exist_ok=True)
            name = file_name()
            temporary = directory / (TMP + name)
            staged.append((directory, temporary, directory / name))
            _write_file(temporary, table_of(columns))
        for _, temporary, final in staged:
            os.rename(temporary, final)
        for directory in {d for d, _, _ in staged}:
            _fsync_dir(directory)
    except BaseException:
        for _, temporary, final in staged:
            for path in (temporary, final):
                with contextlib.suppress(OSError):
                    path.unlink()
        raise
    return [str(final) for _, _, final in staged]


def _write_file(path, table):
    with open(path, "xb") as handle:
        pq.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_remote(filesystem, root, flattened):
    written = []
    for (day, hour), columns in sorted(flattened.by_hour.items()):
        directory = f"{root}/{hour_dir(day, hour)}"
        filesystem.create_dir(directory, recursive=True)
        name = file_name()
        final = f"{directory}/{name}"
        if type(filesystem).__name__ == "S3FileSystem":
            pq.write_table(table_of(columns), final, filesystem=filesystem)
        else:
            temporary = f"{directory}/{TMP}{name}"
            pq.write_table(table_of(columns), temporary, filesystem=filesystem)
            filesystem.move(temporary, final)
        written.append(final)
    return written


def free_bytes(base):
    """Free bytes on a local base's filesystem (its nearest existing ancestor); None remote."""
    if remote(base) is not None:
        return None
    path = Path(base).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class InFlight:
    """A per-process bound on batches being written. ``enter(limit)`` takes a slot or raises
    Unavailable; the limit is read per call so a setting's change applies at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0

    @contextlib.contextmanager
    def slot(self, limit):
        with self._lock:
            if self.count >= limit:
                raise Unavailable(f"{self.count} batches are being written (OTLP_MAX_IN_FLIGHT)")
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1


IN_FLIGHT = InFlight()


# Compaction -------------------------------------------------------------------------------


def _exchange(a, b):
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), str(a))


def span_files(directory):
    return sorted(p for p in Path(directory).iterdir() if p.name.startswith(PREFIX))


def compact_hour(directory):
    """Merge an hour directory's span files into one; (files merged, rows). Local only.

    The merged file is written durably into a hidden sibling directory, which is then swapped
    with the hour's directory in one atomic step (renameat2 RENAME_EXCHANGE): a reader listing
    ``hour=HH`` sees either all the old files or the one new file, never both, never neither.
    A file the intake renamed into the old directory before the swap is moved across after it;
    a write still in progress there fails its rename and is answered 503 (the exporter sends it
    again). Then the old directory is removed."""
    directory = Path(directory)
    files = span_files(directory)
    if len(files) < 2:
        return 0, 0
    table = pa.concat_tables(pq.read_table(path, schema=SPAN_SCHEMA) for path in files)
    staging = directory.parent / f".{directory.name}.compact-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        name = f"{PREFIX}{HOST}-compacted-{uuid.uuid4().hex}.parquet"
        _write_file(staging / (TMP + name), table)
        os.rename(staging / (TMP + name), staging / name)
        _fsync_dir(staging)
        _exchange(directory, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(directory.parent)
    # ``staging`` now holds the old files: carry over any that arrived after the listing.
    merged = {path.name for path in files}
    for path in span_files(staging):
        if path.name not in merged:
            os.rename(path, directory / path.name)
    _fsync_dir(directory)
    shutil.rmtree(staging)
    return len(files), table.num_rows


def compactable_hours(base, day=None, before=None):
    """The hour directories of ``day`` (all days when None) whose hour ended before
    ``before`` (a ``datetime``, UTC), oldest first."""
    base = Path(base)
    found = []
    for day_dir in sorted(base.glob(f"dt={day}" if day else "dt=*")):
        for hour in sorted(day_dir.glob("hour=*")):
            stamp = f"{day_dir.name[3:]}T{hour.name[5:]}"
            if before is None or stamp < before.strftime("%Y-%m-%dT%H"):
                found.append(hour)
    return found
