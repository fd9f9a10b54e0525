"""The retention archive: what retention deletes, written first to gzip JSON Lines files, and read
back into the store by ``manage.py import_archive``.

With RETENTION_ARCHIVE_DIR set, each batch retention is about to delete is written to
``<dir>/<vhost>/<YYYY-MM-DD>.jsonl.gz`` (the vhost percent-quoted, the UTC day of the retention
run), as one more gzip member appended to the file, then fsynced; only then are the rows locked
and deleted, each only if it is unchanged since it was written (same ``updated_at``: every
change sets it). Written before the lock, so the disk's speed never lengthens how long a row is
locked. A write that fails (a full disk, a directory that cannot be created) cuts the file back
to where it was and raises: the batch is not deleted. A message changed between its write and
the lock, or a crash before the delete's commit, leaves it archived and still stored (archived
again when it goes); the import skips a second copy by fingerprint.

One line per message: every column of ``recovery_message`` by its column name, the body in
base64, the times in ISO 8601 with microseconds, properties and headers as the tagged JSON the
store keeps (recovery/client/headers.py), and ``"archive": 1`` (the format's version).
Gzip readers (``zcat``, Python's gzip) read the concatenated members as one stream;
``read_archive`` also reads past a member a crash cut short.
"""

import base64
import contextlib
import datetime
import gzip
import itertools
import json
import os
import urllib.parse
import zlib
from pathlib import Path

from django.db import connection, transaction
from django.utils import timezone

from recovery.models.store import FINGERPRINT_KEY, NO_DEATH_TIME, Message

FORMAT = 1

# Columns whose values need more than JSON: bytes and times.
BINARY = {"body"}
TIMES = {
    f.attname
    for f in Message._meta.concrete_fields
    if f.get_internal_type() in ("DateTimeField", "DateField")
}
JSONB = {"routing_keys", "properties", "headers"}
COLUMNS = [f.attname for f in Message._meta.concrete_fields]


def archive_file(directory, vhost, day) -> Path:
    """The file a message of ``vhost`` deleted on ``day`` (a date) is archived in."""
    return Path(directory) / urllib.parse.quote(vhost, safe="") / f"{day:%Y-%m-%d}.jsonl.gz"


def to_record(row) -> dict:
    """One ``recovery_message`` row (a ``.values()`` dict) as its JSON line."""
    record = {"archive": FORMAT}
    for name in COLUMNS:
        value = row[name]
        if name in BINARY:
            value = base64.b64encode(bytes(value)).decode("ascii")
        elif name in TIMES and value is not None:
            value = value.isoformat()
        record[name] = value
    return record


def from_record(record) -> dict:
    """The column values of a JSON line (the inverse of ``to_record``)."""
    if record.get("archive") != FORMAT:
        raise ValueError(f"not a Lazarus archive line of format {FORMAT}")
    row = {}
    for name in COLUMNS:
        value = record[name]
        if name in BINARY:
            value = base64.b64decode(value)
        elif name in TIMES and value is not None:
            value = datetime.datetime.fromisoformat(value)
        row[name] = value
    return row


def archive_messages(directory, ids, day) -> dict:
    """Append the messages ``ids`` to their vhost's file of ``day``, fsynced; returns the
    ``updated_at`` of each message written, by id (retention deletes a message only if it has
    not changed since). Raises OSError when they cannot all be written (each file cut back to
    where it was)."""
    by_vhost: dict[str, list[bytes]] = {}
    written = {}
    for row in Message.objects.filter(pk__in=ids).order_by("pk").values(*COLUMNS):
        line = json.dumps(to_record(row), ensure_ascii=False, separators=(",", ":"))
        by_vhost.setdefault(row["vhost"], []).append(line.encode() + b"\n")
        written[row["id"]] = row["updated_at"]
    for vhost, lines in by_vhost.items():
        _append_member(archive_file(directory, vhost, day), b"".join(lines))
    return written


def _append_member(path, data):
    created_dir = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        size = os.fstat(fd).st_size
        try:
            # mtime=0: the same batch gives the same bytes.
            member = gzip.compress(data, compresslevel=6, mtime=0)
            view = memoryview(member)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            # A member half written (ENOSPC) would make the rest of the file unreadable. Not a
            # regular file (a device): nothing to cut, the write's own error is the one to say.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    if created_dir or size == 0:
        # The new file's (and directory's) entry must survive a crash too.
        _fsync_dir(path.parent)
        if created_dir:
            _fsync_dir(path.parent.parent)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_archive(path, torn=None):
    """The rows of an archive file (gzip members, or plain JSON Lines), one dict each.

    A member cut short by a crash while it was appended (its batch was not deleted: it was
    archived again by a later run) is skipped up to the next member, and counted in
    ``torn["members"]`` when a dict is given; ``zcat`` would stop there."""
    if str(path).endswith(".gz"):
        with open(path, "rb") as raw:
            chunks = (_member_lines(member) for member in _gzip_members(raw, torn))
            yield from _rows(path, itertools.chain.from_iterable(chunks))
    else:
        with open(path, encoding="utf-8") as lines:
            yield from _rows(path, lines)


def _rows(path, lines):
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield from_record(json.loads(line))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{path}, line {number}: {exc}") from None


def _member_lines(member):
    return member.decode("utf-8").splitlines()


