"""The database side of a collector: store batches, quarantine what cannot be stored, heartbeat.

A ``WriterPool`` of ``BatchWriter`` threads sits beside each ``SourceCollector`` connection (the
AMQP side) so that parsing the next batch overlaps with committing the previous ones. For every
batch a writer (1) publishes the deliveries the consumer could not turn into rows to the
quarantine queue, with publisher confirms, (2) stores the rows in one transaction, and only then
(3) asks the AMQP thread to ack the batch. A failure before (3) leaves the deliveries unacked: the
broker redelivers them and the unique fingerprint makes that harmless.
"""

import contextlib
import functools
import logging
import queue
import threading
import time

import pika
import pika.exceptions
import psycopg
import psycopg.errors

from recovery.broker import amqp_parameters
from recovery.headers import UndecodableHeaders
from recovery.ingest import store_rows
from recovery.topology import QUORUM

log = logging.getLogger(__name__)

# Reconnect back-off: short first (a connection closed by an operator comes back at once), capped
# so a long outage does not become a tight loop.
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
HEARTBEAT_SECONDS = 5.0  # the console shows the rate over this interval

# SQLSTATE classes that say "this row": data exceptions (22: bad encoding, value out of range),
# integrity violations (23) and program limits (54: a jsonb or row too big). The batch is split and
# the refused rows quarantined. Every other error (connection lost, admin shutdown, disk full, a
# missing table before `migrate`) is about the database, not the data: retry the batch until it
# goes through, so a misconfiguration never empties the queues into quarantine.
ROW_ERROR_CLASSES = ("22", "23", "54")


def refuses_row(exc):
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate[:2] in ROW_ERROR_CLASSES


