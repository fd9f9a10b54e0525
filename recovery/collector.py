"""The collector: drains the recovery queues into the store, exactly once.

One ``SourceCollector`` thread per (vhost, recovery queue), each with its own AMQP and PostgreSQL
connection. It batches deliveries, writes each batch in one transaction (COPY + ``INSERT … ON
CONFLICT DO NOTHING`` on the fingerprint) and acks the batch with one multiple-ack *after* the
commit. A crash anywhere before the ack means redelivery, and redelivery is harmless.

It runs inside a Celery worker as a bootstep (``recovery.bootsteps.CollectorStep``): scale out by
starting more workers; they compete for the same queues. Dedicated pika connections, rather than
kombu consumers on the worker's own connection, keep the drain independent of task traffic and
allow multiple-ack, the single biggest factor in drain speed (bench/collector.py).
"""

import contextlib
import logging
import socket
import threading
import time

import pika
import pika.exceptions
import psycopg
from django.conf import settings
from django.db import connections

from recovery.broker import amqp_parameters
from recovery.ingest import delivery_to_row, store_rows
from recovery.topology import Names

log = logging.getLogger(__name__)

# Reconnect back-off: short first (a connection closed by an operator comes back at once), capped
# so a long outage does not become a tight loop.
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
HEARTBEAT_SECONDS = 5.0


def database_conninfo(alias="default"):
    """psycopg connection string for the Django database (the test database inside tests)."""
    cfg = connections[alias].settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=cfg["NAME"],
        user=cfg["USER"] or None,
        password=cfg["PASSWORD"] or None,
        host=cfg["HOST"] or None,
        port=cfg["PORT"] or None,
        application_name="lazarus-collector",
    )


class Counters:
    """Per-source counters shared with /healthz via the database-free process snapshot."""

    def __init__(self):
        self.lock = threading.Lock()
        self.collected = 0
        self.duplicates = 0
        self.quarantined = 0
        self.errors = 0
        self.last_error = ""

    def add(self, collected=0, duplicates=0, quarantined=0):
        with self.lock:
            self.collected += collected
            self.duplicates += duplicates
            self.quarantined += quarantined


