"""Fills the free-text search table (recovery.models.MessageSearch) behind the collector.

The collector only inserts messages; this indexer copies each new message's search document
into the trigram-indexed side table a moment later, in batches, so the trigram cost is paid
once per message, off the collector's and the replay engine's paths. Searches also read the
rows above the indexed high-water mark directly (recovery.search.filters.search_q), so a message is
findable the moment it is stored.

Ids come from one sequence but commit out of order (several collector writers), so a row below
the high-water mark may appear after the indexer passed it. Each run therefore re-checks the
last LOOKBACK_IDS ids for rows without a document, and ``sweep`` (hourly, Celery beat) checks
the whole store. Runs never overlap: a PostgreSQL advisory lock serialises them across workers.
"""

import logging
import time

from django.conf import settings
from django.db import connection

from recovery import db
from recovery.bodies import decode_with
from recovery.bodies.decode import MSGPACK_TYPES
from recovery.models import DecoderRule

log = logging.getLogger(__name__)

# What a free-text search looks in: ids, the headers as JSON text and the body bytes as text,
# each cut at 8 KiB. Body bytes become text via encode(..., 'escape'): it never fails on bytes
# that are not UTF-8 (convert_from does). Columns are those of recovery_message.
SEARCH_DOCUMENT_SQL = (
    "(message_id || ' ' || correlation_id || ' ' || left(headers::text, 8192) || ' ' || "
    "encode(substring(body from 1 for 8192), 'escape'))"
)

# Bodies whose stored bytes are not what a reader should find (compressed, MessagePack:
# recovery.bodies.needs_decoding, said again in SQL) get their document from Python instead:
# the decoded text, cut at the same 8 KiB, each layer inflated no further than DECODE_LIMIT.
NEEDS_DECODING_SQL = (
    "(lower(btrim(content_encoding)) NOT IN ('', 'identity') OR "
    "lower(btrim(split_part(content_type, ';', 1))) IN ("
    + ", ".join(f"'{t}'" for t in sorted(MSGPACK_TYPES))
    + "))"
)
DOCUMENT_CHARS = 8192
DECODE_LIMIT = 64 * 1024
# How much of a compressed body is read to find its first DOCUMENT_CHARS (a truncated stream
# still yields what precedes the cut).
COMPRESSED_READ = 1024 * 1024

MESSAGES = "recovery_message"
DOCUMENTS = "recovery_messagesearch"

# The highest indexed message id; rows above it are the unindexed tail searches read directly.
HIGH_WATER_SQL = f"(SELECT coalesce(max(message_id), 0) FROM {DOCUMENTS})"

# Rows per statement (one short transaction each) and how far below the high-water mark a run
# looks for rows committed late. A collector transaction holds at most COLLECTOR_BATCH_SIZE ids
# per writer; this covers far more than all writers' batches in flight.
BATCH = 5000
LOOKBACK_IDS = 50_000
# Sweep the whole store in slices of this many ids.
SWEEP_SLICE = 200_000
# An arbitrary constant naming the indexer's advisory lock.
LOCK_KEY = 0x5EA5C4


def _index_range(low, high):
    """Index the messages with low < id <= high that have no document yet; how many."""
    rules = list(DecoderRule.objects.all())
    decoding, decoding_args = _decoding_sql(rules)
    unindexed = (
        f"FROM {MESSAGES} m WHERE m.id > %s AND m.id <= %s AND NOT EXISTS "
        f"(SELECT 1 FROM {DOCUMENTS} d WHERE d.message_id = m.id)"
    )
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {DOCUMENTS} (message_id, document) "
            f"SELECT m.id, {SEARCH_DOCUMENT_SQL} {unindexed} AND NOT {decoding} "
            "ON CONFLICT (message_id) DO NOTHING",
            [low, high, *decoding_args],
        )
        indexed = cur.rowcount
        cur.execute(
            "SELECT m.id, m.message_id || ' ' || m.correlation_id || ' ' || "
            "left(m.headers::text, 8192), substring(m.body from 1 for %s), m.content_type, "
            "m.content_encoding, m.vhost, m.source_queue, m.source_exchange, "
            f"coalesce(m.properties->>'type', '') {unindexed} AND {decoding}",
            [COMPRESSED_READ, low, high, *decoding_args],
        )
        rows = [(row[0], f"{row[1]} {_decoded_text(rules, *row[2:])}") for row in cur.fetchall()]
        if rows:
            cur.executemany(
                f"INSERT INTO {DOCUMENTS} (message_id, document) VALUES (%s, %s) "
                "ON CONFLICT (message_id) DO NOTHING",
                rows,
            )
            indexed += len(rows)
        return indexed