class Counters:
    """Per-source counters, written to the heartbeat row (/healthz and the console read them)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.collected = 0
        self.duplicates = 0
        self.quarantined = 0
        self.errors = 0
        self.last_error = ""
        self.last_collected_at = None

    def add(self, collected=0, duplicates=0, quarantined=0):
        with self.lock:
            self.collected += collected
            self.duplicates += duplicates
            self.quarantined += quarantined
            if collected:
                self.last_collected_at = time.time()

    def error(self, exc):
        with self.lock:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:2000]


class Batch:
    """Deliveries taken from the queue since the last flush, up to ``last_tag``."""

    __slots__ = ("rows", "quarantine", "count", "bytes", "biggest", "last_tag", "started")

    def __init__(self):
        self.rows = []  # (StoreRow, properties, body)
        self.quarantine = []  # (properties, body, reason)
        self.count = self.bytes = self.biggest = 0
        self.last_tag = None
        self.started = None

    def add(self, delivery_tag, size, row=None, properties=None, body=None, reason=None):
        if self.started is None:
            self.started = time.monotonic()
        if row is not None:
            self.rows.append((row, properties, body))
        else:
            self.quarantine.append((properties, body, reason))
        self.count += 1
        self.bytes += size
        self.biggest = max(self.biggest, size)
        self.last_tag = delivery_tag

    def __bool__(self):
        return self.count > 0


class Quarantine:
    """A confirming publisher to the quarantine queue of one vhost, connected on first use."""

    def __init__(self, vhost, queue_name):
        self.vhost = vhost
        self.queue = queue_name
        self.connection = self.channel = None

    def publish(self, properties, body, reason, source_queue):
        if self.channel is None or not self.channel.is_open:
            self.close()
            self.connection = pika.BlockingConnection(amqp_parameters(self.vhost, heartbeat=30))
            self.channel = self.connection.channel()
            # Declared here too: with nowhere to put a message, it could never be acked.
            self.channel.queue_declare(self.queue, durable=True, arguments=QUORUM)
            self.channel.confirm_delivery()
        headers = properties.headers
        if not isinstance(headers, UndecodableHeaders):  # that one must keep its raw entries
            headers = dict(headers or {})
        headers["x-quarantine-reason"] = reason[:1000]
        headers["x-quarantine-source"] = source_queue
        headers["x-quarantine-vhost"] = self.vhost
        properties.headers = headers
        # Raises (so the delivery is never acked) unless the broker confirmed it.
        self.channel.basic_publish("", self.queue, body, properties, mandatory=True)
        log.error("collector %s/%s: quarantined a message: %s", self.vhost, source_queue, reason)

    def close(self):
        if self.connection is not None and self.connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                self.connection.close()
        self.connection = self.channel = None


class WriterFailed(RuntimeError):
    """The writer gave up on a batch; the AMQP side reconnects and the batch is redelivered."""


_STOP = object()


class WriterPool:
    """The writer threads of one ``SourceCollector`` connection, fed from one queue.

    Several writers commit batches concurrently (PostgreSQL spends most of a batch maintaining
    indexes, on its own CPU), so batches complete out of order; the AMQP side acks them in
    order (``SourceCollector.stored``). Up to ``size`` batches wait for a writer, so the consumer
    fills the next batch while others commit; the prefetch window bounds the memory.
    """

    def __init__(self, collector, connection, size):
        self.connection = connection
        self.batches = queue.Queue(maxsize=size)
        self.abandon = threading.Event()  # the AMQP connection is gone: stop retrying
        self.writers = [BatchWriter(collector, self, n) for n in range(size)]

    def start(self):
        for writer in self.writers:
            writer.start()

    def submit(self, batch, on_stored):
        """Queue a batch; ``on_stored(batch, new)`` then runs in the AMQP thread to ack it."""
        item = (batch, on_stored)
        while True:
            self.raise_if_failed()
            try:
                self.batches.put_nowait(item)
                return
            except queue.Full:
                # Keep AMQP heartbeats and acks flowing while the database catches up.
                self.connection.process_data_events(time_limit=0.05)

    def raise_if_failed(self):
        for writer in self.writers:
            if writer.error is not None:
                error = writer.error
                raise WriterFailed(f"{type(error).__name__}: {error}") from error

    def close(self, timeout=5.0):
        self.abandon.set()
        for _ in self.writers:
            with contextlib.suppress(queue.Full):
                self.batches.put_nowait(_STOP)
        deadline = time.monotonic() + timeout
        for writer in self.writers:
            if writer.ident is not None:
                writer.join(max(0.1, deadline - time.monotonic()))


class BatchWriter(threading.Thread):
    """One writer thread: quarantines, stores, then has the batch acked (see the module doc)."""

    def __init__(self, collector, pool, number):
        super().__init__(name=f"{collector.name}:writer{number}", daemon=True)
        self.collector = collector
        self.pool = pool
        self.abandon = pool.abandon
        self.error = None
        self.pg = None
        self.quarantine = Quarantine(collector.vhost, collector.quarantine_queue)
        self.refused = 0

    def run(self):
        connection = self.pool.connection
        try:
            self.beat()  # "running", and the start of the first rate interval
            while not self.abandon.is_set():
                try:
                    item = self.pool.batches.get(timeout=HEARTBEAT_SECONDS / 2)
                except queue.Empty:
                    self.beat()
                    continue
                if item is _STOP:
                    break
                batch, on_stored = item
                new = self.write(batch)
                try:
                    connection.add_callback_threadsafe(functools.partial(on_stored, batch, new))
                except Exception as exc:  # noqa: BLE001 - the connection is gone: redelivery
                    log.info("%s: cannot ack, connection gone (%s)", self.name, exc)
                    break
                self.beat()
        except Exception as exc:  # noqa: BLE001 - reported to the AMQP thread, which reconnects
            if not self.abandon.is_set():
                log.warning("%s: %s: %s", self.name, type(exc).__name__, exc)
                self.collector.counters.error(exc)
            self.error = exc
            with contextlib.suppress(Exception):
                connection.add_callback_threadsafe(lambda: None)  # wake the AMQP thread
        finally:
            self.quarantine.close()
            self._close_pg()

    def write(self, batch):
        try:
            for properties, body, reason in batch.quarantine:
                self.quarantine.publish(properties, body, reason, self.collector.queue)
            self.refused = 0
            new = self.store(batch.rows)
        finally:
            # Rarely used: no idle connection whose heartbeats nobody would answer.
            self.quarantine.close()
        self.collector.counters.add(
            collected=new,
            duplicates=len(batch.rows) - new - self.refused,
            quarantined=len(batch.quarantine),
        )
        return new

    def store(self, rows):
        """Store until it works: only row errors (see ROW_ERROR_CLASSES) change the plan."""
        delay = BACKOFF_FIRST
        while True:
            try:
                return store_rows(self._pg(), [row for row, _props, _body in rows])
            except psycopg.Error as exc:
                if refuses_row(exc):
                    log.warning("%s: batch refused (%s); storing one by one", self.name, exc)
                    return self.store_one_by_one(rows)
                self.collector.counters.error(exc)
                log.warning("%s: database error %s; retrying in %.1fs", self.name, exc, delay)
                self._close_pg()
                if self.abandon.wait(delay) or self.collector.stop_event.is_set():
                    raise
                delay = min(delay * 2, BACKOFF_MAX)

    def store_one_by_one(self, rows):
        new = 0
        for row, properties, body in rows:
            try:
                new += store_rows(self._pg(), [row])
            except psycopg.Error as exc:
                if not refuses_row(exc):
                    raise
                self.quarantine.publish(
                    properties, body, f"database refused: {exc}", self.collector.queue
                )
                self.collector.counters.add(quarantined=1)
                self.refused += 1
        return new

    def _pg(self):
        if self.pg is None or self.pg.closed:
            self.pg = psycopg.connect(self.collector.conninfo, autocommit=True)
        return self.pg

    def _close_pg(self):
        if self.pg is not None:
            with contextlib.suppress(psycopg.Error):
                self.pg.close()
            self.pg = None

    def beat(self, every=HEARTBEAT_SECONDS):
        """Upsert this collector's counters so /healthz and the console see every collector.

        Best effort: a database that is down shows as a stale heartbeat, and the batch retry
        loop above is what waits for it.
        """
        collector = self.collector
        now = time.monotonic()
        with collector.beat_lock:
            # Also at once when a source wakes up, so a drain shows as soon as it starts.
            waking = collector.beat_collected == 0 and collector.counters.collected > 0
            if now - collector.last_beat < every and not waking:
                return
            elapsed = now - collector.last_beat if collector.last_beat else 0.0
            previous = collector.beat_collected
            collector.last_beat = now
        c = collector.counters
        with c.lock:
            collected, duplicates, quarantined = c.collected, c.duplicates, c.quarantined
            errors, last_error, last_at = c.errors, c.last_error, c.last_collected_at
        rate = (collected - previous) / elapsed if elapsed else 0.0
        try:
            self._pg().execute(
                """
                INSERT INTO recovery_collectorheartbeat
                  (worker, vhost, queue, collected, duplicates, quarantined, errors, last_error,
                   rate, last_collected_at, started_at, updated_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, to_timestamp(%s), now(), now())
                ON CONFLICT (worker, vhost, queue) DO UPDATE SET
                  collected = EXCLUDED.collected, duplicates = EXCLUDED.duplicates,
                  quarantined = EXCLUDED.quarantined, errors = EXCLUDED.errors,
                  last_error = EXCLUDED.last_error, rate = EXCLUDED.rate,
                  last_collected_at = EXCLUDED.last_collected_at, updated_at = now()
                """,
                (
                    collector.worker,
                    collector.vhost,
                    collector.queue,
                    collected,
                    duplicates,
                    quarantined,
                    errors,
                    last_error,
                    rate,
                    last_at,
                ),
            )
        except psycopg.Error as exc:
            log.info("%s: heartbeat not written (%s)", self.name, exc)
            self._close_pg()
            return
        collector.beat_collected = collected
