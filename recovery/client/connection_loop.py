"""The confirming publisher loop: one pika ``SelectConnection`` on an I/O thread of its own.

``ReliablePublisher`` (this library) and Lazarus's bulk replay publisher are both built on it; they
differ in what they do with an outcome, not in how they keep a connection. The loop:

* connects to the nodes of a cluster in turn, and reconnects after a loss with a back-off that is
  fast at first (force-closed connections come back at once) and capped (an unreachable broker is
  not hammered);
* opens a channel, lets the subclass prepare it (``_prepare_channel``), turns on publisher confirms
  and then drains what waits;
* keeps what is sent and unconfirmed in a ``RetryCache`` by delivery tag; an ack or nack, single or
  ``multiple``, pops what it covers there (``_on_confirm``) and hands it to ``_confirmed``; a lost
  channel hands its unconfirmed entries to ``_lost_channel``, which decides what is sent again;
* follows ``connection.blocked`` / ``connection.unblocked`` (a broker resource alarm) in
  ``blocked``: while blocked, confirms are late, not lost, so timeouts must not count; on unblock
  the clocks of the unconfirmed attempts start again. Whether to go on publishing into a blocked
  connection is the subclass's decision (``_drain``);
* takes entries from caller threads through a deque with one wake-up per burst (``_hand_to_loop``).

Everything except ``_hand_to_loop`` and ``_call_soon`` runs on the I/O thread.
"""

import abc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pika
from pika.adapters.select_connection import IOLoop
from pika.spec import Basic

from recovery.client.retry_cache import RetryCache

log = logging.getLogger(__name__)

# Reconnect back-off: fast first retry (force-closed connections come back at once), capped so an
# unreachable broker is not hammered.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0


