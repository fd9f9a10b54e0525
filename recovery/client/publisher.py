"""ReliablePublisher: publisher confirms, a bounded retry cache, and give-ups that reach Lazarus.

Why it is shaped like this:

* Confirms are asynchronous with a window (the seeds measured confirm-per-message at a fifth of
  async throughput). ``publish`` hands a message to a background I/O thread running a pika
  ``SelectConnection`` and returns; it blocks only while ``window`` messages are still owned.
* Nothing is dropped silently. A message is owned until the broker acks it, or until it has been
  handed to Lazarus: forwarded (with confirms) to the returns queue, or written to the
  ``recovery_outbox`` table when the broker itself cannot be reached. ``mandatory`` is set, so an
  unroutable message comes back as ``basic.return`` and is forwarded as ``returned``.
* A nack or a confirm timeout is retried up to ``max_attempts``; a connection lost mid-flight is
  retried on the next connection without limit until ``give_up_after`` seconds have passed since
  ``publish`` — force-closed connections are routine, an unreachable broker is not.
* A broker resource alarm (``connection.blocked``: disk or memory low) stops publishing, not
  owning. While ``blocked`` the publisher sends nothing more into the connection: what waits
  stays in the retry cache (and ``publish`` blocks once ``window`` messages are owned, which is
  the back-pressure the alarm asks for); what was already sent keeps waiting for its confirm
  with its timeout stopped (the broker holds confirms during an alarm, it does not lose them),
  and nothing is given up for time (the broker is reachable and will take the messages). It
  says so in the log, and resumes on ``connection.unblocked``. Publishing on into the blocked
  connection would only move the messages from the cache into socket buffers, where a
  connection closed during the alarm turns them into resends. Closed while still blocked, it
  hands everything it holds to the outbox (the returns queue is behind the same alarm) as
  ``unconfirmed``/``timeout``, detail ``BLOCKED_AT_CLOSE``: the timeouts that would have given
  them up are stopped, so without this they would vanish with the process.

Thread-safety: ``publish``, ``flush`` and ``close`` may be called from any number of threads. All
broker I/O, the retry cache, the audit log writes and the outbox writes happen on the one I/O
thread; the only state shared with callers is the hand-off deque and the owned-message count,
guarded by a Condition. ``properties`` passed to ``publish`` are copied, never mutated.
"""

import copy
import datetime
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence

import pika

from recovery.client.connection_loop import ConnectionLoop
from recovery.client.logs import ProducerLog
from recovery.client.outbox import Outbox, SendingStore
from recovery.client.retry_cache import Pending, RetryCache

log = logging.getLogger(__name__)

# Messages owned at once (sent-unconfirmed plus queued). Bigger keeps the pipe fuller on a slow
# link but raises memory and the duplicates a force-closed connection can cause (≤ window).
WINDOW = 1000
# How long an attempt may wait for its confirm before it is resent. Too short resends messages
# the broker is merely slow to fsync (duplicates); too long delays the give-up.
CONFIRM_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 3
# How often the I/O thread looks for timed-out attempts and flushes logs and outbox rows.
TICK_S = 0.2
# What close() waits beyond give_up_after for the last messages to be handed over.
CLOSE_GRACE_S = 5.0
BLOCKED_AT_CLOSE = "publisher closed while the broker was blocking it"
RETURNS_QUEUE_ARGUMENTS = {"x-queue-type": "quorum"}


