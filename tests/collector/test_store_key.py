"""The store's unique key (recovery.models.store.FINGERPRINT_KEY): the fingerprint led by the
last death's time. A redelivery is stored once whether it has a death time or not, and two
messages that differ only in their death are two rows."""

import datetime

import pika
import psycopg
import pytest
from django.conf import settings

from recovery.collector.insert import store_rows
from recovery.collector.rows import delivery_to_row
from recovery.db import database_conninfo
from recovery.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

WHEN = datetime.datetime(2026, 11, 27, 3, 0, 0, tzinfo=datetime.UTC)


def dead_letter(message_id, body=b"order", when=WHEN):
    death = {
        "count": 1,
        "reason": "rejected",
        "queue": "key.orders",
        "time": when,
        "exchange": "",
        "routing-keys": ["key.orders"],
    }
    properties = pika.BasicProperties(message_id=message_id, headers={"x-death": [death]})
    vhost = settings.RECOVERY_VHOSTS[0]
    return delivery_to_row(vhost, "recovery.dead_letters", "recovery.dlx", "x", properties, body)


def unrouted(message_id, body=b"order"):
    properties = pika.BasicProperties(message_id=message_id)
    vhost = settings.RECOVERY_VHOSTS[0]
    return delivery_to_row(vhost, "recovery.unrouted", "orders", "nowhere", properties, body)


def test_a_redelivery_with_or_without_a_death_time_is_stored_once():
    rows = [dead_letter("k-1"), unrouted("k-2")]
    assert rows[0].last_death_at == WHEN and rows[1].last_death_at is None
    with psycopg.connect(database_conninfo()) as pg:
        assert store_rows(pg, rows) == 2
        # The same deliveries again (a worker that stored them died before its ack), and
        # within one batch too.
        assert store_rows(pg, [dead_letter("k-1"), unrouted("k-2"), unrouted("k-2")]) == 0
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["k-1", "k-2"]


def test_the_same_content_dead_lettered_at_another_time_is_another_message():
    later = WHEN + datetime.timedelta(seconds=1)
    with psycopg.connect(database_conninfo()) as pg:
        assert store_rows(pg, [dead_letter("k-3"), dead_letter("k-3", when=later)]) == 2
    assert Message.objects.filter(message_id="k-3").count() == 2


def test_the_unique_index_is_led_by_the_death_time():
    """So that inserts land at the index's newest end (docs/big-store.md: keyed by the hash
    alone, each insert into a 10M store read a random leaf page and wrote a full-page image)."""
    with psycopg.connect(database_conninfo()) as pg:
        [(definition,)] = pg.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indexrelid = 'msg_fingerprint'::regclass AND indisunique AND indisvalid"
        ).fetchall()
    columns = definition.split("USING btree (", 1)[1]
    assert columns.startswith("COALESCE(last_death_at, '1970-01-01 00:00:00+00'::timestamp")
    assert columns.endswith(", fingerprint)")
