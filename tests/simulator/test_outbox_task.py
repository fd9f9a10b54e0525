"""The Lazarus side of the client outbox: beat forwards parked give-ups to the collector."""

import time

import pika
import psycopg
import pytest

from console.celery import app
from recovery.broker.topology import Names
from recovery.client.outbox import Outbox
from recovery.client.retry_cache import Pending
from recovery.collector.tasks import forward_client_outbox, outbox_exists
from recovery.db import database_conninfo


@pytest.fixture
def no_outbox(transactional_db):
    with psycopg.connect(database_conninfo(), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS recovery_outbox")
    yield
    with psycopg.connect(database_conninfo(), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS recovery_outbox")


def test_it_is_scheduled_every_30_seconds():
    entry = app.conf.beat_schedule["forward-client-outbox"]
    assert entry == {"task": "recovery.collector.tasks.forward_client_outbox", "schedule": 30.0}
    app.loader.import_default_modules()
    assert "recovery.collector.tasks.forward_client_outbox" in app.tasks


def test_without_an_outbox_table_it_does_nothing_and_creates_nothing(no_outbox, wired):
    assert forward_client_outbox() == 0
    assert not outbox_exists(database_conninfo())


def test_it_forwards_parked_give_ups_to_the_returns_queue(no_outbox, clean_queues, amqp):
    properties = pika.BasicProperties(message_id="parked-1", headers={"tenant": "acme"})
    entry = Pending("parked-1", "shop", "order.created", b'{"n": 1}', properties, time.time())
    entry.attempts = 1
    headers = {"tenant": "acme", "x-recovery-kind": "unconfirmed", "x-recovery-attempts": 1}
    outbox = Outbox(database_conninfo())
    outbox.write("shop-api", [(entry, headers, "unconfirmed", "timeout")])
    outbox.close()

    assert forward_client_outbox() == 1
    assert forward_client_outbox() == 0  # marked forwarded: never sent twice

    method, props, body = amqp.basic_get(Names.from_settings().returns, auto_ack=True)
    assert method is not None, "nothing reached the returns queue"
    assert (props.message_id, body) == ("parked-1", b'{"n": 1}')
    assert props.headers["x-recovery-kind"] == "unconfirmed"
    assert props.headers["tenant"] == "acme"
