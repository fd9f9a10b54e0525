"""The bulk replay publisher: asynchronous publisher confirms over a bounded window.

Confirming each publish before the next (recovery.replay.one.ConfirmingPublisher, the one-click
path) costs a round trip per message; the seeds measured async confirms at several times that rate.
This publisher keeps up to ``window`` publishes unconfirmed on one pika ``SelectConnection``,
driven by its own I/O thread (the client library's ``ConnectionLoop``, which ``ReliablePublisher``
runs on too), and reports an outcome per entry. It is the seeds' RetryCache: every
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

Delay routes (a job with ``delay_seconds``) are declared on the channel that publishes to them
(``want_route``), before the first publish to each, again on every new channel: RabbitMQ 4.2+
(Khepri) confirms a declaration at a majority, so a publish on another connection, maybe to
another node, might not find the exchange yet. A route the broker refuses to declare (a queue of
that name with other arguments) fails the entries bound for it, with the broker's reason, after
MAX_CHANNEL_FAILURES tries.

A broker resource alarm (``connection.blocked``) does not stop it: at most ``window`` publishes
wait in the blocked connection, their confirm timeout stopped until ``connection.unblocked``.
"""

import logging
import threading
import time
from collections import deque
from typing import NamedTuple

from recovery.broker.connection import cluster_parameters
from recovery.client.connection_loop import ConnectionLoop
from recovery.replay.targets import delay_queue_arguments

log = logging.getLogger(__name__)

# How often the I/O thread looks for overdue confirms.
TICK_S = 0.25
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


