"""Helpers the test packages share: plain functions and classes tests import. pytest fixtures
and hooks stay in the conftest.py files, which import what they need from here; no test module
imports another test module or a conftest (tests/test_test_layout.py). The broker, store, user
and process helpers every domain uses are here; one module each for a domain's own (collector,
replay, api, bodies, client, spark, alerts, audit, teams)."""

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid

import pika
from django.conf import settings
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


def wait_for(predicate, timeout=15.0, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def database_url():
    """The URL of this session's test database (for processes a test starts)."""
    from django.db import connection

    db = connection.settings_dict
    return f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def vhost_url(vhost):
    """RABBITMQ_URL with another vhost."""
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    return base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()


def point_celery_at(url):
    """Send this process's Celery tasks to ``url`` (dropping pools made for another URL)."""
    from console.celery import app

    app.conf.broker_url = url
    app._pool = None  # not closed: kombu's shared producer pools may still hold it
    app.amqp._producer_pool = None


def make_user(username, role):
    from django.contrib.auth import get_user_model

    from recovery.models import set_role

    user = get_user_model().objects.create_user(username, password="pw-" + username)
    if role:
        set_role(user, role)
    return user


def token_for(user):
    from recovery.models import ApiToken

    return ApiToken.issue(user)[1]


def worker_env(**extra):
    """The environment of a real worker process on this session's database and vhost."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "RABBITMQ_URL": settings.RABBITMQ_URL,
        "CELERY_BROKER_URL": settings.RABBITMQ_URL,
        "COLLECTOR_FLUSH_SECONDS": "0.05",
        **extra,
    }


def stop_process(process, timeout=30):
    """SIGTERM (a graceful stop: a worker's shutdown code runs), then SIGKILL after ``timeout``
    seconds; waits for the exit either way. Nothing to do for a process that already exited."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class WorkerProcess:
    """A real ``celery -A console <args>`` process (a worker, or beat) on this session's vhost and
    test database, its output in ``log_path``. ``env`` adds to (or overrides) ``worker_env()``;
    ``prefix`` runs the command under another one (``unshare ...``)."""

    def __init__(self, log_path, args, prefix=(), stop_timeout=30, **env):
        self.log_path = log_path
        self.args = list(args)
        self.prefix = list(prefix)
        self.stop_timeout = stop_timeout
        self.env = worker_env(**{k: str(v) for k, v in env.items()})
        self.process = None
        self.starts = 0

    @classmethod
    def collector(cls, log_path, vhosts=None, **env):
        """A ``celery worker --collector`` (solo pool) draining ``vhosts`` (default: the
        session's); its task queue is private, so it runs no task another test sends."""
        vhosts = vhosts or settings.RECOVERY_VHOSTS
        args = ["worker", "--collector", "--pool", "solo", "-l", "warning"]
        args += ["-Q", f"lazarus.tasks.{os.getpid()}"]
        return cls(log_path, args, RECOVERY_VHOSTS=",".join(vhosts), **env)

    @classmethod
    def tasks(cls, log_path, beat=False, **env):
        """A worker for the task queues (threads pool, no collector), or ``celery beat``."""
        if beat:
            args = ["beat", "-s", str(log_path.with_suffix(".schedule")), "-l", "info"]
        else:
            args = ["worker", "--no-collector", "-P", "threads", "-c", "2", "-l", "info"]
            args += ["-Q", f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.REPLAY_TASK_QUEUE}"]
            args += ["-n", f"{log_path.stem}-{os.getpid()}@%h"]
        env = {
            "RECOVERY_VHOSTS": settings.RECOVERY_VHOSTS[0],
            "COLLECTOR_ENABLED": "false",
            "LOG_LEVEL": "INFO",
            **env,
        }
        return cls(log_path, args, stop_timeout=60, **env)

    def start(self):
        self.starts += 1
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "celery", "-A", "console", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self):
        """kill -9: no shutdown code runs, unacked deliveries go back to the queue."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self):
        """SIGTERM (Celery's warm shutdown), SIGKILL if it has not exited in time."""
        stop_process(self.process, timeout=self.stop_timeout)

    def alive(self):
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self):
        return self.process.returncode

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]
