"""Shared fixtures and hooks: a private RabbitMQ vhost per test session, real PostgreSQL, personas.
Helper functions and classes tests import live in tests/helpers.py.

Each session gets its own vhost (``lazarus-test-<pid>``) so test runs never see each other's
messages; PostgreSQL isolation comes from pytest-django's test database (DATABASE_URL names it).
"""

import os
import urllib.parse

import pika
import pytest
from django.conf import settings

from recovery.broker.management import Management
from tests.helpers import make_user, point_celery_at
from tests.helpers.api import ApiClient
from tests.helpers.teams import member, team

# Every JVM the tests start (spark-submit's driver, the in-process SparkSession, a standalone
# cluster's master and worker) compiles with C1 only and collects with the serial collector: a
# test's day is a few hundred rows, so a JVM lives for seconds and C2's compiling costs more than
# it wins (the audit pipeline's tests run in about 0.6 of the time). It changes how fast, not
# what: the product's JVMs keep their defaults. Set JAVA_TOOL_OPTIONS to override.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


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


# A table past this size is emptied with TRUNCATE, the rest with DELETE (fast_flush).
FLUSH_TRUNCATE_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="session", autouse=True)
def fast_flush(django_db_setup, django_db_blocker):
    """Empty the tables after a ``transaction=True`` test with DELETE instead of TRUNCATE.

    Django's flush TRUNCATEs every table, which gives each table and index new files: 0.5-1 s
    per test here, with 38 tables and their indexes, most of them empty. DELETE of an empty or
    small table costs a millisecond; triggers (the store's counts) and foreign-key checks are
    off for that transaction (session_replication_role = replica), since every table ends
    empty anyway. A table grown past FLUSH_TRUNCATE_BYTES (the fault tests' 30k-100k messages)
    is still TRUNCATEd, with CASCADE for the tables that reference it. With reset_sequences,
    Django's own flush runs. The database ends exactly as empty either way."""
    from django.db import connections

    patched = []
    for connection in connections.all():
        if connection.vendor != "postgresql":
            continue
        with django_db_blocker.unblock(), connection.cursor() as cur:
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            if not cur.fetchone()[0]:
                continue  # session_replication_role needs a superuser: Django's flush then
        original = connection.ops.sql_flush

        def sql_flush(
            style, tables, *, reset_sequences=False, allow_cascade=False, _c=connection, _o=original
        ):
            if reset_sequences or not tables:
                return _o(
                    style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
                )
            with _c.cursor() as cur:
                cur.execute(
                    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = current_schema() AND c.relname = ANY(%s)"
                    " AND pg_total_relation_size(c.oid) > %s",
                    [list(tables), FLUSH_TRUNCATE_BYTES],
                )
                big = {row[0] for row in cur.fetchall()}
            quote = _c.ops.quote_name
            sql = ["SET LOCAL session_replication_role = replica"]
            if big:
                sql.append(f"TRUNCATE {', '.join(quote(t) for t in sorted(big))} CASCADE")
            sql += [f"DELETE FROM {quote(t)}" for t in tables if t not in big]
            return sql

        connection.ops.sql_flush = sql_flush
        patched.append((connection.ops, original))
    yield
    for ops, original in patched:
        ops.sql_flush = original


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


@pytest.fixture(autouse=True)
def private_audit_inputs(settings, tmp_path_factory):
    """Span rows and trace records go to (and audits read them from) an empty directory of this
    test's, never the repository's var/spans and var/trace, which ``make run`` fills."""
    base = tmp_path_factory.mktemp("audit-inputs")
    settings.AUDIT_SPANS = str(base / "spans")
    settings.AUDIT_TRACE = str(base / "trace")


# Personas: one user per global role and team members (make_user, tests.helpers.teams.member),
# and API clients (tests.helpers.api.ApiClient).


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(db):
    return make_user("ada", "admin")


@pytest.fixture
def nobody(db):
    """A user with no role (and no team)."""
    return make_user("nils", None)


@pytest.fixture
def payments_team(db):
    """A team: payments, its queues pay.* on vhost /."""
    return team("payments", "pay.*")


@pytest.fixture
def team_viewer(payments_team):
    """payer: a viewer of the payments team, with no global role."""
    return member("payer", payments_team, role="viewer")


@pytest.fixture
def team_operator(payments_team):
    """pia: an operator of the payments team, with no global role."""
    return member("pia", payments_team)


@pytest.fixture
def api(client):
    """The API client, anonymous until ``api.as_user(user)`` (a fresh token of that user)."""
    return ApiClient(client)


@pytest.fixture
def api_as(client):
    """``api_as(user)`` -> an API client with a fresh token of that user; ``api_as(None)``
    anonymous."""
    return lambda user: ApiClient(client, user)


@pytest.fixture
def admin_api(api_as, admin_user):
    return api_as(admin_user)


@pytest.fixture
def viewer_api(api_as, db):
    """A viewer's API client (a viewer of its own, ``v``: not ``viewer``)."""
    return api_as(make_user("v", "viewer"))


@pytest.fixture
def operator_api(api_as, db):
    """An operator's API client (an operator of its own, ``o``: not ``operator``)."""
    return api_as(make_user("o", "operator"))
