"""The quarantine queue seen from the console: what the collector could not store, looked at
without taking it, and sent back to be collected again or discarded one at a time.

The collector puts a delivery it cannot turn into a row (a body over COLLECTOR_MAX_BODY_BYTES,
a header table it cannot decode, a row PostgreSQL refuses) in ``recovery.quarantine`` of its
vhost, unchanged, with ``x-quarantine-reason``, ``-source`` and ``-vhost`` headers
(recovery.collector.writer.Quarantine). Those messages are nowhere else: they live in the
broker, not in the store, so the console reads them from the queue.

A broker queue has no "peek": ``browse`` takes the first ``limit`` messages with basic.get, then
gives them all back (nack with requeue; RabbitMQ puts them back in their place). A message is
named by ``key``, a hash of its headers and body; ``retry`` and ``discard`` take messages until
they meet that key, act on that one only and give the rest back. ``retry`` publishes it, with
publisher confirms, to the recovery queue it came from (without the x-quarantine-* headers), so
the collector tries again (after COLLECTOR_MAX_BODY_BYTES was raised, or a fix deployed), and
acks the quarantined copy only once the broker confirmed the new one: it is never in neither.
"""

import dataclasses
import hashlib
import json
import time

import pika
from django.conf import settings

from recovery.broker.confirms import ConfirmingChannel
from recovery.broker.connection import connect
from recovery.client import headers as header_codec
from recovery.dead_letters import DELIVERY_SCOPED_HEADERS

QUARANTINE_HEADERS = ("x-quarantine-reason", "x-quarantine-source", "x-quarantine-vhost")
PREVIEW_BYTES = 4096
# How many messages a look or an action goes through; the page says when the queue holds more.
BROWSE_LIMIT = 200


@dataclasses.dataclass
class Quarantined:
    key: str
    position: int
    reason: str
    source: str
    size: int
    properties: dict
    headers: dict
    preview: bytes
    redelivered: bool

    @property
    def preview_text(self):
        return self.preview.decode("utf-8", "replace")


class NotInQuarantine(LookupError):
    """The message is no longer among the first BROWSE_LIMIT (someone else took it)."""


def message_key(properties, body):
    """Names a message across looks: its headers (but the broker's per-delivery counters, which
    change each time it is given back) and its body."""
    headers = {
        k: v
        for k, v in header_codec.headers_to_json(properties.headers or {}).items()
        if k not in DELIVERY_SCOPED_HEADERS
    }
    digest = hashlib.sha256(json.dumps(headers, sort_keys=True, default=str).encode())
    digest.update(bytes(body))
    return digest.hexdigest()[:24]


def _describe(position, method, properties, body):
    headers = header_codec.headers_to_json(properties.headers or {})
    props = {
        name: value
        for name, value in vars(properties).items()
        if name != "headers" and value is not None
    }
    return Quarantined(
        key=message_key(properties, body),
        position=position,
        reason=str(headers.get("x-quarantine-reason", "")),
        source=str(headers.get("x-quarantine-source", "")),
        size=len(body),
        properties=props,
        headers=headers,
        preview=bytes(body[:PREVIEW_BYTES]),
        redelivered=method.redelivered,
    )


def _taking(vhost, visit, limit=BROWSE_LIMIT):
    """basic.get up to ``limit`` messages, calling ``visit(channel, position, method, properties,
    body)`` for each until it returns True (it acked that one); every other message is given
    back. Returns (what visit returned last, how many were looked at, queue depth before)."""
    connection = connect(vhost)
    try:
        channel = connection.channel()
        queue = settings.RECOVERY_QUARANTINE_QUEUE
        depth = channel.queue_declare(queue, passive=True).method.message_count
        seen = 0
        done = False
        for position in range(1, limit + 1):
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            seen = position
            if visit(channel, position, method, properties, body):
                done = True
                break
        if seen:
            channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            _until_requeued(channel, queue, depth - (1 if done else 0))
        return done, seen, depth
    finally:
        if connection.is_open:
            connection.close()


def _until_requeued(channel, queue, expected, timeout=2.0):
    """Return once the given-back messages are ready again (the queue's depth is back to
    ``expected``), at most ``timeout`` seconds. A nack has no reply and the broker requeues
    after it: without this, a second look right after the first (a refresh, the next request)
    could find the queue empty for a moment and show an empty quarantine."""
    deadline = time.monotonic() + timeout
    while channel.queue_declare(queue, passive=True).method.message_count < expected:
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def browse(vhost, limit=BROWSE_LIMIT):
    """(the first ``limit`` quarantined messages, the queue's depth); nothing is taken."""
    found = []

    def visit(_channel, position, method, properties, body):
        found.append(_describe(position, method, properties, body))
        return False

    _done, _seen, depth = _taking(vhost, visit, limit)
    return found, depth


def _act(vhost, key, act):
    acted = []

    def visit(channel, position, method, properties, body):
        if message_key(properties, body) != key:
            return False
        item = _describe(position, method, properties, body)
        act(item, properties, body)
        # Acked alone (multiple=False): the others before it are given back after the loop.
        channel.basic_ack(method.delivery_tag)
        acted.append(item)
        return True

    done, _seen, _depth = _taking(vhost, visit)
    if not done:
        raise NotInQuarantine(
            f"message {key} is no longer in the first {BROWSE_LIMIT} of quarantine"
        )
    return acted[0]


def retry(vhost, key):
    """Send the message back to the recovery queue it came from; returns it (Quarantined)."""

    def republish(item, properties, body):
        if not item.source:
            raise NotInQuarantine("it does not say which recovery queue it came from")
        headers = {
            k: v for k, v in (properties.headers or {}).items() if k not in QUARANTINE_HEADERS
        }
        again = pika.BasicProperties(**{**vars(properties), "headers": headers})
        with ConfirmingChannel(vhost) as confirming:
            confirming.publish("", item.source, body, again)

    return _act(vhost, key, republish)


def discard(vhost, key):
    """Take the message out of quarantine for good; returns it (Quarantined)."""
    return _act(vhost, key, lambda item, properties, body: None)
