"""Collector helpers: real dead-letterings on the session's vhost and waiting for the rows."""

import time

import pika
from django.conf import settings

from recovery.models import Message
from tests.helpers import declare_app_queue, publish, vhost_url, wait_for


def open_channel(vhost=None):
    url = vhost_url(vhost) if vhost else settings.RABBITMQ_URL
    return pika.BlockingConnection(pika.URLParameters(url)).channel()


def reject_next(channel, queue, timeout=10):
    """Get one message from ``queue`` and reject it without requeue (a real dead-lettering)."""
    method, props, body = wait_for(
        lambda: (lambda r: r if r[0] else None)(channel.basic_get(queue)),
        timeout=timeout,
        message=f"a message on {queue}",
    )
    channel.basic_reject(method.delivery_tag, requeue=False)
    return props, body


def stored(count=1, timeout=30, **filters):
    """Wait until at least ``count`` messages match ``filters``, then return every match (oldest
    first). The one ``stored`` of the tests."""

    def rows():
        found = list(Message.objects.filter(**filters).order_by("id"))
        return found if len(found) >= count else None

    return wait_for(rows, timeout=timeout, message=f"{count} stored message(s) matching {filters}")


def depth(channel, queue):
    return channel.queue_declare(queue, passive=True).method.message_count


def drain_queue(channel, queue, timeout=10):
    """Every message currently in ``queue`` (auto-ack), as (method, properties, body)."""
    got = []
    deadline_empty = 0
    while deadline_empty < 5:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            deadline_empty += 1
            channel.connection.sleep(0.1)
            continue
        got.append((method, props, body))
    return got


def fill_quarantine(amqp, messages, limit):
    """Quarantine ``messages`` ({message_id: body over ``limit``}) for real: collector threads
    with that body limit take them from an application queue's dead letters and quarantine them."""
    from recovery.collector.consumer import start_collectors, stop_collectors

    stop_event, threads = start_collectors(flush_seconds=0.05, max_body_bytes=limit)
    try:
        declare_app_queue(amqp, "q.huge")
        for message_id, body in messages.items():
            publish(amqp, "q.huge", body, message_id=message_id, headers={"tenant": "acme"})
        for _ in messages:
            reject_next(amqp, "q.huge")
        wait_for(
            lambda: depth(amqp, "recovery.quarantine") == len(messages),
            message=f"{len(messages)} quarantined",
        )
    finally:
        stop_collectors(stop_event, threads)


def reject_all(channel, queue, expect):
    rejected = 0
    for _ in range(200):
        method, _props, _body = channel.basic_get(queue)
        if method is None:
            if rejected >= expect:
                return rejected
            channel.connection.sleep(0.05)
            continue
        channel.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
    return rejected


def receive(channel, queue, timeout=10):
    def get():
        method, props, body = channel.basic_get(queue, auto_ack=True)
        return (props, body) if method else None

    return wait_for(get, timeout=timeout, message=f"a message on {queue}")


def publish_and_reject(channel, queue, n):
    """Publish ``n`` messages to ``queue`` and reject each without requeue (n dead letters)."""
    for i in range(n):
        channel.basic_publish("", queue, f"{queue}-{i}".encode())
    got = 0
    while got < n:
        method, _, _ = channel.basic_get(queue)
        if method is None:
            time.sleep(0.05)
            continue
        channel.basic_reject(method.delivery_tag, requeue=False)
        got += 1


BODY = b"f" * 1024


def fill(vhost, queue, n, wait=True):
    """N real dead letters in recovery.dead_letters, message ids ``{queue}-{i}``; with ``wait``
    until they are all there (not while a collector drains them)."""
    channel = open_channel(vhost)
    channel.queue_delete(queue)
    channel.queue_declare(
        queue,
        durable=True,
        arguments={"x-dead-letter-exchange": "recovery.dlx", "x-message-ttl": 0},
    )
    for i in range(n):
        channel.basic_publish(
            "", queue, BODY, pika.BasicProperties(delivery_mode=2, message_id=f"{queue}-{i}")
        )
        if i % 10000 == 9999:
            channel.connection.process_data_events(0)
    if wait:
        wait_for(
            lambda: depth(channel, "recovery.dead_letters") >= n,
            timeout=120,
            message=f"{n} dead letters",
        )
    channel.connection.close()


def stored_count(queue):
    return Message.objects.filter(source_queue=queue).count()
