"""Helpers for the collector tests: real broker, real database, real collector threads/workers.

Everything runs in this session's vhost (``test_vhost`` from tests/conftest.py) or in a second
private vhost created here; the shared services are never restarted except by the one test
marked ``disruptive``.
"""

import io
import urllib.parse

import pika
import pytest
from django.conf import settings
from django.core.management import call_command

from recovery.broker.management import Management
from recovery.models import Message
from tests.helpers import (
    WorkerProcess,
    declare_app_queue,  # noqa: F401 - the collector tests' import
    publish,  # noqa: F401 - the collector tests' import
    vhost_url,
    wait_for,
)


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
    """Wait until ``count`` rows match, then return them (oldest first)."""

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


@pytest.fixture
def worker_process(transactional_db, wired, clean_queues, tmp_path):
    """Factory for collector worker processes; every one started is stopped at the end."""
    started = []

    def make(vhosts=None, database_url_=None, **env):
        if database_url_:
            env["DATABASE_URL"] = database_url_
        worker = WorkerProcess.collector(
            tmp_path / f"worker{len(started)}.log", vhosts or [wired], **env
        )
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


@pytest.fixture
def second_vhost(wired):
    """A second private vhost, wired with ``manage.py wire --vhost``; deleted afterwards."""
    vhost = f"{wired}-b"
    management = Management()
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")
    try:
        out = io.StringIO()
        call_command("wire", "--vhost", vhost, stdout=out)
        assert f"vhost {vhost}: declared" in out.getvalue()
        assert "; policy lazarus-recovery-queues on the recovery queues" in out.getvalue()
        yield vhost
    finally:
        management.delete_vhost(vhost)


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
