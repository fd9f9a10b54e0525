"""What the simulator sees happen, recorded as it happens: the raw material of the ground truth.

Three vantage points, none of them the log files the audit reads:

* the client library's audit-log calls, teed in memory (``observe_publisher`` /
  ``observe_consumer``): every publish attempt and its outcome, every delivery a consumer handled;
* taps: private queues bound to the recovery DLX and the alternate exchange, which receive a copy
  of every dead letter (with its ``x-first-death-*`` queue and reason) and every unroutable
  message of the vhost while the collector drains the originals;
* the faults it injects itself: crashes and forced connection closes.
"""

import collections
import contextlib
import logging
import threading
import time

import pika
import pika.exceptions

log = logging.getLogger(__name__)

# How long an idle tap waits for broker events before checking whether it should stop.
TAP_POLL_S = 0.1
# A tap queue nobody reads (a simulator that died) disappears after this long.
TAP_EXPIRES_MS = 10 * 60 * 1000


class Observer:
    """Thread-safe record of attempts, deliveries, dead letters, unroutables, crashes, drops."""

    def __init__(self):
        self._lock = threading.Lock()
        self.attempts = collections.defaultdict(list)  # message_id -> [(attempt, outcome)]
        self.first_ts = {}  # message_id -> ts of its first logged attempt (epoch ms)
        self.deliveries = collections.defaultdict(list)  # (message_id, group) -> [(outcome, redel)]
        self.dead_letters = collections.defaultdict(list)  # message_id -> [(queue, reason)]
        self.unrouted = collections.Counter()  # message_id -> copies seen on the AE
        self.crashes = {}  # (message_id, group) -> True if the connection really was closed
        self.drops = []  # connections closed per forced drop
        self.skipped_faults = []  # why each fault that could not be injected was not
        self.last_event = time.monotonic()

    def _touch(self):
        self.last_event = time.monotonic()

    def attempt(self, message_id, attempt, outcome, ts_ms=None):
        with self._lock:
            self.attempts[message_id].append((attempt, outcome))
            if ts_ms is not None:
                first = self.first_ts.get(message_id)
                self.first_ts[message_id] = ts_ms if first is None else min(first, ts_ms)
            self._touch()

    def delivery(self, message_id, group, outcome, redelivered):
        with self._lock:
            self.deliveries[(message_id, group)].append((outcome, bool(redelivered)))
            self._touch()

    def dead_letter(self, message_id, queue, reason):
        with self._lock:
            self.dead_letters[message_id].append((queue, reason))
            self._touch()

    def unroutable(self, message_id):
        with self._lock:
            self.unrouted[message_id] += 1
            self._touch()

    def claim_crash(self, message_id, group):
        """True once per (message, group): the first handler to see it crashes, later ones don't."""
        with self._lock:
            if (message_id, group) in self.crashes:
                return False
            self.crashes[(message_id, group)] = False
            return True

    def crashed(self, message_id, group, closed):
        with self._lock:
            self.crashes[(message_id, group)] = closed
            self._touch()

    def dropped(self, closed):
        with self._lock:
            self.drops.append(closed)
            self._touch()

    def skipped(self, reason):
        """A fault that could not be injected (connections.FaultSkipped): said, not raised."""
        log.warning("simulate: %s", reason)
        with self._lock:
            self.skipped_faults.append(reason)

    def skipped_reasons(self):
        with self._lock:
            return list(self.skipped_faults)

    def idle_for(self):
        return time.monotonic() - self.last_event

    def snapshot(self):
        """Copies of everything, safe to read while the threads keep recording."""
        with self._lock:
            return {
                "attempts": {k: list(v) for k, v in self.attempts.items()},
                "first_ts": dict(self.first_ts),
                "deliveries": {k: list(v) for k, v in self.deliveries.items()},
                "dead_letters": {k: list(v) for k, v in self.dead_letters.items()},
                "unrouted": dict(self.unrouted),
                "crashes": dict(self.crashes),
                "drops": list(self.drops),
            }


class _ProducerTee:
    """Stands in for a publisher's ``ProducerLog``: writes the line, then tells the observer."""

    def __init__(self, inner, observer):
        self._inner = inner
        self._observer = observer

    def attempt(self, ts_ms, message_id, exchange, routing_key, attempt, outcome, confirm_ms, size):
        self._inner.attempt(
            ts_ms, message_id, exchange, routing_key, attempt, outcome, confirm_ms, size
        )
        self._observer.attempt(message_id, attempt, outcome, ts_ms)

    def __getattr__(self, name):  # flush_if_due, close
        return getattr(self._inner, name)


