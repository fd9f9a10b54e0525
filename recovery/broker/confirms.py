"""A blocking, confirming publisher on one vhost: one message at a time, ``mandatory``.

The one-click replay (``recovery.replay.one.ConfirmingPublisher``) and the collector's quarantine
(``recovery.collector.writer.Quarantine``) publish rarely and must know each message was taken, so
both wait for the confirm of each publish on a ``BlockingConnection``. ``publish`` returns only once
the broker acked; otherwise it raises pika's error (``UnroutableError`` for a ``basic.return``,
``NackError``, ``ChannelClosedByBroker`` e.g. for a missing exchange, a connection error) and the
caller says what that means. Bulk replay has an asynchronous publisher of its own
(``recovery.replay.publisher``).
"""

import contextlib

import pika.exceptions

from recovery.broker.connection import connect
from recovery.broker.topology import QUORUM


class ConfirmingChannel:
    """Connected by ``open`` (or the context manager), or on first ``publish``, and again after a
    loss. ``declare_queue``: a durable quorum queue declared on each connection (publishing to
    it must not depend on someone else having declared it). ``overrides``: connection parameters
    (``recovery.broker.connection.connect``)."""

    def __init__(self, vhost, declare_queue=None, **overrides):
        self.vhost = vhost
        self.declare_queue = declare_queue
        self.overrides = overrides
        self.connection = self.channel = None

    @property
    def is_open(self):
        return self.channel is not None and self.channel.is_open

    def open(self):
        self.close()
        self.connection = connect(self.vhost, **self.overrides)
        self.channel = self.connection.channel()
        if self.declare_queue is not None:
            self.channel.queue_declare(self.declare_queue, durable=True, arguments=QUORUM)
        self.channel.confirm_delivery()
        return self

    def publish(self, exchange, routing_key, body, properties):
        """Publish and wait for the confirm; raises unless the broker acked it (see module doc)."""
        if not self.is_open:
            self.open()
        self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)

    def close(self):
        if self.connection is not None and self.connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                self.connection.close()
        self.connection = self.channel = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