class SourceCollector(threading.Thread):
    def __init__(
        self,
        vhost,
        queue,
        conninfo,
        stop_event,
        prefetch=None,
        batch_size=None,
        flush_seconds=None,
        max_body_bytes=None,
        quarantine_queue=None,
    ):
        super().__init__(name=f"collector:{vhost}:{queue}", daemon=True)
        self.vhost = vhost
        self.queue = queue
        self.conninfo = conninfo
        self.stop_event = stop_event
        self.prefetch = prefetch or settings.COLLECTOR_PREFETCH
        self.batch_size = batch_size or settings.COLLECTOR_BATCH_SIZE
        self.flush_seconds = flush_seconds or settings.COLLECTOR_FLUSH_SECONDS
        self.max_body_bytes = max_body_bytes or settings.COLLECTOR_MAX_BODY_BYTES
        self.quarantine_queue = quarantine_queue or settings.RECOVERY_QUARANTINE_QUEUE
        self.poison_threshold = settings.POISON_THRESHOLD
        self.counters = Counters()
        self.pg = None
        self.worker = f"{socket.gethostname()}:{threading.get_native_id()}"
        self.last_beat = 0.0

    def run(self):
        backoff = BACKOFF_FIRST
        while not self.stop_event.is_set():
            try:
                self.drain()
                backoff = BACKOFF_FIRST
            except (pika.exceptions.AMQPError, psycopg.Error, OSError) as exc:
                self.counters.errors += 1
                self.counters.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("collector %s/%s: %s; reconnecting", self.vhost, self.queue, exc)
                self._close_pg()
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        self._close_pg()

    def _close_pg(self):
        if self.pg is not None:
            with contextlib.suppress(psycopg.Error):
                self.pg.close()
            self.pg = None

    def _pg(self):
        if self.pg is None or self.pg.closed:
            self.pg = psycopg.connect(self.conninfo, autocommit=True)
        return self.pg

    def drain(self):
        """Consume until stopped or a connection fails (the caller reconnects)."""
        connection = pika.BlockingConnection(amqp_parameters(self.vhost, heartbeat=30))
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            quarantine = connection.channel()
            quarantine.confirm_delivery()
            batch, last_tag = [], None
            for method, properties, body in channel.consume(
                self.queue, inactivity_timeout=self.flush_seconds
            ):
                if method is not None:
                    row = self.to_row(quarantine, method, properties, body)
                    if row is not None:
                        batch.append((row, properties, body))
                    last_tag = method.delivery_tag
                if last_tag is not None and (method is None or len(batch) >= self.batch_size):
                    self.flush(channel, quarantine, batch, last_tag)
                    batch, last_tag = [], None
                if method is None:
                    self.beat()
                if self.stop_event.is_set():
                    break
            if last_tag is not None:
                self.flush(channel, quarantine, batch, last_tag)
        finally:
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()

    def to_row(self, quarantine, method, properties, body):
        """The store row for a delivery, or None after sending it to quarantine (confirmed)."""
        if len(body) > self.max_body_bytes:
            return self.quarantine(
                quarantine, properties, body, f"body {len(body)} B > limit {self.max_body_bytes} B"
            )
        try:
            return delivery_to_row(
                self.vhost,
                self.queue,
                method.exchange,
                method.routing_key,
                properties,
                body,
                poison_threshold=self.poison_threshold,
            )
        except Exception as exc:  # noqa: BLE001 - a parser bug must not lose the message
            log.exception("collector %s/%s: cannot parse a delivery", self.vhost, self.queue)
            return self.quarantine(quarantine, properties, body, f"parse error: {exc!r}")

    def quarantine(self, channel, properties, body, reason):
        headers = dict(properties.headers or {})
        headers["x-quarantine-reason"] = reason[:1000]
        headers["x-quarantine-source"] = self.queue
        properties.headers = headers
        # Raises (and so never acks) if the broker will not take it.
        channel.basic_publish("", self.quarantine_queue, body, properties, mandatory=True)
        log.error("collector %s/%s: quarantined a message: %s", self.vhost, self.queue, reason)
        self.counters.add(quarantined=1)
        return None

    def flush(self, channel, quarantine, batch, last_tag):
        """Store a batch, then ack it (multiple) — never the other way round."""
        new = self.store(channel, quarantine, batch)
        channel.basic_ack(last_tag, multiple=True)
        self.counters.add(collected=new, duplicates=len(batch) - new)
        self.beat()

    def store(self, channel, quarantine, batch):
        # Retry the database until it answers: the deliveries stay unacked (and safe in the
        # broker) meanwhile. A broken AMQP connection ends the retry: they will be redelivered.
        delay = BACKOFF_FIRST
        while True:
            try:
                return store_rows(self._pg(), [row for row, _props, _body in batch])
            except psycopg.OperationalError as exc:
                log.warning(
                    "collector %s/%s: database error %s; retrying", self.vhost, self.queue, exc
                )
                self.counters.errors += 1
                self.counters.last_error = f"{type(exc).__name__}: {exc}"
                self._close_pg()
                if self.stop_event.is_set():
                    raise
                channel.connection.sleep(delay)  # keeps AMQP heartbeats flowing
                delay = min(delay * 2, BACKOFF_MAX)
            except psycopg.Error as exc:
                # The batch holds a row the database refuses (not a transient failure): store
                # row by row and quarantine the ones refused, instead of retrying forever.
                log.warning(
                    "collector %s/%s: batch refused (%s); storing one by one",
                    self.vhost,
                    self.queue,
                    exc,
                )
                return self.store_one_by_one(quarantine, batch)

    def store_one_by_one(self, quarantine, batch):
        new = 0
        for row, properties, body in batch:
            try:
                new += store_rows(self._pg(), [row])
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                self.quarantine(quarantine, properties, body, f"database refused: {exc}")
        return new

    def beat(self, every=HEARTBEAT_SECONDS):
        """Upsert this thread's counters so /healthz and the console can see every collector."""
        now = time.monotonic()
        if now - self.last_beat < every:
            return
        self.last_beat = now
        c = self.counters
        self._pg().execute(
            """
            INSERT INTO recovery_collectorheartbeat
              (worker, vhost, queue, collected, duplicates, quarantined, errors, last_error,
               started_at, updated_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now(), now())
            ON CONFLICT (worker, vhost, queue) DO UPDATE SET
              collected = EXCLUDED.collected, duplicates = EXCLUDED.duplicates,
              quarantined = EXCLUDED.quarantined, errors = EXCLUDED.errors,
              last_error = EXCLUDED.last_error, updated_at = now()
            """,
            (
                self.worker,
                self.vhost,
                self.queue,
                c.collected,
                c.duplicates,
                c.quarantined,
                c.errors,
                c.last_error[:2000],
            ),
        )


def start_collectors(vhosts=None, names=None, conninfo=None, **tunables):
    """Start one thread per (vhost, source queue); returns (stop_event, threads)."""
    names = names or Names.from_settings()
    conninfo = conninfo or database_conninfo()
    stop_event = threading.Event()
    threads = [
        SourceCollector(vhost, queue, conninfo, stop_event, **tunables)
        for vhost in (vhosts or settings.RECOVERY_VHOSTS)
        for queue in names.source_queues
    ]
    for thread in threads:
        thread.start()
    return stop_event, threads


def stop_collectors(stop_event, threads, timeout=10):
    stop_event.set()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
