"""Helpers the test packages share (each was defined three or four times before)."""

import itertools
import socket
import uuid

import pika
from django.utils import timezone

from recovery.models import Message

DLX_ARGS = {"x-dead-letter-exchange": "recovery.dlx"}


def declare_app_queue(channel, name, **arguments):
    """A fresh application queue that dead-letters to recovery.dlx (plus ``arguments``)."""
    channel.queue_delete(name)
    channel.queue_declare(name, durable=True, arguments={**DLX_ARGS, **arguments})


def publish(channel, queue, body, exchange="", **props):
    """One persistent message to ``queue`` (through ``exchange`` if given)."""
    props.setdefault("delivery_mode", 2)
    channel.basic_publish(exchange, queue, body, pika.BasicProperties(**props))


def drain(channel, queue):
    """Every message in ``queue`` now, acked: [(properties, body)]."""
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((properties, body))


_serial = itertools.count(1)


def make_message(**fields):
    """A stored message as the collector would have written it (defaults: a rejected order)."""
    n = next(_serial)
    body = fields.pop("body", f'{{"order": {n}}}'.encode())
    queue = fields.get("source_queue", "orders")
    reason = fields.get("reason", "rejected")
    defaults = {
        "kind": "dead_letter",
        "vhost": "/",
        "source_queue": queue,
        "source_exchange": "shop",
        "routing_keys": [queue],
        "reason": reason,
        "death_count": 1,
        "message_id": f"msg-{n}",
        "correlation_id": f"corr-{n}",
        "properties": {"delivery_mode": 2, "content_type": "application/json"},
        "headers": {},
        "body": body,
        "body_size": len(body),
        "content_type": "application/json",
        "fingerprint": uuid.uuid4().hex,
        "group_key": f"group-{queue}-{reason}",
        "group_label": f"{queue} · {reason}",
        "collected_at": timezone.now(),
    }
    defaults.update(fields)
    if "properties" not in fields:
        # As the collector stores them: the ids are properties too (a replay sends them).
        defaults["properties"] = {
            **defaults["properties"],
            "message_id": defaults["message_id"],
            "correlation_id": defaults["correlation_id"],
        }
    return Message.objects.create(**defaults)


def free_port():
    """A TCP port nobody listens on now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
