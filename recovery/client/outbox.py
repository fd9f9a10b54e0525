"""PostgreSQL tables the client writes when the broker cannot be trusted with a message.

``recovery_outbox``: give-ups (returned / nacked / unconfirmed) that could not be forwarded to the
returns queue, usually because the broker is what is unreachable. Lazarus calls ``forward_outbox``
periodically to move them to the returns queue, where the collector stores them like any other.

``recovery_sending``: the seeds' "sending/sent" table. With ``store_dsn`` the publisher records a
message as ``sending`` before it goes on the wire and ``sent`` once the broker acked it (or
``given_up`` once handed to Lazarus); a producer that crashes with messages in flight resends them
on its next start (``SendingStore.unfinished``, the compensation sweep).

Properties and headers are stored in the recovery store's JSON form (``recovery.client.headers``, a
stdlib-only codec) so a value keeps its AMQP type on the way back to the wire.
"""

import datetime
import logging

import pika

try:  # optional: the outbox and the dedup store are tables (pip install lazarus-client[postgres])
    import psycopg
    from psycopg.types.json import Jsonb
except ImportError:  # the wheel test runs the library in a venv without psycopg
    psycopg = Jsonb = None  # type: ignore[assignment,misc]


from recovery.client import headers as header_codec

log = logging.getLogger(__name__)


def require_psycopg(what):
    if psycopg is None:
        raise ImportError(
            f"{what} needs psycopg: pip install 'lazarus-client[postgres]' (or psycopg[binary])"
        )


PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

# Rows moved per transaction by forward_outbox: a crash re-sends at most this many (the
# collector's fingerprint dedups them); bigger batches amortise the commit.
FORWARD_BATCH = 500

OUTBOX_DDL = """
CREATE TABLE IF NOT EXISTS recovery_outbox (
    id bigserial PRIMARY KEY,
    producer text NOT NULL,
    message_id text NOT NULL,
    exchange text NOT NULL,
    routing_key text NOT NULL,
    properties jsonb NOT NULL,
    headers jsonb NOT NULL,
    body bytea NOT NULL,
    kind text NOT NULL,
    reason text NOT NULL,
    attempts integer NOT NULL,
    first_attempt_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    forwarded_at timestamptz NULL
);
CREATE INDEX IF NOT EXISTS recovery_outbox_unforwarded
    ON recovery_outbox (id) WHERE forwarded_at IS NULL;
"""

SENDING_DDL = """
CREATE TABLE IF NOT EXISTS recovery_sending (
    producer text NOT NULL,
    message_id text NOT NULL,
    exchange text NOT NULL,
    routing_key text NOT NULL,
    properties jsonb NOT NULL,
    headers jsonb NOT NULL,
    body bytea NOT NULL,
    status text NOT NULL DEFAULT 'sending',
    first_attempt_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (producer, message_id)
);
CREATE INDEX IF NOT EXISTS recovery_sending_unfinished
    ON recovery_sending (producer) WHERE status = 'sending';
"""


def properties_to_json(properties):
    return {
        name: header_codec.to_json(getattr(properties, name, None))
        for name in PROPERTY_NAMES
        if getattr(properties, name, None) is not None
    }


def properties_from_json(properties, headers):
    values = {name: header_codec.from_json(value) for name, value in (properties or {}).items()}
    return pika.BasicProperties(headers=header_codec.headers_from_json(headers) or None, **values)


def _utc(epoch_s):
    return datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)


def ensure_tables(conn, ddl):
    with conn.transaction():
        # Two clients creating the table at once would race in the catalog; serialise them.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('recovery.client.ddl'))")
        conn.execute(ddl)


