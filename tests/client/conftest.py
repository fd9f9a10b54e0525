"""Fixtures for the client library tests: a private vhost and a private PostgreSQL database.

Other engineers run their suites against the same broker and server at the same time, so nothing
here touches a shared name: the vhost and the database carry this process's pid and are deleted
at the end of the session.
"""

import os
import urllib.parse
import urllib.request
import uuid

import pika
import psycopg
import pytest

from tests.helpers.client import AMQP_BASE, PG_ADMIN_DSN, Management


@pytest.fixture(scope="session")
def management():
    return Management()


@pytest.fixture(scope="session")
def vhost(management):
    name = f"lazarus-client-test-{os.getpid()}"
    quoted = urllib.parse.quote(name, safe="")
    management.request("PUT", f"/vhosts/{quoted}")
    management.request(
        "PUT", f"/permissions/{quoted}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    yield name
    management.request("DELETE", f"/vhosts/{quoted}")


@pytest.fixture(scope="session")
def amqp_url(vhost):
    return f"{AMQP_BASE}/{urllib.parse.quote(vhost, safe='')}"


@pytest.fixture(scope="session")
def pg_dsn():
    name = f"lazarus_client_test_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    parts = urllib.parse.urlparse(PG_ADMIN_DSN)
    yield parts._replace(path=f"/{name}").geturl()
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def channel(amqp_url):
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    yield connection.channel()
    if connection.is_open:
        connection.close()


@pytest.fixture
def names():
    """Fresh queue/exchange names per test, so tests in the vhost never see each other."""
    suffix = uuid.uuid4().hex[:8]
    return {
        "queue": f"q.{suffix}",
        "exchange": f"x.{suffix}",
        "returns": f"returns.{suffix}",
        "dlx": f"dlx.{suffix}",
        "dead": f"dead.{suffix}",
    }
