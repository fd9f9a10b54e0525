"""Replay helpers: stored messages written like the collector writes them, consumers that count
(or reject) what arrives, draining queues, and running a job here or in a thread."""

import datetime
import itertools
import threading
from collections import Counter

import pika
import psycopg
from django.conf import settings
from django.db import connections

from recovery.collector.insert import store_rows
from recovery.collector.rows import delivery_to_row
from recovery.db import database_conninfo
from recovery.models import Message

_ids = itertools.count(1)


def dead_letter_row(queue, body=b"payload", message_id=None, headers=None, vhost=None, **props):
    """The row the collector stores for a message rejected from ``queue``."""
    headers = dict(headers or {})
    headers["x-death"] = [
        {
            "count": 1,
            "reason": "rejected",
            "queue": queue,
            "time": datetime.datetime.now(datetime.UTC),
            "exchange": "",
            "routing-keys": [queue],
        }
    ]
    message_id = message_id or f"m-{next(_ids)}"
    properties = pika.BasicProperties(
        message_id=message_id, headers=headers, delivery_mode=2, **props
    )
    vhost = vhost or settings.RECOVERY_VHOSTS[0]
    return delivery_to_row(vhost, "recovery.dead_letters", "recovery.dlx", queue, properties, body)


def unroutable_row(exchange, routing_key, body=b"payload", message_id=None):
    properties = pika.BasicProperties(message_id=message_id or f"u-{next(_ids)}", delivery_mode=2)
    vhost = settings.RECOVERY_VHOSTS[0]
    return delivery_to_row(vhost, "recovery.unrouted", exchange, routing_key, properties, body)


def store(rows):
    """Store rows exactly as the collector does (COPY + ON CONFLICT); the Messages, by id."""
    with psycopg.connect(database_conninfo()) as pg:
        for start in range(0, len(rows), 5000):
            store_rows(pg, rows[start : start + 5000])
    fingerprints = [row.fingerprint for row in rows]
    found = {}
    for start in range(0, len(fingerprints), 10000):
        chunk = fingerprints[start : start + 10000]
        # (No in_bulk: the fingerprint is unique only with its death time, FINGERPRINT_KEY.)
        found.update(
            (message.fingerprint, message)
            for message in Message.objects.filter(fingerprint__in=chunk).defer("body")
        )
    return [found[f] for f in fingerprints]


def dead_letters(queue, count, body=b"payload", **kwargs):
    return store([dead_letter_row(queue, body, **kwargs) for _ in range(count)])


def populated(queue, count, operator, runner="runner-a"):
    """A job over ``count`` new dead letters of ``queue``, leased and snapshot by ``runner``:
    (job, its JobStore, the messages)."""
    from recovery.replay.job_store import JobStore
    from recovery.replay.jobs import create_job
    from recovery.replay.selection import selection_sql

    messages = dead_letters(queue, count)
    job = create_job(operator, filters={"queue": queue})
    store = JobStore(job.pk, runner)
    assert store.acquire(str(job.token), 30)
    job.refresh_from_db()
    assert store.populate(*selection_sql(job), 0) == count
    return job, store, messages


def consume_until_idle(queue, idle=0.5):
    """Every message on ``queue`` until none comes for ``idle`` seconds: [(properties, body)],
    acked (on a connection of its own)."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=idle):
        if method is None:
            break
        got.append((properties, body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    connection.close()
    return got


def queue_depth(queue):
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


class Consumer(threading.Thread):
    """Consumes a queue in the background; counts message ids, and acks or rejects (to the DLX)
    according to ``reject`` (a bool, changeable while it runs)."""

    def __init__(self, queue, reject=False, url=None):
        super().__init__(daemon=True)
        self.queue = queue
        self.reject = reject
        self.url = url or settings.RABBITMQ_URL
        self.seen = Counter()
        self.stopping = threading.Event()
        self.ready = threading.Event()

    def run(self):
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        self.ready.set()
        for method, properties, _body in channel.consume(self.queue, inactivity_timeout=0.1):
            if self.stopping.is_set():
                break
            if method is None:
                continue
            self.seen[properties.message_id] += 1
            if self.reject:
                channel.basic_reject(method.delivery_tag, requeue=False)
            else:
                channel.basic_ack(method.delivery_tag)
        channel.cancel()
        connection.close()

    def stop(self):
        self.stopping.set()
        self.join(10)

    @property
    def total(self):
        return sum(self.seen.values())


def run(job, **kwargs):
    """Run a job in this thread until it ends or stops; its outcome (job is refreshed)."""
    from recovery.replay.runner import JobRunner

    job.refresh_from_db()
    outcome = JobRunner(job.pk, job.token, **kwargs).run()
    job.refresh_from_db()
    return outcome


def run_in_thread(job, outcome, **kwargs):
    """Run the job in a thread (as a worker would); its outcome lands in outcome["r"]."""

    def target():
        try:
            outcome["r"] = run(job, **kwargs)
        finally:
            connections.close_all()  # this thread's own Django connection

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def purge_tasks():
    """Task messages earlier tests sent (their jobs are gone) would only slow a worker down."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    for queue in (settings.CELERY_TASK_DEFAULT_QUEUE, settings.REPLAY_TASK_QUEUE):
        channel.queue_declare(queue, durable=True)
        channel.queue_purge(queue)
    connection.close()
