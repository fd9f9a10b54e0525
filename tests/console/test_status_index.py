"""MessageStatus, the trigger-kept copy of each message's status that the status filter reads
(no index of recovery_message covers status, so a status update can be heap-only)."""

import pika
import psycopg
import pytest
from django.db import connection

from recovery.collector import database_conninfo
from recovery.filters import apply_filters
from recovery.ingest import delivery_to_row, store_rows
from recovery.models import Message, MessageStatus
from tests.console.conftest import make_message

pytestmark = pytest.mark.django_db


def copies():
    return dict(MessageStatus.objects.values_list("message_id", "status"))


def truth():
    return dict(Message.objects.values_list("id", "status"))


def test_it_follows_inserts_status_changes_deletes_and_truncate():
    first = make_message(source_queue="a")
    make_message(source_queue="a")
    make_message(source_queue="b")
    assert copies() == truth() and len(truth()) == 3

    Message.objects.filter(pk=first.pk).update(status="replayed")
    Message.objects.filter(source_queue="b").update(status="discarded", status_reason="x")
    Message.objects.filter(source_queue="a").update(status_reason="no status change")
    assert copies() == truth()
    assert sorted(truth().values()) == ["discarded", "pending", "replayed"]

    Message.objects.filter(source_queue="a").delete()
    assert copies() == truth() and len(truth()) == 1


@pytest.mark.django_db(transaction=True)
def test_it_is_emptied_with_a_truncate():
    make_message(source_queue="t")
    assert len(copies()) == 1
    with connection.cursor() as cur:
        cur.execute("TRUNCATE recovery_message CASCADE")
    assert copies() == {}


@pytest.mark.django_db(transaction=True)
def test_the_collectors_copy_path_is_copied_once():
    props = pika.BasicProperties(message_id="status-1", headers={})
    rows = [
        delivery_to_row("/", "recovery.dead_letters", "recovery.dlx", "q1", props, b"one"),
        delivery_to_row("/", "recovery.dead_letters", "recovery.dlx", "q1", props, b"two"),
    ]
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        assert store_rows(pg, rows) == 2
        assert store_rows(pg, rows) == 0  # redelivery: nothing new
    assert copies() == truth() and len(truth()) == 2


def test_the_status_filter_reads_it_and_finds_what_the_column_says():
    messages = [make_message(source_queue="f") for _ in range(6)]
    Message.objects.filter(pk__in=[m.pk for m in messages[:2]]).update(status="poisoned")
    Message.objects.filter(pk=messages[2].pk).update(status="discarded")
    for status in ("pending", "poisoned", "discarded", "replayed"):
        found = apply_filters(Message.objects.all(), {"status": status, "queue": "f"})
        assert "recovery_messagestatus" in str(found.query)
        expected = Message.objects.filter(status=status, source_queue="f")
        assert sorted(found.values_list("pk", flat=True)) == sorted(
            expected.values_list("pk", flat=True)
        )
    # The copy decides too: a row whose copy disagrees (never, while the triggers run) is out.
    MessageStatus.objects.filter(message_id=messages[3].pk).update(status="replayed")
    found = apply_filters(Message.objects.all(), {"status": "pending", "queue": "f"})
    assert messages[3].pk not in set(found.values_list("pk", flat=True))


def test_no_index_of_the_message_table_covers_status():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid = 'recovery_message'::regclass"
        )
        definitions = [row[0] for row in cur.fetchall()]
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = 'recovery_message'")
        options = cur.fetchone()[0]
    assert definitions and not [d for d in definitions if "status" in d]
    assert "fillfactor=50" in options
