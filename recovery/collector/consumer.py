"""The collector: drains the recovery queues into the store, exactly once, as fast as they fill.

One ``SourceCollector`` thread per (vhost, recovery queue) owns an AMQP connection: it consumes,
turns each delivery into a store row (``recovery.collector.rows``) and hands batches to its writer
threads (``recovery.collector.writer``), which commit them; only then is a batch acked, with one
multiple-ack, in order. Parsing the next batch overlaps with committing the previous ones. A crash
anywhere before the ack means redelivery, and redelivery is harmless (unique fingerprint).

It runs inside a Celery worker as a bootstep (``recovery.collector.bootsteps.CollectorStep``),
which also
starts one more collector process per further CPU core (``recovery.collector.processes``): scale
out by starting more workers; they all compete for the same queues. Dedicated pika connections,
rather than kombu consumers on the worker's own connection, keep the drain independent of task
traffic and allow multiple-ack and pipelining, the biggest factors in drain speed
(bench/collector.py).

Memory is bounded by the prefetch window, which is sized in bytes as well as messages (``Window``):
RabbitMQ pushes up to prefetch-count messages whatever their size, so a queue of 20 MB messages
with the 1 KiB-message prefetch of 2000 would mean 40 GB in flight.
"""

import contextlib
import functools
import logging
import os
import socket
import threading
import time

import pika
import pika.exceptions
import psycopg
from django.conf import settings

from recovery.broker.connection import cluster_parameters
from recovery.broker.topology import Names
from recovery.collector.rows import delivery_to_row, source_of
from recovery.collector.writer import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Batch,
    Counters,
    Session,
    WriterFailed,
    WriterPool,
)
from recovery.db import database_conninfo
from recovery.errors import UnstorableDelivery

log = logging.getLogger(__name__)

# A batch is flushed early once its bodies reach this many bytes: COPY holds them once more, and
# COLLECTOR_BATCH_SIZE messages of 20 MB each would be 10 GB.
BATCH_MAX_BYTES = 16 * 1024 * 1024
# Consumer-side wake-up: how long to wait for a delivery before looking at the clock again.
POLL_SECONDS = 0.05
HEARTBEAT = 30  # AMQP heartbeat (s); a dead TCP peer is noticed within two of them