class ConnectionLoop(abc.ABC):
    """Connect, reconnect, confirm and drain on one I/O thread; subclasses say what to publish.

    Subclasses implement ``_drain`` (publish what waits, while ``_ready``), ``_confirmed(entries,
    acked)``, ``_on_return`` and ``_tick`` (called every ``tick_s`` seconds); they may override
    the hooks below, and call ``_start()`` at the end of their ``__init__``.
    """

    tick_s = 0.2

    def __init__(self, nodes: Sequence[pika.connection.Parameters], thread_name: str):
        self._nodes = list(nodes)
        if not self._nodes:
            raise ValueError("a connection loop needs at least one broker node")
        self._node = 0
        self.connections = 0  # connections opened (more than one: it reconnected or failed over)
        self.blocked = False  # the broker blocked the connection (a resource alarm)
        self._incoming: deque[Any] = deque()  # caller threads -> I/O thread
        self._wakeup_scheduled = False
        # I/O thread only from here on.
        self._cache: RetryCache[Any] = RetryCache()
        self._ioloop = IOLoop()
        self._connection: pika.SelectConnection | None = None
        self._channel: Any = None  # the open pika channel
        self._ready = False  # a confirming channel is open
        self._next_tag = 0
        self._stopping = False
        self._backoff = RECONNECT_MIN_S
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def _start(self):
        self._thread.start()

    # ---- caller threads -------------------------------------------------------------------

    def _hand_to_loop(self, entry):
        self._incoming.append(entry)
        # One wake-up per burst, not per entry: the I/O thread clears the flag before it drains,
        # so an entry appended after that drain always schedules a new one.
        if not self._wakeup_scheduled:
            self._wakeup_scheduled = True
            self._ioloop.add_callback_threadsafe(self._wake)

    def _call_soon(self, callback: Callable[[], None]):
        self._ioloop.add_callback_threadsafe(callback)

    # ---- I/O thread: what subclasses provide ------------------------------------------------

    @abc.abstractmethod
    def _drain(self):
        """Provided by each subclass (see the class docstring)."""

    @abc.abstractmethod
    def _confirmed(self, entries, acked):
        """Provided by each subclass (see the class docstring)."""

    @abc.abstractmethod
    def _on_return(self, channel, method, properties, body):
        """Provided by each subclass (see the class docstring)."""

    @abc.abstractmethod
    def _tick(self):
        """Provided by each subclass (see the class docstring)."""

    def _prepare_channel(self, channel, then: Callable[[], None]):
        """Declare what the channel needs before confirms are turned on, then call ``then``."""
        then()

    def _cannot_connect(self, error):
        log.warning("cannot connect: %s", error)

    def _connection_lost(self, reason):
        log.info("connection closed: %s", reason)

    def _lost_channel(self, reason):
        """The channel is gone (``reason``: its close frame, None with the connection): its
        unconfirmed entries go back to the front of the send queue, in order."""
        lost = self._drop_channel()
        self._cache.to_send.extendleft(reversed(lost))
        return lost

    def _on_ready(self):
        """A confirming channel is open."""
        self._drain()

    def _blocked_changed(self, reason):  # noqa: B027 - an optional hook, empty by default
        """Called after ``blocked`` changed (``reason``: the broker's, on blocking)."""

    def _before_shutdown(self):  # noqa: B027 - an optional hook, empty by default
        """Last work on the I/O thread before the connection closes."""

    # ---- I/O thread: connection -------------------------------------------------------------

    def _run(self):
        self._connect()
        self._ioloop.call_later(self.tick_s, self._tick)
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
        self._node += 1  # a cluster: the next node on each reconnect
        self._ioloop.call_later(self._backoff, self._connect)
        self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)

    def _on_open(self, connection):
        self.connections += 1
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        connection.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, _connection, error):
        self._cannot_connect(error)
        self._reconnect_later()

    def _on_connection_closed(self, _connection, reason):
        # A new connection starts unblocked; if the alarm is still on, the broker blocks it again
        # on its first publish and says so.
        self.blocked = False
        self._connection_lost(reason)
        self._lost_channel(None)
        self._reconnect_later()

    def _on_channel(self, channel):
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        self._prepare_channel(channel, lambda: self._start_confirms(channel))

    def _start_confirms(self, channel):
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._channel_ready())

    def _channel_ready(self):
        self._next_tag = 0
        self._ready = True
        self._backoff = RECONNECT_MIN_S
        self._on_ready()

    def _on_channel_closed(self, channel, reason):
        if channel is not self._channel:
            return
        self._lost_channel(reason)
        connection = self._connection
        if connection is not None and connection.is_open and not self._stopping:
            connection.channel(on_open_callback=self._on_channel)

    def _drop_channel(self):
        """Not ready any more; returns the unconfirmed entries (their tags mean nothing now)."""
        self._ready = False
        self._channel = None
        return self._cache.drop_unconfirmed()

    def _on_blocked(self, _connection, frame):
        self.blocked = True
        self._blocked_changed(getattr(frame.method, "reason", "") or "resource alarm")

    def _on_unblocked(self, _connection, _frame):
        self.blocked = False
        # The broker held the confirms, it did not lose them: their clocks start again now.
        now = time.monotonic()
        for entry in self._cache.unconfirmed.values():
            entry.sent_at = now
        self._blocked_changed(None)
        self._drain()

    def _shutdown(self):
        self._stopping = True
        self._before_shutdown()
        connection = self._connection
        if connection is not None and connection.is_open:
            connection.close()  # its close callback stops the loop
        elif connection is not None and connection.is_closing:
            pass  # the same, already under way
        else:
            self._ioloop.stop()

    # ---- I/O thread: sending and confirms ---------------------------------------------------

    def _wake(self):
        self._wakeup_scheduled = False
        self._drain()

    def _sent(self, entry):
        """Record a publish that just went on the channel under the next delivery tag."""
        self._next_tag += 1
        self._cache.sent(self._next_tag, entry)

    def _on_confirm(self, frame):
        method = frame.method
        self._confirmed(
            self._cache.confirmed(method.delivery_tag, method.multiple),
            isinstance(method, Basic.Ack),
        )
