"""The database side of a collector: store batches, quarantine what cannot be stored, heartbeat.

The ``SourceCollector`` threads of a process (the AMQP side) hand their batches to one
``WriterPool`` of ``BatchWriter`` threads, so that parsing the next batch overlaps with committing
the previous ones. For every batch a writer (1) publishes the deliveries the consumer could not
turn into rows to the quarantine queue, with publisher confirms, (2) stores the rows in one
transaction, and only then (3) asks the batch's AMQP thread to ack it. A failure before (3) leaves
the deliveries unacked: the broker redelivers them and the unique fingerprint makes that harmless.
"""

import contextlib
import functools
import logging
import queue
import threading
import time

import psycopg
import psycopg.errors

from recovery import db
from recovery.broker.confirms import ConfirmingChannel
from recovery.client.headers import UndecodableHeaders
from recovery.collector.insert import store_rows

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
        # The queue is declared here too: with nowhere to put a message, it could never be acked.
        # No blocked-connection timeout: during a broker alarm the batch waits, unacked, instead
        # of failing and being redelivered over and over.
        self.confirming = ConfirmingChannel(
            vhost, declare_queue=queue_name, blocked_connection_timeout=None
        )

    def publish(self, properties, body, reason, source_queue):
        headers = properties.headers
        if not isinstance(headers, UndecodableHeaders):  # that one must keep its raw entries
            headers = dict(headers or {})
        headers["x-quarantine-reason"] = reason[:1000]
        headers["x-quarantine-source"] = source_queue
        headers["x-quarantine-vhost"] = self.vhost
        properties.headers = headers
        # Raises (so the delivery is never acked) unless the broker confirmed it.
        self.confirming.publish("", self.queue, body, properties)
        log.error("collector %s/%s: quarantined a message: %s", self.vhost, source_queue, reason)

    def close(self):
        self.confirming.close()


class WriterFailed(RuntimeError):
    """A writer gave up on a batch; the AMQP side reconnects and the batch is redelivered."""


class Session:
    """One ``SourceCollector`` connection as the writers see it: where to ack, whether it died."""

    def __init__(self, collector, connection):
        self.collector = collector
        self.connection = connection
        self.abandoned = threading.Event()  # the connection is gone: drop and stop retrying
        self.error = None

    def raise_if_failed(self):
        if self.error is not None:
            raise WriterFailed(f"{type(self.error).__name__}: {self.error}") from self.error

    def fail(self, exc):
        self.error = exc
        with contextlib.suppress(Exception):
            self.connection.add_callback_threadsafe(lambda: None)  # wake the AMQP thread

    def stored(self, on_stored, batch, new):
        """Hand the ack to the AMQP thread (pika connections are not thread-safe)."""
        try:
            self.connection.add_callback_threadsafe(functools.partial(on_stored, batch, new))
        except Exception as exc:  # noqa: BLE001 - the connection is gone: redelivery
            log.info("%s: cannot ack, connection gone (%s)", self.collector.name, exc)
            self.abandoned.set()


_STOP = object()


class WriterPool:
    """The database writers shared by all the collectors of a process.

    Several writers commit batches concurrently (PostgreSQL spends most of a batch maintaining
    indexes, on its own CPU), so batches complete out of order; each collector acks them in
    order (``SourceCollector.stored``). Shared, so a process serving many vhosts holds ``size``
    database connections, not a few per source, and a burst on one source gets every writer.
    Up to ``size`` batches wait for a writer; the prefetch windows bound the memory.
    """

    def __init__(self, conninfo, size, stop_event):
        self.conninfo = conninfo
        self.stop_event = stop_event
        self.batches = queue.Queue(maxsize=size)
        # Set by close(): a writer that finds no batch waiting stops (a stop marker may not fit
        # in a queue full of batches a stalled database holds up).
        self.closing = False
        self.collectors = []  # whose heartbeats the writers write
        self.writers = [BatchWriter(self, n) for n in range(size)]

    def start(self):
        for writer in self.writers:
            writer.start()

    def submit(self, session, batch, on_stored):
        """Queue a batch; ``on_stored(batch, new)`` then runs in the AMQP thread to ack it."""
        item = (session, batch, on_stored)
        while True:
            session.raise_if_failed()
            try:
                self.batches.put_nowait(item)
                return
            except queue.Full:
                # Keep AMQP heartbeats and acks flowing while the database catches up.
                session.connection.process_data_events(time_limit=0.05)

    def close(self, timeout=5.0):
        deadline = time.monotonic() + timeout
        self.closing = True
        for _ in self.writers:
            with contextlib.suppress(queue.Full):
                self.batches.put(_STOP, timeout=max(0.1, deadline - time.monotonic()))
        for writer in self.writers:
            if writer.ident is not None:
                writer.join(max(0.1, deadline - time.monotonic()))