class Outbox:
    """Writes give-ups to ``recovery_outbox``. Used from the publisher's I/O thread only."""

    def __init__(self, dsn):
        require_psycopg("the give-up outbox")
        self.dsn = dsn
        self._conn = None

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None)
            ensure_tables(self._conn, OUTBOX_DDL)
        return self._conn

    def write(self, producer, rows):
        """rows: (Pending, headers_with_recovery_fields, kind, reason). One transaction."""
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO recovery_outbox (producer, message_id, exchange, routing_key,"
                " properties, headers, body, kind, reason, attempts, first_attempt_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (
                        producer,
                        entry.message_id,
                        entry.exchange,
                        entry.routing_key,
                        Jsonb(properties_to_json(entry.properties)),
                        Jsonb(header_codec.headers_to_json(headers)),
                        entry.body,
                        kind,
                        reason,
                        entry.attempts,
                        _utc(entry.first_attempt_at),
                    )
                    for entry, headers, kind, reason in rows
                ],
            )

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SendingStore:
    """The durable retry store: ``sending`` before the wire, ``sent``/``given_up`` after.

    ``add`` runs in the publishing thread (it must be durable before the message is sent); the
    status updates run batched in the I/O thread, on their own connection.
    """

    def __init__(self, dsn, producer):
        require_psycopg("the durable retry store")
        self.producer = producer
        self._insert_conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        ensure_tables(self._insert_conn, SENDING_DDL)
        self._update_conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)

    def add(self, entry):
        self._insert_conn.execute(
            "INSERT INTO recovery_sending (producer, message_id, exchange, routing_key,"
            " properties, headers, body, first_attempt_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (producer, message_id) DO UPDATE SET status = 'sending',"
            " updated_at = now()",
            (
                self.producer,
                entry.message_id,
                entry.exchange,
                entry.routing_key,
                Jsonb(properties_to_json(entry.properties)),
                Jsonb(header_codec.headers_to_json(entry.properties.headers)),
                entry.body,
                _utc(entry.first_attempt_at),
            ),
        )

    def mark(self, message_ids, status):
        if message_ids:
            self._update_conn.execute(
                "UPDATE recovery_sending SET status = %s, updated_at = now()"
                " WHERE producer = %s AND message_id = ANY(%s)",
                (status, self.producer, list(message_ids)),
            )

    def unfinished(self):
        """Messages a previous run of this producer left ``sending``: the compensation sweep."""
        rows = self._insert_conn.execute(
            "SELECT message_id, exchange, routing_key, properties, headers, body,"
            " first_attempt_at FROM recovery_sending WHERE producer = %s AND status = 'sending'"
            " ORDER BY first_attempt_at",
            (self.producer,),
        ).fetchall()
        for message_id, exchange, routing_key, props, headers, body, first in rows:
            yield (
                message_id,
                exchange,
                routing_key,
                properties_from_json(props, headers),
                body,
                (first.timestamp()),
            )

    def close(self):
        self._insert_conn.close()
        self._update_conn.close()


def forward_outbox(dsn, url, returns_queue="recovery.returns", batch=FORWARD_BATCH):
    """Move unforwarded outbox rows to the returns queue with confirms; returns rows moved.

    Rows are claimed with ``FOR UPDATE SKIP LOCKED`` so two Lazarus workers never forward the same
    batch, and marked forwarded only after the broker confirmed every message of the batch: a
    crash in between forwards them again (at-least-once; the collector's fingerprint dedups).
    """
    moved = 0
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        ensure_tables(conn, OUTBOX_DDL)
        # ``url`` may list a cluster's nodes: the first that answers takes the batch.
        urls = [url] if isinstance(url, str) else list(url)
        amqp = pika.BlockingConnection([pika.URLParameters(u) for u in urls])
        try:
            channel = amqp.channel()
            channel.confirm_delivery()
            while True:
                with conn.transaction():
                    rows = conn.execute(
                        "SELECT id, properties, headers, body FROM recovery_outbox"
                        " WHERE forwarded_at IS NULL ORDER BY id LIMIT %s"
                        " FOR UPDATE SKIP LOCKED",
                        (batch,),
                    ).fetchall()
                    if not rows:
                        return moved
                    for _, props, headers, body in rows:
                        # BlockingChannel in confirm mode waits for each ack and raises on
                        # nack or return, which aborts the transaction: nothing is marked.
                        channel.basic_publish(
                            "",
                            returns_queue,
                            bytes(body),
                            properties_from_json(props, headers),
                            mandatory=True,
                        )
                    conn.execute(
                        "UPDATE recovery_outbox SET forwarded_at = now() WHERE id = ANY(%s)",
                        ([row[0] for row in rows],),
                    )
                moved += len(rows)
        finally:
            if amqp.is_open:
                amqp.close()