def _decoding_sql(rules):
    """Which rows get their document from Python: properties naming a chain, or a rule's match."""
    parts, args = [NEEDS_DECODING_SQL], []
    for rule in rules:
        sql, rule_args = rule.sql()
        parts.append(sql)
        args += rule_args
    return "(" + " OR ".join(parts) + ")", args


def _decoded_text(rules, body, content_type, encoding, vhost, queue, exchange, message_type):
    """A compressed or binary body's document text: decoded, or as stored where it cannot be
    (a registry that is down: the body is indexed as stored, and found by its raw bytes)."""
    rule = DecoderRule.first_match(vhost, queue, exchange, rules)
    decoded = decode_with(
        rule, bytes(body), content_type, encoding, message_type, limit=DECODE_LIMIT, partial=True
    )
    text = decoded.search_text(DOCUMENT_CHARS)
    return text.replace("\x00", "")  # PostgreSQL text holds no NUL


def high_water():
    """The highest indexed message id (0 when nothing is indexed)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {HIGH_WATER_SQL}")
        return cur.fetchone()[0]


def _locked(function):
    """Run ``function`` holding the indexer's advisory lock; None if another run holds it.

    A session lock: behind a transaction-mode pooler the lock and the unlock could reach
    different server connections (and the lock would stay held for good), so it is then taken
    on a connection of its own over DATABASE_DIRECT_URL."""
    if db.session_state_allowed():
        with connection.cursor() as cur:
            return _holding(cur.execute, cur.fetchone, function)
    with db.connect(db.direct_conninfo("lazarus-indexer-lock"), autocommit=True) as conn:
        cur = conn.cursor()
        return _holding(cur.execute, cur.fetchone, function)


def _holding(execute, fetchone, function):
    execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
    if not fetchone()[0]:
        return None
    try:
        return function()
    finally:
        execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


def index_new(batch=BATCH, budget_seconds=30.0):
    """Index the messages stored since the last run; returns how many (None: another run is on).

    Stops after ``budget_seconds`` so a beat-driven run never piles up behind itself; the next
    run continues from the high-water mark. ``budget_seconds=None``: until nothing is left.
    """

    def run():
        indexed = 0
        high = high_water()
        if high:
            indexed += _index_range(max(high - LOOKBACK_IDS, 0), high)
        deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
        while deadline is None or time.monotonic() < deadline:
            with connection.cursor() as cur:
                # The next ``batch`` ids above the mark, however sparse the ids are.
                cur.execute(
                    f"SELECT max(id) FROM (SELECT id FROM {MESSAGES} WHERE id > %s "
                    "ORDER BY id LIMIT %s) AS next_ids",
                    [high, batch],
                )
                upper = cur.fetchone()[0]
            if upper is None:
                break
            indexed += _index_range(high, upper)
            high = upper
        return indexed

    indexed = _locked(run)
    if indexed:
        log.info("search index: %s messages indexed", indexed)
    return indexed


def sweep():
    """Index every message still without a document, wherever its id is; returns how many."""

    def run():
        with connection.cursor() as cur:
            cur.execute(f"SELECT coalesce(max(id), 0) FROM {MESSAGES}")
            top = cur.fetchone()[0]
        return sum(_index_range(low, low + SWEEP_SLICE) for low in range(0, top, SWEEP_SLICE))

    indexed = _locked(run)
    if indexed:
        log.warning("search index sweep: %s messages had no search document", indexed)
    return indexed


# /healthz counts no further: right after migration 0010 every message of a big store is above
# the mark, and a health check must not count millions of rows each time it is polled.
def oldest_unindexed_age():
    """Seconds since the oldest message above the high-water mark was stored; None: none."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT extract(epoch FROM now() - collected_at) FROM {MESSAGES} "
            f"WHERE id > {HIGH_WATER_SQL} ORDER BY id LIMIT 1"
        )
        row = cur.fetchone()
    return float(row[0]) if row else None


def deferred(backlog) -> float | None:
    """Whether a run should wait for the collector (``backlog``: messages waiting in the recovery
    queues; settings SEARCH_INDEX_DEFER_BACKLOG): the index's lag in seconds if so, else None.
    Never beyond SEARCH_INDEX_MAX_DEFER_SECONDS of lag."""
    threshold = settings.SEARCH_INDEX_DEFER_BACKLOG
    if not threshold or backlog < threshold:
        return None
    age = oldest_unindexed_age()
    if age is None or age >= settings.SEARCH_INDEX_MAX_DEFER_SECONDS:
        return None
    return age


UNINDEXED_COUNT_LIMIT = 100_000


def unindexed_count(limit=UNINDEXED_COUNT_LIMIT):
    """Messages above the high-water mark, counted up to ``limit``: how far the indexer is
    behind (for /healthz; ``limit`` means at least that many)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {MESSAGES} WHERE id > %s LIMIT %s) AS above",
            [high_water(), limit],
        )
        return cur.fetchone()[0]