class BatchWriter(threading.Thread):
    """One writer thread: quarantines, stores, then has the batch acked (see the module doc)."""

    def __init__(self, pool, number):
        super().__init__(name=f"collector-writer{number}", daemon=True)
        self.pool = pool
        self.pg = None
        self.quarantines = {}  # vhost -> Quarantine
        self.refused = 0

    def run(self):
        self.beat_all()  # "running", and the start of the first rate interval
        while True:
            try:
                item = self.pool.batches.get(timeout=HEARTBEAT_SECONDS / 2)
            except queue.Empty:
                if self.pool.closing:
                    break
                self.beat_all()
                continue
            if item is _STOP:
                break
            session, batch, on_stored = item
            if session.abandoned.is_set():
                continue  # its connection died: the broker redelivers these
            try:
                new = self.write(session, batch)
            except Exception as exc:  # noqa: BLE001 - that source reconnects; the others go on
                if not session.abandoned.is_set():
                    log.warning("%s: %s: %s", session.collector.name, type(exc).__name__, exc)
                    session.collector.counters.error(exc)
                session.fail(exc)
                continue
            session.stored(on_stored, batch, new)
            self.beat_all()
        for quarantine in self.quarantines.values():
            quarantine.close()
        self._close_pg()

    def write(self, session, batch):
        collector = session.collector
        quarantine = self.quarantines.setdefault(
            collector.vhost, Quarantine(collector.vhost, collector.quarantine_queue)
        )
        try:
            for properties, body, reason in batch.quarantine:
                quarantine.publish(properties, body, reason, collector.queue)
            self.refused = 0
            new = self.store(session, batch.rows, quarantine)
        finally:
            # Rarely used: no idle connection whose heartbeats nobody would answer.
            quarantine.close()
        collector.counters.add(
            collected=new,
            duplicates=len(batch.rows) - new - self.refused,
            quarantined=len(batch.quarantine),
        )
        return new

    def store(self, session, rows, quarantine):
        """Store until it works: only row errors (see ROW_ERROR_CLASSES) change the plan."""
        delay = BACKOFF_FIRST
        while True:
            try:
                return store_rows(self._pg(), [row for row, _props, _body in rows])
            except psycopg.Error as exc:
                if refuses_row(exc):
                    log.warning("%s: batch refused (%s); one by one", session.collector.name, exc)
                    return self.store_one_by_one(session, rows, quarantine)
                session.collector.counters.error(exc)
                log.warning(
                    "%s: database error %s; retrying in %.1fs", session.collector.name, exc, delay
                )
                self._close_pg()
                if session.abandoned.wait(delay) or self.pool.stop_event.is_set():
                    raise
                delay = min(delay * 2, BACKOFF_MAX)

    def store_one_by_one(self, session, rows, quarantine):
        new = 0
        for row, properties, body in rows:
            try:
                new += store_rows(self._pg(), [row])
            except psycopg.Error as exc:
                if not refuses_row(exc):
                    raise
                reason = f"database refused: {exc}"
                quarantine.publish(properties, body, reason, session.collector.queue)
                session.collector.counters.add(quarantined=1)
                self.refused += 1
        return new

    def _pg(self):
        if self.pg is None or self.pg.closed:
            self.pg = db.connect(self.pool.conninfo, autocommit=True)
        return self.pg

    def _close_pg(self):
        if self.pg is not None:
            with contextlib.suppress(psycopg.Error):
                self.pg.close()
            self.pg = None

    def beat_all(self):
        for collector in list(self.pool.collectors):
            self.beat(collector)

    def beat(self, collector, every=HEARTBEAT_SECONDS):
        """Upsert this collector's counters so /healthz and the console see every collector.

        Best effort: a database that is down shows as a stale heartbeat, and the batch retry
        loop above is what waits for it.
        """
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
