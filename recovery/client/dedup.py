"""Where an IdempotentConsumer remembers which message_ids it has processed.

``MemoryDedup`` is a bounded LRU set: fast, but forgets on restart and across consumers, so it
only catches redeliveries and producer retries that arrive within ``capacity`` messages.
``PostgresDedup`` keeps ``recovery_processed`` rows: the insert of the id commits in the same
transaction as the handler's own database work, so "processed" and "its effects" can never
disagree — the seeds' exactly-once recipe (message_id + idempotent write).
"""

import collections
import contextlib

from recovery.client.outbox import ensure_tables, psycopg, require_psycopg

# What a consumer treats as "the dedup database is down" (requeue, do not count the message).
DATABASE_ERRORS = (psycopg.OperationalError,) if psycopg is not None else ()

# Ids remembered by the in-memory dedup. Bigger catches older duplicates (a producer retry after
# a long outage) at ~100 bytes per id.
MEMORY_CAPACITY = 100_000

PROCESSED_DDL = """
CREATE TABLE IF NOT EXISTS recovery_processed (
    consumer_group text NOT NULL,
    message_id text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, message_id)
);
"""


class MemoryDedup:
    passes_db = False

    def __init__(self, group, capacity=MEMORY_CAPACITY):
        self.group = group
        self.capacity = capacity
        self._seen = collections.OrderedDict()

    @contextlib.contextmanager
    def claim(self, message_id):
        """Yields (is_new, db). The id is remembered only if the block exits without error."""
        if message_id in self._seen:
            self._seen.move_to_end(message_id)
            yield False, None
            return
        yield True, None
        self._seen[message_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def close(self):
        pass


class PostgresDedup:
    passes_db = True

    def __init__(self, group, dsn):
        require_psycopg("a PostgreSQL dedup store")
        self.group = group
        self.dsn = dsn
        self._conn = None

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None)
            ensure_tables(self._conn, PROCESSED_DDL)
        return self._conn

    @contextlib.contextmanager
    def claim(self, message_id):
        """Yields (is_new, db) inside one transaction; an error in the block rolls back both the
        processed-id insert and whatever the handler wrote through ``db``."""
        conn = self._connection()
        with conn.transaction():
            inserted = conn.execute(
                "INSERT INTO recovery_processed (consumer_group, message_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING RETURNING 1",
                (self.group, message_id),
            ).fetchone()
            yield inserted is not None, conn

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_dedup(group, dedup):
    """``"memory"`` or a PostgreSQL DSN -> a dedup store."""
    if dedup == "memory":
        return MemoryDedup(group)
    return PostgresDedup(group, dedup)