# What each member written here starts with (mtime 0): where reading resumes after a torn one.
MEMBER_HEADER = gzip.compress(b"", compresslevel=6, mtime=0)[:10]
READ_CHUNK = 1 << 20


def _gzip_members(raw, torn):
    """The decompressed bytes of each whole member (one retention batch: a few MB)."""
    pending = raw.read(READ_CHUNK)
    while pending:
        member = bytearray(pending)  # its compressed bytes so far, to resync from
        inflate = zlib.decompressobj(wbits=31)
        out = []
        data = pending
        try:
            while True:
                out.append(inflate.decompress(data))
                if inflate.eof:
                    break
                data = raw.read(READ_CHUNK)
                if not data:
                    raise EOFError("a member cut short at the end of the file")
                member += data
        except (zlib.error, EOFError):
            if torn is not None:
                torn["members"] = torn.get("members", 0) + 1
            pending = _next_member(raw, member)
            continue
        yield b"".join(out)
        pending = inflate.unused_data or raw.read(READ_CHUNK)


def _next_member(raw, seen):
    """The bytes from the next member header after the start of ``seen`` (read on as needed)."""
    at = seen.find(MEMBER_HEADER, 1)
    while at < 0:
        data = raw.read(READ_CHUNK)
        if not data:
            return b""
        seen = seen[-len(MEMBER_HEADER) :] + data
        at = seen.find(MEMBER_HEADER, 1)
    return bytes(seen[at:])


IMPORT_BATCH = 500


def import_rows(rows, batch=IMPORT_BATCH, touch=False) -> dict:
    """Insert archived rows back into the store as they were (``touch``: with ``updated_at``
    now, so retention keeps them RETENTION_DAYS again); returns counts: ``imported``,
    ``skipped`` (a message with that fingerprint is in the store: a re-import, or it was never
    deleted), ``renumbered`` (its id belongs to another message now: a new id),
    ``origin_cleared`` (the row it was replayed from is not in the store)."""
    counts = {"imported": 0, "skipped": 0, "renumbered": 0, "origin_cleared": 0}
    chunk = []
    now = timezone.now()
    for row in rows:
        if touch:
            row["updated_at"] = now
        chunk.append(row)
        if len(chunk) >= batch:
            _import_chunk(chunk, counts)
            chunk = []
    if chunk:
        _import_chunk(chunk, counts)
    _sequence_past_imported_ids()
    return counts


def _import_chunk(rows, counts):
    with transaction.atomic():
        there = _stored_fingerprints(rows)
        fresh, seen = [], set()
        for row in rows:
            if row["fingerprint"] in there or row["fingerprint"] in seen:
                counts["skipped"] += 1
            else:
                seen.add(row["fingerprint"])
                fresh.append(dict(row))
        if not fresh:
            return
        fresh.sort(key=lambda r: r["id"])
        ids = [r["id"] for r in fresh]
        taken = set(Message.objects.filter(pk__in=ids).values_list("pk", flat=True))
        origins = {r["origin_id"] for r in fresh if r["origin_id"] is not None}
        # The row a message was replayed from, if it is in the store (or in this chunk); the
        # foreign key is deferred to the commit, so the order within the chunk does not matter.
        present = set(Message.objects.filter(pk__in=origins).values_list("pk", flat=True))
        present = (present - taken) | (set(ids) - taken)
        for row in fresh:
            if row["id"] in taken:
                row["id"] = None
                counts["renumbered"] += 1
            if row["origin_id"] is not None and row["origin_id"] not in present:
                row["origin_id"] = None
                counts["origin_cleared"] += 1
        counts["imported"] += _insert(fresh)


def _stored_fingerprints(rows):
    """The fingerprints of ``rows`` already in the store, looked up by the store's unique key
    (FINGERPRINT_KEY, led by the death time: a lookup by fingerprint alone has no index)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT fingerprint FROM recovery_message WHERE ({FINGERPRINT_KEY}) IN "
            "(SELECT * FROM unnest(%s::timestamptz[], %s::text[]))",
            [
                [r["last_death_at"] or NO_DEATH_TIME for r in rows],
                [r["fingerprint"] for r in rows],
            ],
        )
        return {fingerprint for (fingerprint,) in cur.fetchall()}


def _insert(rows) -> int:
    columns = [c for c in COLUMNS if c != "id"]
    placeholders = ", ".join("%s::jsonb" if c in JSONB else "%s" for c in columns)
    inserted = 0
    with connection.cursor() as cur:
        for row in rows:
            values = [json.dumps(row[c]) if c in JSONB else row[c] for c in columns]
            if row["id"] is None:
                sql = f"INSERT INTO recovery_message ({', '.join(columns)}) VALUES ({placeholders})"
            else:
                sql = (
                    f"INSERT INTO recovery_message (id, {', '.join(columns)}) "
                    f"VALUES (%s, {placeholders})"
                )
                values = [row["id"], *values]
            cur.execute(f"{sql} ON CONFLICT ({FINGERPRINT_KEY}) DO NOTHING", values)
            inserted += cur.rowcount
    return inserted


def _sequence_past_imported_ids():
    """Imported into another database, the ids may be above its sequence: move it past them."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_serial_sequence('recovery_message', 'id')")
        (sequence,) = cur.fetchone()
        cur.execute(
            f"SELECT setval(%s, (SELECT max(id) FROM recovery_message)) FROM {sequence} "
            "WHERE last_value < (SELECT max(id) FROM recovery_message)",
            [sequence],
        )