class Window:
    """The prefetch window: a count derived from a byte budget and the biggest recent body.

    RabbitMQ fixes a consumer's prefetch when it subscribes (quorum queues have no channel-wide
    prefetch), so a new size means cancel and subscribe again (``changed``); the deliveries
    prefetched but not taken go back to the queue. The window starts small, because a queue of
    huge messages must not flood memory before the first one is seen, and grows fourfold per
    batch while bodies are small, like TCP slow start; a big body shrinks it at once (deliveries
    already in flight still arrive).
    """

    GROWTH = 4

    def __init__(self, maximum, budget_bytes, max_body_bytes):
        self.maximum = maximum
        self.budget = budget_bytes
        self.size = self._fit(max_body_bytes)
        self.changed = False

    def _fit(self, body_size):
        return max(1, min(self.maximum, self.budget // max(body_size, 1)))

    def saw(self, body_size):
        """A delivery of this size arrived: shrink now if the window no longer fits the budget."""
        if body_size * self.size > self.budget:
            self._resize(self._fit(body_size))

    def after_batch(self, batch):
        target = self._fit(batch.biggest)
        if target > self.size:
            self._resize(min(target, self.size * self.GROWTH))

    def _resize(self, size):
        if size != self.size:
            self.size, self.changed = size, True

    def subscribe(self, channel, queue):
        """(Re)subscribe with the current size; returns the consume generator."""
        self.changed = False
        channel.basic_qos(prefetch_count=self.size)
        return channel.consume(queue, inactivity_timeout=POLL_SECONDS)


class SourceCollector(threading.Thread):
    """Drains one recovery queue of one vhost into the store; reconnects until stopped."""

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
        prefetch_bytes=None,
        source=None,
        pool=None,
    ):
        super().__init__(name=f"collector:{vhost}:{queue}", daemon=True)
        self.vhost = vhost
        self.queue = queue
        self.source = source or source_of(queue)
        self.conninfo = conninfo
        self.stop_event = stop_event
        self.prefetch = prefetch or settings.COLLECTOR_PREFETCH
        self.prefetch_bytes = prefetch_bytes or settings.COLLECTOR_PREFETCH_BYTES
        self.batch_size = batch_size or settings.COLLECTOR_BATCH_SIZE
        self.flush_seconds = flush_seconds or settings.COLLECTOR_FLUSH_SECONDS
        self.max_body_bytes = max_body_bytes or settings.COLLECTOR_MAX_BODY_BYTES
        self.quarantine_queue = quarantine_queue or settings.RECOVERY_QUARANTINE_QUEUE
        self.poison_threshold = settings.POISON_THRESHOLD
        # Shared with the process's other collectors (start_collectors), or a private one.
        self.pool = pool or WriterPool(conninfo, settings.COLLECTOR_WRITERS, stop_event)
        self.own_pool = pool is None
        self.pool.collectors.append(self)
        self.counters = Counters()
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.beat_lock = threading.Lock()
        self.last_beat = 0.0
        self.beat_collected = 0
        # Per connection: deliveries handed to the writers and not yet acked, and the batches
        # stored out of order, waiting for the ones before them (acks go in order).
        self.in_flight = 0
        self.next_seq = self.ack_seq = 0
        self.stored_out_of_order = {}

    def run(self):
        if self.own_pool:
            self.pool.start()
        try:
            self.reconnect_until_stopped()
        finally:
            if self.own_pool:
                self.pool.close()

    def reconnect_until_stopped(self):
        backoff = BACKOFF_FIRST
        while not self.stop_event.is_set():
            try:
                self.drain()
                backoff = BACKOFF_FIRST
            except (pika.exceptions.AMQPError, psycopg.Error, OSError, WriterFailed) as exc:
                self.counters.error(exc)
                log.warning("%s: %s: %s; reconnecting", self.name, type(exc).__name__, exc)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as exc:  # noqa: BLE001 - a collector thread must never die
                self.counters.error(exc)
                log.exception("%s: unexpected error; reconnecting", self.name)
                self.stop_event.wait(BACKOFF_MAX)

    def drain(self):
        """Consume until stopped or a connection fails (``run`` reconnects)."""
        connection = pika.BlockingConnection(cluster_parameters(self.vhost, heartbeat=HEARTBEAT))
        session = Session(self, connection)
        self.in_flight = self.next_seq = self.ack_seq = 0
        self.stored_out_of_order = {}
        try:
            channel = connection.channel()
            window = Window(self.prefetch, self.prefetch_bytes, self.max_body_bytes)
            batch = Batch()
            while not self.stop_event.is_set():
                for method, properties, body in window.subscribe(channel, self.queue):
                    session.raise_if_failed()
                    if method is not None:
                        self.take(batch, method, properties, body)
                        window.saw(len(body))
                    if batch and self.due(batch, window):
                        self.flush(session, channel, batch)
                        window.after_batch(batch)
                        batch = Batch()
                    if self.stop_event.is_set() or window.changed:
                        break
                # Gives back what was prefetched but not taken (the batch keeps its deliveries).
                channel.cancel()
            if batch:
                self.flush(session, channel, batch)
            self.wait_for_acks(session)
        finally:
            session.abandoned.set()
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    connection.close()

    def take(self, batch, method, properties, body):
        """Add one delivery to the batch, as a row or, if it cannot be one, for quarantine."""
        size = len(body)
        if size > self.max_body_bytes:
            reason = f"body {size} B > limit {self.max_body_bytes} B (COLLECTOR_MAX_BODY_BYTES)"
            batch.add(method.delivery_tag, size, properties=properties, body=body, reason=reason)
            return
        try:
            row = delivery_to_row(
                self.vhost,
                self.queue,
                method.exchange,
                method.routing_key,
                properties,
                body,
                source=self.source,
                poison_threshold=self.poison_threshold,
            )
        except UnstorableDelivery as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - a parser bug must not lose (or block) a message
            log.exception("%s: cannot parse a delivery", self.name)
            reason = f"parse error: {type(exc).__name__}: {exc}"
        else:
            batch.add(method.delivery_tag, size, row=row, properties=properties, body=body)
            return
        batch.add(method.delivery_tag, size, properties=properties, body=body, reason=reason)

    def due(self, batch, window):
        return (
            batch.count >= self.batch_size
            or batch.bytes >= BATCH_MAX_BYTES
            # The broker sends nothing more until we ack: waiting would only add latency.
            or self.in_flight + batch.count >= window.size
            or time.monotonic() - batch.started >= self.flush_seconds
        )

    def flush(self, session, channel, batch):
        self.in_flight += batch.count
        self.pool.submit(session, batch, functools.partial(self.stored, channel, self.next_seq))
        self.next_seq += 1

    def stored(self, channel, seq, batch, new):
        """Runs in this thread (add_callback_threadsafe) once a writer committed a batch.

        Acks, with one multiple-ack, every batch up to the first one still being written: a
        multiple-ack covers every earlier delivery tag, so it must never pass an uncommitted one.
        """
        self.stored_out_of_order[seq] = batch
        last_tag = None
        while self.ack_seq in self.stored_out_of_order:
            done = self.stored_out_of_order.pop(self.ack_seq)
            self.ack_seq += 1
            self.in_flight -= done.count
            last_tag = done.last_tag
        if last_tag is not None and channel.is_open:
            channel.basic_ack(last_tag, multiple=True)

    def wait_for_acks(self, session, timeout=30.0):
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            session.raise_if_failed()
            session.connection.process_data_events(time_limit=0.05)


def start_collectors(vhosts=None, names=None, conninfo=None, writers=None, **tunables):
    """Start one thread per (vhost, source queue) and their shared writers.

    Returns (stop_event, threads); ``stop_collectors`` stops them all.
    """
    names = names or Names.from_settings()
    conninfo = conninfo or database_conninfo("lazarus-collector")
    stop_event = threading.Event()
    pool = WriterPool(conninfo, writers or settings.COLLECTOR_WRITERS, stop_event)
    threads = [
        SourceCollector(
            vhost,
            queue,
            conninfo,
            stop_event,
            source=source_of(queue, names),
            pool=pool,
            **tunables,
        )
        for vhost in (vhosts or settings.RECOVERY_VHOSTS)
        for queue in names.source_queues
    ]
    pool.start()
    for thread in threads:
        thread.start()
    return stop_event, threads


def stop_collectors(stop_event, threads, timeout=10):
    """Stop consuming, store and ack what is held, within ``timeout`` seconds. A collector that
    has not finished by then is left behind (its deliveries go back to the queue when the
    process exits, and come again: stored ones are recognised by their fingerprint) and said."""
    stop_event.set()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
    for thread in threads:
        if thread.is_alive():
            log.warning(
                "%s: still storing or acking %d messages after %ss; they go back to the queue",
                thread.name,
                thread.in_flight,
                timeout,
            )
    for pool in {id(t.pool): t.pool for t in threads if not t.own_pool}.values():
        pool.close(max(0.1, deadline - time.monotonic()))
