"""Lazarus's key paths through a real PgBouncer in transaction pooling mode (issue #18): the
console and a one-click replay, the collector's COPY path, a bulk replay job, the audit export,
the search indexer's lock and the client outbox. Each test also checks (through_pgbouncer) that
its transactions really went through PgBouncer."""

import datetime
import time
from types import SimpleNamespace

import pika
import psycopg
import pytest
from django.conf import settings

from recovery.audit.export import export_store
from recovery.db import database_conninfo, direct_conninfo
from recovery.models import Message, Status
from recovery.replay.jobs import create_job
from recovery.search.index import LOCK_KEY, index_new
from tests.helpers import declare_app_queue, make_user, wait_for
from tests.helpers.replay import consume_until_idle, dead_letters, run

pytestmark = [pytest.mark.pgbouncer, pytest.mark.usefixtures("through_pgbouncer")]


def test_the_console_lists_shows_and_replays_a_message(client, wired, amqp):
    operator = make_user("pgb-op", "operator")
    declare_app_queue(amqp, "pgb.console")
    [message] = dead_letters("pgb.console", 1)
    client.force_login(operator)
    assert client.get("/messages/").status_code == 200
    assert client.get(f"/messages/{message.pk}/").status_code == 200
    assert client.get("/groups/").status_code == 200
    response = client.post(f"/messages/{message.pk}/replay", {})
    assert response.status_code in (200, 302)
    message.refresh_from_db()
    assert message.status == Status.REPLAYED
    assert [p.message_id for p, _ in consume_until_idle("pgb.console")] == [message.message_id]


def test_the_collector_stores_dead_letters(collector, amqp):
    declare_app_queue(amqp, "pgb.collect")
    for i in range(200):
        amqp.basic_publish("", "pgb.collect", f"m{i}".encode())
    while True:
        method, _, _ = amqp.basic_get("pgb.collect")
        if method is None:
            break
        amqp.basic_reject(method.delivery_tag, requeue=False)
    wait_for(
        lambda: Message.objects.filter(source_queue="pgb.collect").count() == 200,
        timeout=30,
        message="200 dead letters stored through PgBouncer",
    )


def test_a_bulk_replay_job_runs_to_the_end(wired, amqp):
    operator = make_user("pgb-job", "operator")
    declare_app_queue(amqp, "pgb.job")
    stored = dead_letters("pgb.job", 300)
    job = create_job(operator, filters={"queue": "pgb.job"})
    assert run(job) == "done"
    assert (job.confirmed, job.failed) == (300, 0)
    assert sorted(p.message_id for p, _ in consume_until_idle("pgb.job")) == sorted(
        m.message_id for m in stored
    )


def test_the_audit_exports_the_store(wired, tmp_path):
    dead_letters("pgb.audit", 5)
    day = datetime.datetime.now(datetime.UTC).date()
    rows = export_store(day, datetime.timedelta(hours=1), tmp_path / "store.parquet")
    assert rows == 5


def test_the_search_indexer_does_not_leave_its_lock_on_a_pooled_connection(wired):
    dead_letters("pgb.search", 3)
    assert index_new(budget_seconds=None) >= 3
    assert index_new(budget_seconds=None) == 0  # the lock was released: a second run runs
    with psycopg.connect(direct_conninfo("pgb-check")) as conn:
        held = conn.execute(
            # This database's locks only: another test session's indexer on the same server
            # takes the same key in its own database.
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [LOCK_KEY & 0xFFFFFFFF],
        ).fetchone()[0]
    assert held == 0


def test_the_client_outbox_forwards_through_the_pooler(wired):
    from recovery.client.outbox import Outbox, forward_outbox

    dsn = database_conninfo("pgb-outbox")
    outbox = Outbox(dsn)
    entries = [
        SimpleNamespace(
            message_id=f"ob-{i}",
            exchange="",
            routing_key="pgb.nowhere",
            properties=pika.BasicProperties(message_id=f"ob-{i}"),
            body=b"x",
            attempts=3,
            first_attempt_at=time.time(),
        )
        for i in range(3)
    ]
    outbox.write("pgb-producer", [(e, {}, "unconfirmed", "timeout") for e in entries])
    outbox.close()
    assert forward_outbox(dsn, settings.RABBITMQ_URL) == 3