class _ConsumerTee:
    def __init__(self, inner, observer, group):
        self._inner = inner
        self._observer = observer
        self._group = group

    def delivery(self, ts_ms, message_id, redelivered, outcome, handle_ms):
        self._inner.delivery(ts_ms, message_id, redelivered, outcome, handle_ms)
        self._observer.delivery(message_id, self._group, outcome, redelivered)

    def __getattr__(self, name):
        return getattr(self._inner, name)


# The client library has no observer hook; its one writer object per publisher/consumer
# (``_log``, a ProducerLog/ConsumerLog) is the narrowest seam that sees every attempt and delivery
# exactly as the audit will. Wrap it before any message flows.
def observe_publisher(publisher, observer):
    publisher._log = _ProducerTee(publisher._log, observer)
    return publisher


def observe_consumer(consumer, observer):
    consumer._log = _ConsumerTee(consumer._log, observer, consumer.group)
    return consumer


class Taps(threading.Thread):
    """Copies of the vhost's dead letters and unroutable messages, read as they arrive."""

    def __init__(self, parameters, run_id, dlx, unrouted, observer):
        super().__init__(name=f"simulate-taps-{run_id}", daemon=True)
        self.parameters = parameters
        self.dead_letter_tap = f"lazarus-simulate.{run_id}.tap.dead-letters"
        self.unrouted_tap = f"lazarus-simulate.{run_id}.tap.unrouted"
        self.dlx = dlx
        self.unrouted = unrouted
        self.observer = observer
        self._stop_event = threading.Event()
        self._ready = threading.Event()
        self._error = None

    def declare(self):
        """Create and bind the tap queues; call before anything is published."""
        connection = pika.BlockingConnection(self.parameters)
        try:
            channel = connection.channel()
            # Durable: RabbitMQ 4.3 refuses a queue that is neither durable nor exclusive, and an
            # exclusive tap would vanish with its connection (a reconnect would miss messages).
            # Classic whatever the vhost's default queue type; x-expires removes it when unused.
            args = {"x-expires": TAP_EXPIRES_MS, "x-queue-type": "classic"}
            channel.queue_declare(self.dead_letter_tap, durable=True, arguments=args)
            channel.queue_bind(self.dead_letter_tap, self.dlx, "#")
            channel.queue_declare(self.unrouted_tap, durable=True, arguments=args)
            channel.queue_bind(self.unrouted_tap, self.unrouted, "")
        finally:
            connection.close()

    def start(self):
        self.declare()
        super().start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the taps did not start: {self._error}")

    def run(self):
        while not self._stop_event.is_set():
            try:
                self._consume()
            except (pika.exceptions.AMQPError, OSError) as exc:
                self._error = exc
                log.warning("simulator tap connection lost, reconnecting: %r", exc)
                self._stop_event.wait(0.2)

    def _consume(self):
        connection = pika.BlockingConnection(self.parameters)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            channel.basic_consume(self.dead_letter_tap, self._on_dead_letter, auto_ack=True)
            channel.basic_consume(self.unrouted_tap, self._on_unrouted, auto_ack=True)
            self._ready.set()
            while not self._stop_event.is_set():
                connection.process_data_events(time_limit=TAP_POLL_S)
        finally:
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()

    def _on_dead_letter(self, _channel, _method, properties, _body):
        headers = properties.headers or {}
        queue = _text(headers.get("x-first-death-queue"))
        reason = _text(headers.get("x-first-death-reason"))
        if queue is None:  # only an x-death list (older brokers)
            first = (headers.get("x-death") or [{}])[-1]
            queue, reason = _text(first.get("queue")), _text(first.get("reason"))
        self.observer.dead_letter(properties.message_id, queue, reason)

    def _on_unrouted(self, _channel, _method, properties, _body):
        self.observer.unroutable(properties.message_id)

    def stop(self, timeout=10.0):
        """Stop once both tap queues are empty and the copies already pushed were recorded."""
        deadline = time.monotonic() + timeout
        connection = pika.BlockingConnection(self.parameters)
        try:
            channel = connection.channel()
            while time.monotonic() < deadline and any(
                channel.queue_declare(q, passive=True).method.message_count
                for q in (self.dead_letter_tap, self.unrouted_tap)
            ):
                time.sleep(TAP_POLL_S)
        finally:
            connection.close()
        # Pushed but undispatched deliveries are handled by the next process_data_events call.
        time.sleep(2 * TAP_POLL_S)
        self._stop_event.set()
        self.join(timeout)

    def delete(self):
        connection = pika.BlockingConnection(self.parameters)
        try:
            channel = connection.channel()
            channel.queue_delete(self.dead_letter_tap)
            channel.queue_delete(self.unrouted_tap)
        finally:
            connection.close()


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
