"""The bulk replay publisher: asynchronous publisher confirms over a bounded window.

Confirming each publish before the next (recovery.replay.one.ConfirmingPublisher, the one-click
path) costs a round trip per message; the seeds measured async confirms at several times that rate.
This publisher keeps up to ``window`` publishes unconfirmed on one pika ``SelectConnection``,
driven by its own I/O thread, and reports an outcome per entry. It is the seeds' RetryCache: every
publish stays in the cache until the broker answers it; when the connection or channel is lost, or
a confirm does not come within ``confirm_timeout``, what was unconfirmed is published again on the
next connection. So a message is never lost to a force-closed connection, and a message is
duplicated only if the broker had taken it but its confirm was lost with the connection — at most
``window`` per loss.

Outcomes (``Outcome.outcome``): ``confirmed`` (acked, not returned), ``returned`` (mandatory
``basic.return``: nothing bound), ``nacked``, ``failed`` (the broker refused it, e.g. a missing
exchange closed the channel, with the reason), ``withdrawn`` (not published when ``withdraw()``
was called; ``maybe_sent`` says whether an earlier, unconfirmed attempt went out).

Threads: ``submit``, ``take_outcomes``, ``withdraw`` and ``close`` are for one caller thread (the
job runner); all pika calls happen on the I/O thread. They share two deques (append/popleft are
atomic) and an Event.
"""

import logging
import threading
import time
from collections import deque
from typing import NamedTuple

import pika
from pika.adapters.select_connection import IOLoop
from pika.spec import Basic

from recovery.broker.connection import cluster_parameters

log = logging.getLogger(__name__)

# How often the I/O thread looks for overdue confirms.
TICK_S = 0.25
# Reconnect back-off: a force-closed connection comes back at once; an unreachable broker is
# not hammered.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0
# A publish whose channel the broker closes this many times (for a reason that does not name its
# exchange) is failed instead of being retried forever.
MAX_CHANNEL_FAILURES = 3


class Outcome(NamedTuple):
    key: object
    outcome: str
    detail: str
    maybe_sent: bool = False


class Entry:
    __slots__ = (
        "key",
        "exchange",
        "routing_key",
        "properties",
        "body",
        "origin",
        "returned",
        "sent_at",
        "attempts",
        "channel_failures",
    )

    def __init__(self, key, exchange, routing_key, properties, body, origin):
        self.key = key
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.origin = origin  # x-recovery-origin: finds the entry of a basic.return
        self.returned = None
        self.sent_at = 0.0
        self.attempts = 0
        self.channel_failures = 0


