"""Shared fixtures: a private RabbitMQ vhost per test session, real PostgreSQL, personas.

Each session gets its own vhost (``lazarus-test-<pid>``) so test runs never see each other's
messages; PostgreSQL isolation comes from pytest-django's test database (DATABASE_URL names it).
"""

import os
import signal
import subprocess
import time
import urllib.parse

import pika
import pytest
from django.conf import settings

from recovery.broker.management import Management


def pytest_addoption(parser):
    parser.addoption(
        "--run-disruptive",
        action="store_true",
        help="also run the tests marked disruptive (they restart the shared PostgreSQL/RabbitMQ)",
    )


def pytest_collection_modifyitems(config, items):
    """A plain ``pytest`` never restarts a shared service in the middle of a suite: disruptive
    tests run only with ``--run-disruptive`` (``make test`` runs them in a session of their own,
    after the rest). ``-m disruptive`` alone selects them but still skips them."""
    if config.getoption("--run-disruptive"):
        return
    skip = pytest.mark.skip(
        reason="restarts a shared service; run alone with --run-disruptive -m disruptive"
    )
    for item in items:
        if "disruptive" in item.keywords:
            item.add_marker(skip)


def wait_for(predicate, timeout=15.0, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


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


@pytest.fixture
def celery_on_test_vhost(test_vhost):
    """Jobs enqueue a Celery task when created (and resumed): send it to this session's vhost,
    where no worker of another session can pick it up."""
    from console.celery import app

    original = app.conf.broker_url
    point_celery_at(settings.RABBITMQ_URL)
    yield
    point_celery_at(original)


@pytest.fixture(scope="session")
def test_vhost():
    vhost = f"lazarus-test-{os.getpid()}"
    management = Management()
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    original = (settings.RABBITMQ_URL, settings.RECOVERY_VHOSTS)
    settings.RABBITMQ_URL = base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()
    settings.RECOVERY_VHOSTS = [vhost]
    yield vhost
    settings.RABBITMQ_URL, settings.RECOVERY_VHOSTS = original
    management.delete_vhost(vhost)


@pytest.fixture(scope="session")
def wired(test_vhost):
    from recovery.broker.topology import wire

    wire(test_vhost)
    return test_vhost


@pytest.fixture
def amqp(wired):
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    yield connection.channel()
    if connection.is_open:
        connection.close()


@pytest.fixture
def clean_queues(wired):
    """Empty the recovery queues before a test (a previous test may have left messages)."""
    from recovery.broker.topology import Names

    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    names = Names.from_settings()
    for queue in (*names.source_queues, names.quarantine):
        channel.queue_purge(queue)
    connection.close()


@pytest.fixture
def collector(transactional_db, wired, clean_queues):
    """The real collector threads, draining this session's vhost into the test database."""
    from recovery.collector.consumer import start_collectors, stop_collectors

    stop_event, threads = start_collectors(flush_seconds=0.05)
    yield threads
    stop_collectors(stop_event, threads)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """PBKDF2's real cost (about a second per user) adds nothing to these tests."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_user(username, role):
    from django.contrib.auth import get_user_model

    from recovery.models import set_role

    user = get_user_model().objects.create_user(username, password="pw-" + username)
    if role:
        set_role(user, role)
    return user


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(db):
    return make_user("ada", "admin")


def token_for(user):
    from recovery.models import ApiToken

    return ApiToken.issue(user)[1]


@pytest.fixture
def api(client):
    """A Django test client that sends a token: ``api.as_user(user).post(...)``."""

    class Api:
        def as_user(self, user):
            self.headers = {"HTTP_AUTHORIZATION": f"Token {token_for(user)}"}
            return self

        def get(self, path, **params):
            return client.get(path, params, **self.headers)

        def post(self, path, data=None):
            return client.post(path, data or {}, content_type="application/json", **self.headers)

    return Api()
