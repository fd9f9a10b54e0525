"""Retention never holds the message table up (#34): while it archives and deletes batches, the
collector's inserts and the console's updates on another connection wait under a second for any
lock (lock_timeout 1 s: a longer wait fails the statement, and the test)."""

import datetime
import random
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from recovery.collector.insert import store_rows
from recovery.db import database_conninfo
from recovery.models import Message, Status
from recovery.retention.run import BATCH, apply_retention
from tests.helpers.replay import dead_letter_row, store

pytestmark = pytest.mark.django_db(transaction=True)

EXPIRED = 3 * BATCH


def test_retention_never_blocks_an_insert_or_an_update_for_a_second(settings, tmp_path, wired):
    settings.RETENTION_DAYS = 30
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    body = b"x" * 1024
    old = store([dead_letter_row("locks.old", body) for _ in range(EXPIRED)])
    kept = store([dead_letter_row("locks.kept", body) for _ in range(200)])
    old_ids = [m.pk for m in old]
    Message.objects.filter(pk__in=old_ids).update(
        status=Status.REPLAYED, updated_at=timezone.now() - datetime.timedelta(days=31)
    )
    result = {}

    def retention():
        try:
            result.update(apply_retention(duty=1))  # full speed: the most lock time
        finally:
            connection.close()

    waits = []
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        pg.execute("SET lock_timeout = '1s'")
        worker = threading.Thread(target=retention)
        began = time.monotonic()
        worker.start()
        while worker.is_alive():
            for sql, params in (
                # The console: a pending message's status changes; a row retention is deleting
                # right now is updated (it waits for that batch's commit, no longer).
                (
                    "UPDATE recovery_message SET status_reason = 'seen' WHERE id = %s",
                    [random.choice(kept).pk],
                ),
                (
                    "UPDATE recovery_message SET status_reason = 'late' WHERE id = %s",
                    [random.choice(old_ids)],
                ),
            ):
                started = time.monotonic()
                pg.execute(sql, params)
                waits.append(time.monotonic() - started)
            # The collector: a batch stored as it stores it (COPY, INSERT ... ON CONFLICT).
            started = time.monotonic()
            store_rows(pg, [dead_letter_row("locks.new", body) for _ in range(20)])
            waits.append(time.monotonic() - started)
        worker.join()
        took = time.monotonic() - began
    print(f"retention {took:.2f} s; {len(waits)} writes meanwhile, longest {max(waits):.3f} s")

    assert result["messages"] == result["archived"] == EXPIRED, result
    # About one round of writes per batch at least: they ran while it deleted.
    assert len(waits) >= 3 * EXPIRED // BATCH, "the writes did not run while retention did"
    assert max(waits) < 1.0
    assert Message.objects.filter(source_queue="locks.new").count() == len(waits) // 3 * 20
    assert Message.objects.filter(pk__in=[m.pk for m in kept]).count() == len(kept)