class AsyncPublisher:
    def __init__(
        self, vhost, window, confirm_timeout, name="lazarus-replay", url=None, wakeup=None
    ):
        self.window = window
        self.confirm_timeout = confirm_timeout
        # One per node of the cluster, taken in turn on each reconnect (a SelectConnection
        # takes one node): a lost node costs one failed attempt, then the next one is tried.
        self._nodes = cluster_parameters(
            vhost, url=url, heartbeat=30, client_properties={"connection_name": name}
        )
        self._node = 0
        self.outcomes = deque()
        self.wakeup = wakeup or threading.Event()  # set whenever outcomes arrive
        self.submitted = 0  # caller thread
        self.taken = 0  # caller thread
        # Observability, read by the runner (ints/strings: racy reads are harmless).
        self.connected = False
        self.last_error = ""
        self.resent = 0
        self.connections = 0

        self._incoming = deque()
        self._wakeup_scheduled = False
        # I/O thread only.
        self._resend = deque()
        self._unconfirmed = {}  # delivery tag -> Entry, in tag order
        self._by_origin = {}
        self._next_tag = 0
        self._ready = False
        self._blocked = False
        self._stopping = False
        self._backoff = RECONNECT_MIN_S
        self._connection = None
        self._channel = None
        self._ioloop = IOLoop()
        self._thread = threading.Thread(target=self._run, name=f"{name}:{vhost}", daemon=True)
        self._thread.start()

    # ---- caller thread ----------------------------------------------------------------------

    @property
    def outstanding(self):
        """Entries submitted and not yet reported (queued, in flight or being resent)."""
        return self.submitted - self.taken

    def submit(self, entry):
        self.submitted += 1
        self._incoming.append(entry)
        # One wake-up per burst: the I/O thread clears the flag before draining, so an entry
        # appended after its drain always schedules another.
        if not self._wakeup_scheduled:
            self._wakeup_scheduled = True
            self._ioloop.add_callback_threadsafe(self._drain)

    def take_outcomes(self):
        taken = []
        outcomes = self.outcomes
        while outcomes:
            taken.append(outcomes.popleft())
        self.taken += len(taken)
        return taken

    def withdraw(self):
        """Report every entry not yet published as ``withdrawn`` (pause, cancel, shutdown)."""
        self._ioloop.add_callback_threadsafe(self._withdraw)

    def close(self, timeout=10):
        self._ioloop.add_callback_threadsafe(self._shutdown)
        self._thread.join(timeout)

    # ---- I/O thread: connection -----------------------------------------------------------

    def _run(self):
        self._connect()
        self._ioloop.call_later(TICK_S, self._tick)
        self._ioloop.start()

    def _connect(self):
        if self._stopping:
            return
        self._connection = pika.SelectConnection(
            self._nodes[self._node % len(self._nodes)],
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )

    def _reconnect_later(self):
        if self._stopping:
            self._ioloop.stop()
            return
        self._node += 1
        self._ioloop.call_later(self._backoff, self._connect)
        self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)

    def _on_open(self, connection):
        self.connections += 1
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        connection.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, _connection, error):
        self.last_error = f"cannot connect: {error!r}"
        log.warning("replay publisher: %s", self.last_error)
        self._reconnect_later()

    def _on_connection_closed(self, _connection, reason):
        self.connected = False
        if not self._stopping:
            self.last_error = f"connection lost: {reason!r}"
            log.info("replay publisher: %s", self.last_error)
        self._lost_channel(None)
        self._reconnect_later()

    def _on_blocked(self, *_args):
        self._blocked = True  # a broker resource alarm: confirms are late, not lost

    def _on_unblocked(self, *_args):
        self._blocked = False
        for entry in self._unconfirmed.values():
            entry.sent_at = time.monotonic()

    def _on_channel(self, channel):
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._on_ready())

    def _on_ready(self):
        self._next_tag = 0
        self._ready = True
        self.connected = True
        self._backoff = RECONNECT_MIN_S
        self._drain()

    def _on_channel_closed(self, channel, reason):
        if channel is not self._channel:
            return
        self._lost_channel(reason)
        connection = self._connection
        if connection is not None and connection.is_open and not self._stopping:
            connection.channel(on_open_callback=self._on_channel)

    def _lost_channel(self, reason):
        """Unconfirmed publishes on a dead channel are published again, first in line."""
        self._ready = False
        self._channel = None
        lost = list(self._unconfirmed.values())
        self._unconfirmed.clear()
        self._by_origin.clear()
        code = getattr(reason, "reply_code", None)
        text = getattr(reason, "reply_text", "") or ""
        if code is not None and code >= 400:
            self.last_error = f"channel closed by the broker: {code} {text}"
            log.warning("replay publisher: %s", self.last_error)
        retry = []
        for entry in lost:
            if code is not None and code >= 400:
                entry.channel_failures += 1
                names_it = f"'{entry.exchange}'" in text
                if names_it or entry.channel_failures >= MAX_CHANNEL_FAILURES:
                    self._report(entry, "failed", f"refused by the broker: {code} {text}")
                    continue
            retry.append(entry)
        self.resent += len(retry)
        self._resend.extendleft(reversed(retry))

    def _shutdown(self):
        self._stopping = True
        self._withdraw()
        if self._connection is not None and self._connection.is_open:
            self._connection.close()  # its close callback stops the loop
        elif self._connection is not None and self._connection.is_closing:
            pass
        else:
            self._ioloop.stop()

    def _tick(self):
        if self._stopping:
            return
        self._ioloop.call_later(TICK_S, self._tick)
        if not self._unconfirmed or self._blocked:
            return
        oldest = next(iter(self._unconfirmed.values()))
        if time.monotonic() - oldest.sent_at > self.confirm_timeout:
            # No confirm for too long: treat the connection as dead (what the seeds' RetryCache
            # does with its timer) so the unconfirmed publishes go out again on a fresh one.
            self.last_error = f"no confirm within {self.confirm_timeout:g}s; reconnecting"
            log.warning("replay publisher: %s", self.last_error)
            if self._connection is not None and self._connection.is_open:
                self._connection.close(320, "lazarus: confirm timeout")

    # ---- I/O thread: publishing and confirms ----------------------------------------------

    def _drain(self):
        self._wakeup_scheduled = False
        if not self._ready or self._stopping:
            return
        resend, incoming, unconfirmed = self._resend, self._incoming, self._unconfirmed
        channel, window = self._channel, self.window
        publish = channel.basic_publish
        now = time.monotonic()
        while len(unconfirmed) < window:
            if resend:
                entry = resend.popleft()
            elif incoming:
                entry = incoming.popleft()
            else:
                return
            entry.returned = None
            try:
                publish(
                    entry.exchange, entry.routing_key, entry.body, entry.properties, mandatory=True
                )
            except Exception as exc:  # the channel or connection is closing under us
                log.info("replay publisher: publish failed, will resend: %r", exc)
                resend.appendleft(entry)
                self._ready = False
                return
            entry.attempts += 1
            entry.sent_at = now
            self._next_tag += 1
            unconfirmed[self._next_tag] = entry
            self._by_origin[entry.origin] = entry

    def _on_return(self, _channel, method, properties, _body):
        origin = (properties.headers or {}).get("x-recovery-origin")
        entry = self._by_origin.get(origin)
        if entry is not None:
            entry.returned = f"returned by the broker: {method.reply_code} {method.reply_text}"

    def _on_confirm(self, frame):
        method = frame.method
        acked = isinstance(method, Basic.Ack)
        tag = method.delivery_tag
        unconfirmed, by_origin = self._unconfirmed, self._by_origin
        if method.multiple:
            done = []
            for t in unconfirmed:  # insertion order = tag order
                if t > tag:
                    break
                done.append(t)
            entries = [unconfirmed.pop(t) for t in done]
        else:
            entry = unconfirmed.pop(tag, None)
            entries = [entry] if entry is not None else []
        for entry in entries:
            by_origin.pop(entry.origin, None)
            if not acked:
                self._report(entry, "nacked", "the broker nacked the publish")
            elif entry.returned is not None:
                self._report(entry, "returned", entry.returned)
            else:
                self.outcomes.append(Outcome(entry.key, "confirmed", ""))
        self.wakeup.set()
        if self._resend or self._incoming:
            self._drain()

    def _report(self, entry, outcome, detail, maybe_sent=False):
        self.outcomes.append(Outcome(entry.key, outcome, detail, maybe_sent))
        self.wakeup.set()

    def _withdraw(self):
        for queue in (self._resend, self._incoming):
            while queue:
                entry = queue.popleft()
                self._report(entry, "withdrawn", "", maybe_sent=entry.attempts > 0)