class ReliablePublisher(ConnectionLoop):
    """Publish with confirms; every message ends acked or handed to Lazarus. See module doc.

    ``blocked`` is True while the broker blocks the connection (a resource alarm)."""

    tick_s = TICK_S
    _cache: RetryCache[Pending]

    def __init__(
        self,
        url: str | Sequence[str],
        producer,
        log_dir=None,
        window=WINDOW,
        confirm_timeout=CONFIRM_TIMEOUT_S,
        max_attempts=MAX_ATTEMPTS,
        returns_queue="recovery.returns",
        outbox_dsn=None,
        store_dsn=None,
        give_up_after=None,
        declare_returns_queue=True,
    ):
        self.producer = producer
        self.window = window
        self.confirm_timeout = confirm_timeout
        self.max_attempts = max_attempts
        self.returns_queue = returns_queue
        self.give_up_after = give_up_after or confirm_timeout * max_attempts
        self.declare_returns_queue = declare_returns_queue
        # A cluster: one URL per node, taken in turn on each reconnect.
        nodes = [pika.URLParameters(u) for u in ([url] if isinstance(url, str) else url)]
        if not nodes:
            raise ValueError("ReliablePublisher needs at least one broker URL")
        super().__init__(nodes, f"ReliablePublisher[{producer}]")
        self._log = ProducerLog(log_dir, producer)
        self._outbox = Outbox(outbox_dsn) if outbox_dsn else None
        self._store = SendingStore(store_dsn, producer) if store_dsn else None

        self._cond = threading.Condition()
        self._owned = 0  # messages accepted by publish() and not yet finished
        self._closed = False

        # I/O thread only from here on.
        self._outbox_rows: list[Pending] = []  # given up, waiting for the outbox write
        self._store_marks: dict[str, list[str]] = {"sent": [], "given_up": []}
        self._start()
        if self._store is not None:
            self._resend_unfinished()

    # ---- caller threads -------------------------------------------------------------------

    def publish(self, exchange, routing_key, body, properties=None, message_id=None):
        """Queue one message; returns its message_id. Blocks while ``window`` are owned."""
        if self._closed:
            raise RuntimeError("ReliablePublisher is closed")
        if isinstance(body, str):
            body = body.encode()
        if properties is None:
            properties = pika.BasicProperties(delivery_mode=2)
        else:
            properties = copy.copy(properties)
        message_id = message_id or properties.message_id or uuid.uuid4().hex
        properties.message_id = message_id
        entry = Pending(message_id, exchange, routing_key, bytes(body), properties, time.time())
        if self._store is not None:
            self._store.add(entry)
        self._hand_over(entry)
        return message_id

    def _hand_over(self, entry):
        with self._cond:
            while self._owned >= self.window:
                self._cond.wait()
            self._owned += 1
        self._hand_to_loop(entry)

    def _resend_unfinished(self):
        """Compensation sweep: what a crashed run of this producer left ``sending``."""
        assert self._store is not None, "called only with a durable store"
        for message_id, exchange, routing_key, props, body, first in list(self._store.unfinished()):
            self._hand_over(Pending(message_id, exchange, routing_key, body, props, first))

    def flush(self, timeout=None):
        """Wait until every message is acked or handed to Lazarus; False if timeout passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._owned == 0, timeout)

    @property
    def owned(self):
        """Messages not yet acked nor handed to Lazarus."""
        return self._owned

    def close(self, timeout=None):
        """Flush (up to give_up_after + grace, or ``timeout``), then stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        if not self.flush(timeout if timeout is not None else self.give_up_after + CLOSE_GRACE_S):
            if self.blocked:
                # Not an error yet: _before_shutdown hands them over and says how.
                log.warning(
                    "%s: closing while the broker blocks the connection, %d messages unconfirmed",
                    self.producer,
                    self._owned,
                )
            else:
                log.error(
                    "%s: closing with %d messages neither confirmed nor handed to Lazarus",
                    self.producer,
                    self._owned,
                )
        self._call_soon(self._shutdown)
        self._thread.join()
        self._log.close()
        if self._outbox is not None:
            self._outbox.close()
        if self._store is not None:
            self._store.close()

    # ---- I/O thread: connection (the loop is ConnectionLoop's) ----------------------------------

    def _cannot_connect(self, error):
        log.warning("%s: cannot connect: %s", self.producer, error)

    def _connection_lost(self, reason):
        log.info("%s: connection closed: %s", self.producer, reason)

    def _prepare_channel(self, channel, then):
        if self.declare_returns_queue:
            channel.queue_declare(
                self.returns_queue,
                durable=True,
                arguments=RETURNS_QUEUE_ARGUMENTS,
                callback=lambda _frame: then(),
            )
        else:
            then()

    def _lost_channel(self, reason):
        """Unconfirmed attempts on a dead channel go back to the front of the send queue."""
        lost = self._drop_channel()
        now = time.monotonic()
        for entry in lost:
            if not entry.forwarding:
                self._log_attempt(entry, "error", now)
        self._cache.to_send.extendleft(reversed(lost))
        code = getattr(reason, "reply_code", None)
        text = getattr(reason, "reply_text", "")
        if code == 404:
            # Publishing to a missing exchange closes the channel; such a message is unroutable
            # and retrying it would only close the next channel too.
            for entry in lost:
                if not entry.forwarding and f"'{entry.exchange}'" in text:
                    self._cache.to_send.remove(entry)
                    self._give_up(entry, "returned", "no_route", f"{code} {text}")
        return lost

    def _blocked_changed(self, reason):
        # The decision (see the module doc): while blocked, hold everything in the retry cache
        # and send nothing more; _drain resumes on unblock.
        if self.blocked:
            log.warning(
                "%s: the broker blocked the connection (%s): holding %d messages in the retry "
                "cache until it unblocks",
                self.producer,
                reason,
                self._owned,
            )
        else:
            log.info("%s: the broker unblocked the connection; publishing again", self.producer)

    def _before_shutdown(self):
        if self.blocked:
            self._give_up_held_while_blocked()
        try:
            self._write_bookkeeping()
        except Exception:
            log.exception("%s: final outbox/store write failed", self.producer)
            if self._outbox_rows:
                log.error(
                    "%s: %d given-up messages not written to the outbox, lost: %s",
                    self.producer,
                    len(self._outbox_rows),
                    [e.message_id for e in self._outbox_rows],
                )

    def _give_up_held_while_blocked(self):
        """Closing during an alarm: what is held was never given up (its clocks are stopped) and
        the returns queue is behind the same alarm, so it goes to the outbox now. An unconfirmed
        one the broker did take arrives twice; the collector's fingerprint dedups it."""
        now = time.monotonic()
        held = self._cache.drop_unconfirmed() + list(self._cache.to_send)
        self._cache.to_send.clear()
        while self._incoming:
            held.append(self._incoming.popleft())
        if not held:
            return
        for entry in held:
            if entry.forwarding:
                continue  # already given up; it keeps its own kind and reason
            if entry.attempts == 0:
                self._log_unsent(entry, now)
            else:
                self._log_attempt(entry, "error", now)
            entry.give_up = ("unconfirmed", "timeout", BLOCKED_AT_CLOSE)
        if self._outbox is not None:
            log.warning(
                "%s: %s: %d messages go to the outbox", self.producer, BLOCKED_AT_CLOSE, len(held)
            )
            self._outbox_rows.extend(held)
        elif self._store is not None:
            log.warning(
                "%s: %s: %d messages stay 'sending' in the store; the next start resends them",
                self.producer,
                BLOCKED_AT_CLOSE,
                len(held),
            )
        else:
            log.error(
                "%s: %s and there is no outbox_dsn nor store_dsn: %d messages dropped: %s",
                self.producer,
                BLOCKED_AT_CLOSE,
                len(held),
                [e.message_id for e in held],
            )

    # ---- I/O thread: sending and confirms ----------------------------------------------------

    def _drain(self):
        if not self._ready or self.blocked:
            return
        to_send, incoming = self._cache.to_send, self._incoming
        while self._ready and not self.blocked:
            if to_send:
                entry = to_send.popleft()
            elif incoming:
                entry = incoming.popleft()
            else:
                return
            self._send(entry)

    def _send(self, entry):
        if entry.forwarding:
            exchange, routing_key, props = "", self.returns_queue, self._forward_properties(entry)
        else:
            exchange, routing_key, props = entry.exchange, entry.routing_key, entry.properties
            entry.attempts += 1
        entry.sent_at = time.monotonic()
        entry.sent_ts_ms = int(time.time() * 1000)
        entry.returned = None
        try:
            self._channel.basic_publish(exchange, routing_key, entry.body, props, mandatory=True)
        except Exception as exc:  # channel or connection closing under us
            log.info("%s: publish failed, will resend: %s", self.producer, exc)
            if not entry.forwarding:
                entry.attempts -= 1
            self._cache.to_send.appendleft(entry)
            self._ready = False
            return
        self._sent(entry)

    def _forward_properties(self, entry):
        kind, reason, detail = entry.give_up
        props = copy.copy(entry.properties)
        headers = dict(props.headers or {})
        headers.update(
            {
                "x-recovery-kind": kind,
                "x-recovery-reason": reason,
                "x-recovery-exchange": entry.exchange,
                "x-recovery-routing-key": entry.routing_key,
                "x-recovery-attempts": entry.attempts,
                "x-recovery-first-attempt-at": datetime.datetime.fromtimestamp(
                    entry.first_attempt_at, tz=datetime.UTC
                ).replace(tzinfo=None),
                "x-recovery-producer": self.producer,
            }
        )
        if detail:
            headers["x-recovery-detail"] = detail
        props.headers = headers
        props.delivery_mode = 2  # Lazarus must not lose what it is handed
        return props

    def _on_return(self, _channel, method, properties, _body):
        message_id = properties.message_id
        entry = self._cache.find_unconfirmed(
            lambda e: e.message_id == message_id and e.returned is None
        )
        if entry is not None:
            entry.returned = f"{method.reply_code} {method.reply_text}"

    def _confirmed(self, entries, acked):
        now = time.monotonic()
        finished = []
        for entry in entries:
            if entry.forwarding:
                if acked and entry.returned is None:
                    finished.append(entry)
                else:
                    self._forward_failed(entry)
            elif entry.returned is not None:
                self._log_attempt(entry, "returned", now)
                self._give_up(entry, "returned", "no_route", entry.returned)
            elif acked:
                self._log_attempt(entry, "ack", now)
                finished.append(entry)
            else:
                self._log_attempt(entry, "nack", now)
                self._failed(entry, "nacked", "nack")
        self._finish(finished, "sent")
        if self._cache.to_send:
            self._drain()

    def _log_attempt(self, entry, outcome, now):
        confirm_ms = round((now - entry.sent_at) * 1000, 3) if entry.sent_at else None
        self._log.attempt(
            entry.sent_ts_ms,
            entry.message_id,
            entry.exchange,
            entry.routing_key,
            entry.attempts,
            outcome,
            confirm_ms,
            len(entry.body),
        )

    def _failed(self, entry, kind, reason):
        """A nack or a timeout: resend, or give up after max_attempts."""
        entry.failures += 1
        if entry.failures >= self.max_attempts:
            self._give_up(entry, kind, reason, None)
        else:
            self._cache.to_send.append(entry)

    def _give_up(self, entry, kind, reason, detail):
        entry.give_up = (kind, reason, detail)
        if self._ready:
            self._cache.to_send.append(entry)
        elif self._outbox is not None:
            self._outbox_rows.append(entry)
        else:
            self._cache.to_send.append(entry)  # forwarded once a connection is back

    def _forward_failed(self, entry):
        if self._outbox is not None:
            self._outbox_rows.append(entry)
        else:
            self._cache.to_send.append(entry)

    def _finish(self, entries, status):
        if not entries:
            return
        if self._store is not None:
            self._store_marks[status].extend(e.message_id for e in entries)
        with self._cond:
            self._owned -= len(entries)
            self._cond.notify_all()

    # ---- I/O thread: periodic work -----------------------------------------------------------

    def _tick(self):
        try:
            self._check_timeouts()
            self._write_bookkeeping()
            self._log.flush_if_due()
            if self._ready and (self._cache.to_send or self._incoming):
                self._drain()
        except Exception:
            log.exception("%s: periodic work failed; retrying next tick", self.producer)
        self._ioloop.call_later(self.tick_s, self._tick)

    def _check_timeouts(self):
        now = time.monotonic()
        if self.blocked:
            return  # confirms are held, not lost; nothing is given up while the broker is there
        for entry in self._cache.expired(now, self.confirm_timeout):
            if entry.forwarding:
                self._forward_failed(entry)
            else:
                self._log_attempt(entry, "timeout", now)
                self._failed(entry, "unconfirmed", "timeout")
        if self._ready:
            return
        # No connection: what has waited past give_up_after is handed to Lazarus now.
        while self._incoming:
            self._cache.to_send.append(self._incoming.popleft())
        deadline = time.time() - self.give_up_after
        keep: deque[Pending] = deque()
        for entry in self._cache.to_send:
            if entry.forwarding or entry.first_attempt_at > deadline:
                keep.append(entry)
                continue
            if entry.attempts == 0:
                self._log_unsent(entry, now)
            entry.give_up = ("unconfirmed", "timeout", "broker unreachable")
            if self._outbox is not None:
                self._outbox_rows.append(entry)
            else:
                keep.append(entry)
        self._cache.to_send = keep

    def _log_unsent(self, entry, now):
        # Never reached the wire: the log still gets its one (failed) attempt so the audit
        # knows the message existed.
        entry.attempts = 1
        entry.sent_ts_ms = int(time.time() * 1000)
        entry.sent_at = 0.0
        self._log_attempt(entry, "error", now)

    def _write_bookkeeping(self):
        self._write_outbox()
        if self._store is not None:
            for status, ids in self._store_marks.items():
                self._store.mark(ids, status)
                ids.clear()

    def _write_outbox(self):
        if not self._outbox_rows:
            return
        assert self._outbox is not None, "rows are queued only when there is an outbox"
        rows = self._outbox_rows
        self._outbox_rows = []
        try:
            self._outbox.write(
                self.producer,
                [(e, self._forward_properties(e).headers, *(e.give_up or ())[:2]) for e in rows],
            )
        except Exception:
            self._outbox_rows = rows + self._outbox_rows
            raise
        self._finish(rows, "given_up")
