"""Helpers the test packages share (each was defined three or four times before)."""

import pika

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
