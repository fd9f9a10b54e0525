"""IdempotentConsumer: manual acks, dedup by message_id, poison messages to the DLX.

RabbitMQ delivers at least once: a consumer whose ack was lost on a force-closed connection sees
the message again, and a producer that resent an unconfirmed message puts a second copy in the
queue. Both are caught here by ``message_id`` (in memory, or in PostgreSQL in the same transaction
as the handler's work), acked and logged as ``duplicate_skipped``. A handler that keeps failing
is requeued up to ``max_attempts`` and then rejected without requeue, so the queue's
dead-letter exchange hands it to Lazarus instead of it looping forever.

The handler is called as ``handler(delivery)`` — or ``handler(delivery, db)`` with PostgreSQL
dedup when it takes two arguments, ``db`` being the psycopg connection inside the transaction
that also records the message as processed. ``delivery`` is a ``Delivery``.

Thread-safety: ``run`` blocks the calling thread and does everything (handler included) on it;
``stop`` may be called from any thread or from inside the handler.
"""

import collections
import contextlib
import dataclasses
import inspect
import itertools
import logging
import os
import socket
import threading
import time

import pika
import pika.exceptions

from recovery.client.dedup import DATABASE_ERRORS, make_dedup
from recovery.client.logs import ConsumerLog

log = logging.getLogger(__name__)

# Unacked deliveries the broker may push ahead. Higher hides network latency; lower means fewer
# redeliveries when a connection is force-closed and fairer spreading over consumers.
PREFETCH = 200
MAX_ATTEMPTS = 3
# How long one wait for broker events lasts: the latency of stop() and of idle log flushes.
POLL_S = 0.2
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0
# message_ids whose failed attempts are remembered; a message failing beyond this many others
# in flight restarts its count (it still ends in the DLX, just later).
ATTEMPTS_CAPACITY = 10_000

_instances = itertools.count(1)


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    message_id: str | None
    body: bytes
    properties: pika.BasicProperties
    exchange: str
    routing_key: str
    redelivered: bool

    @property
    def headers(self):
        return self.properties.headers or {}


class IdempotentConsumer:
    """Consume ``queue`` as one member of consumer ``group``. See the module doc."""

    def __init__(
        self,
        url,
        queue,
        group,
        handler,
        log_dir=None,
        prefetch=PREFETCH,
        dedup="memory",
        max_attempts=MAX_ATTEMPTS,
        name=None,
    ):
        self.queue = queue
        self.group = group
        self.handler = handler
        self.prefetch = prefetch
        self.max_attempts = max_attempts
        self.name = name or f"{group}@{socket.gethostname()}-{os.getpid()}-{next(_instances)}"
        # A cluster: one URL per node; each connection goes to the first that answers.
        self._params = [pika.URLParameters(u) for u in ([url] if isinstance(url, str) else url)]
        self._dedup = make_dedup(group, dedup)
        self._handler_takes_db = self._dedup.passes_db and _positional_arity(handler) >= 2
        self._log = ConsumerLog(log_dir, group, self.name, queue)
        self._attempts = collections.OrderedDict()  # message_id -> failed attempts
        self._stop = threading.Event()
        self._connection = None
        self._backoff = RECONNECT_MIN_S

    def run(self):
        """Consume until ``stop()``; reconnects by itself when the connection is lost."""
        self._backoff = RECONNECT_MIN_S
        try:
            while not self._stop.is_set():
                try:
                    self._consume()
                except (pika.exceptions.AMQPError, OSError) as exc:
                    log.info("%s: connection lost, reconnecting: %r", self.name, exc)
                    self._stop.wait(self._backoff)
                    self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)
        finally:
            self._log.close()
            self._dedup.close()

    def stop(self):
        """Ask ``run`` to return after the delivery in hand; safe from any thread."""
        self._stop.set()
        connection = self._connection
        if connection is not None:
            # Wakes process_data_events; if already closed, run() notices the flag on its own.
            with contextlib.suppress(Exception):
                connection.add_callback_threadsafe(lambda: None)

    def _consume(self):
        connection = pika.BlockingConnection(self._params)
        self._connection = connection
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.basic_consume(self.queue, self._on_message)
            self._backoff = RECONNECT_MIN_S  # connected: the next loss retries at once
            while not self._stop.is_set():
                connection.process_data_events(time_limit=POLL_S)
                self._log.flush_if_due()
        finally:
            self._connection = None
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()

    def _on_message(self, channel, method, properties, body):
        started = time.perf_counter()
        ts_ms = int(time.time() * 1000)
        message_id = properties.message_id
        delivery = Delivery(
            message_id, body, properties, method.exchange, method.routing_key, method.redelivered
        )
        try:
            outcome = self._handle(delivery)
        except DATABASE_ERRORS as exc:
            # The dedup database is down, not the message bad: requeue without counting.
            log.warning("%s: database unavailable, requeueing: %s", self.name, exc)
            outcome = "requeue"
        except Exception:
            log.exception("%s: handler failed for message %s", self.name, message_id)
            outcome = self._count_failure(_attempt_key(delivery))
        else:
            self._attempts.pop(_attempt_key(delivery), None)
        # Logged before the ack: if the ack is lost with the connection, the redelivery is
        # logged as duplicate_skipped and the audit still sees the processing.
        handle_ms = round((time.perf_counter() - started) * 1000, 3)
        self._log.delivery(ts_ms, message_id, method.redelivered, outcome, handle_ms)
        if outcome in ("ack", "duplicate_skipped"):
            channel.basic_ack(method.delivery_tag)
        else:
            channel.basic_nack(method.delivery_tag, requeue=outcome == "requeue")

    def _handle(self, delivery):
        if delivery.message_id is None:
            # Nothing to dedup on: process it, at least once.
            self._call(delivery, None)
            return "ack"
        with self._dedup.claim(delivery.message_id) as (is_new, db):
            if not is_new:
                return "duplicate_skipped"
            self._call(delivery, db)
        return "ack"

    def _call(self, delivery, db):
        if self._handler_takes_db:
            self.handler(delivery, db)
        else:
            self.handler(delivery)

    def _count_failure(self, key):
        failures = self._attempts.pop(key, 0) + 1
        if failures >= self.max_attempts:
            return "reject"
        self._attempts[key] = failures
        if len(self._attempts) > ATTEMPTS_CAPACITY:
            self._attempts.popitem(last=False)
        return "requeue"


def _attempt_key(delivery):
    # Without a message_id the body stands in, so a poison message still reaches the DLX.
    return delivery.message_id or ("body", hash(delivery.body))


def _positional_arity(func):
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in kinds)