class AsyncPublisher(ConnectionLoop):
    tick_s = TICK_S

    def __init__(
        self, vhost, window, confirm_timeout, name="lazarus-replay", url=None, wakeup=None
    ):
        # One per node of the cluster, taken in turn on each reconnect (a SelectConnection
        # takes one node): a lost node costs one failed attempt, then the next one is tried.
        super().__init__(
            cluster_parameters(
                vhost, url=url, heartbeat=30, client_properties={"connection_name": name}
            ),
            f"{name}:{vhost}",
        )
        self.window = window
        self.confirm_timeout = confirm_timeout
        self.outcomes = deque()
        self.wakeup = wakeup or threading.Event()  # set whenever outcomes arrive
        self.submitted = 0  # caller thread
        self.taken = 0  # caller thread
        # Observability, read by the runner (ints/strings: racy reads are harmless).
        self.connected = False
        self.last_error = ""
        self.resent = 0
        # I/O thread only.
        self._by_origin = {}  # x-recovery-origin -> unconfirmed Entry
        # delay exchange -> (seconds, final exchange): declared before use (set by the caller)
        self._routes = {}
        self._declared = set()  # of those, declared on the current channel
        self._declaring = None  # the one being declared now
        self._route_failures = {}  # delay exchange -> channels the broker closed declaring it
        self._start()

    # ---- caller thread ----------------------------------------------------------------------

    @property
    def outstanding(self):
        """Entries submitted and not yet reported (queued, in flight or being resent)."""
        return self.submitted - self.taken

    def want_route(self, name, seconds, final_exchange):
        """Entries to the delay exchange ``name`` wait until it (and its TTL queue, dead-lettering
        to ``final_exchange`` after ``seconds``) is declared on the publishing channel."""
        # Set here, before the caller submits entries for it (a dict item is set atomically):
        # a drain already scheduled must not publish them ahead of the declaration.
        self._routes.setdefault(name, (seconds, final_exchange))

    def submit(self, entry):
        self.submitted += 1
        self._hand_to_loop(entry)

    def take_outcomes(self):
        taken = []
        outcomes = self.outcomes
        while outcomes:
            taken.append(outcomes.popleft())
        self.taken += len(taken)
        return taken

    def withdraw(self):
        """Report every entry not yet published as ``withdrawn`` (pause, cancel, shutdown)."""
        self._call_soon(self._withdraw)

    def close(self, timeout=10):
        self._call_soon(self._shutdown)
        self._thread.join(timeout)

    # ---- I/O thread: connection (the loop is ConnectionLoop's) ------------------------------

    def _cannot_connect(self, error):
        self.last_error = f"cannot connect: {error!r}"
        log.warning("replay publisher: %s", self.last_error)

    def _connection_lost(self, reason):
        self.connected = False
        if not self._stopping:
            self.last_error = f"connection lost: {reason!r}"
            log.info("replay publisher: %s", self.last_error)

    def _on_ready(self):
        self.connected = True
        self._declared.clear()  # a new channel, maybe on another node: declare again
        self._declaring = None
        self._drain()

    def _lost_channel(self, reason):
        """Unconfirmed publishes on a dead channel are published again, first in line."""
        lost = self._drop_channel()
        self._by_origin.clear()
        code = getattr(reason, "reply_code", None)
        text = getattr(reason, "reply_text", "") or ""
        if code is not None and code >= 400:
            self.last_error = f"channel closed by the broker: {code} {text}"
            log.warning("replay publisher: %s", self.last_error)
        declaring, self._declaring = self._declaring, None
        if declaring is not None and code is not None and code >= 400:
            failures = self._route_failures.get(declaring, 0) + 1
            self._route_failures[declaring] = failures
            if failures >= MAX_CHANNEL_FAILURES:
                self._fail_route(declaring, f"{code} {text}")
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
        self._cache.to_send.extendleft(reversed(retry))

    def _before_shutdown(self):
        self._withdraw()

    def _tick(self):
        if self._stopping:
            return
        self._ioloop.call_later(self.tick_s, self._tick)
        unconfirmed = self._cache.unconfirmed
        if not unconfirmed or self.blocked:
            return
        oldest = next(iter(unconfirmed.values()))
        if time.monotonic() - oldest.sent_at > self.confirm_timeout:
            # No confirm for too long: treat the connection as dead (what the seeds' RetryCache
            # does with its timer) so the unconfirmed publishes go out again on a fresh one.
            self.last_error = f"no confirm within {self.confirm_timeout:g}s; reconnecting"
            log.warning("replay publisher: %s", self.last_error)
            if self._connection is not None and self._connection.is_open:
                self._connection.close(320, "lazarus: confirm timeout")

    # ---- I/O thread: publishing and confirms ----------------------------------------------

    def _drain(self):
        if not self._ready or self._stopping:
            return
        resend, incoming, unconfirmed = self._cache.to_send, self._incoming, self._cache.unconfirmed
        channel, window, by_origin, sent = self._channel, self.window, self._by_origin, self._sent
        publish = channel.basic_publish
        now = time.monotonic()
        while len(unconfirmed) < window:
            if resend:
                entry = resend.popleft()
            elif incoming:
                entry = incoming.popleft()
            else:
                return
            if entry.exchange in self._routes and entry.exchange not in self._declared:
                (resend if entry.attempts else incoming).appendleft(entry)
                self._declare_route(entry.exchange)
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
            sent(entry)
            by_origin[entry.origin] = entry

    def _declare_route(self, name):
        """The final exchange (passively), then the exchange, TTL queue and binding of a delay
        route, one after another on this channel; publishing goes on when the binding is
        confirmed. A refusal closes the channel
        (``_lost_channel`` counts it against the route)."""
        if self._declaring is not None:
            return
        self._declaring = name
        seconds, final_exchange = self._routes[name]
        channel = self._channel

        def bound(_frame):
            self._declaring = None
            self._declared.add(name)
            self._drain()

        def queued(_frame):
            channel.queue_bind(name, name, callback=bound)

        def exchanged(_frame):
            arguments = delay_queue_arguments(seconds, final_exchange)
            channel.queue_declare(name, durable=True, arguments=arguments, callback=queued)

        def declare(_frame=None):
            channel.exchange_declare(name, "fanout", durable=True, callback=exchanged)

        if not final_exchange:
            declare()
            return
        # Only to an exchange that exists (a passive declare; a 404 closes the channel and
        # counts against the route): each made-up name would leave a quorum queue behind.
        channel.exchange_declare(final_exchange, passive=True, callback=declare)

    def _fail_route(self, name, reason):
        """Every entry waiting for the delay route ``name`` fails with the broker's reason."""
        detail = f"the delay route {name} could not be declared: {reason}"
        del self._routes[name]
        for queue in (self._cache.to_send, self._incoming):
            keep = [entry for entry in queue if entry.exchange != name]
            for entry in queue:
                if entry.exchange == name:
                    self._report(entry, "failed", detail)
            queue.clear()
            queue.extend(keep)

    def _on_return(self, _channel, method, properties, _body):
        origin = (properties.headers or {}).get("x-recovery-origin")
        entry = self._by_origin.get(origin)
        if entry is not None:
            entry.returned = f"returned by the broker: {method.reply_code} {method.reply_text}"

    def _confirmed(self, entries, acked):
        by_origin = self._by_origin
        for entry in entries:
            by_origin.pop(entry.origin, None)
            if not acked:
                self._report(entry, "nacked", "the broker nacked the publish")
            elif entry.returned is not None:
                self._report(entry, "returned", entry.returned)
            else:
                self.outcomes.append(Outcome(entry.key, "confirmed", ""))
        self.wakeup.set()
        if self._cache.to_send or self._incoming:
            self._drain()

    def _report(self, entry, outcome, detail, maybe_sent=False):
        self.outcomes.append(Outcome(entry.key, outcome, detail, maybe_sent))
        self.wakeup.set()

    def _withdraw(self):
        for queue in (self._cache.to_send, self._incoming):
            while queue:
                entry = queue.popleft()
                self._report(entry, "withdrawn", "", maybe_sent=entry.attempts > 0)
