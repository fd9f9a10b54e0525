"""The job store's writes (recovery.replay.job_store): one statement per outcome batch, item updates
that stay heap-only, and log rows that follow deletes without database foreign keys."""

import psycopg
import pytest
from django.db import connection

from recovery.db import database_conninfo
from recovery.models import (
    Activity,
    Message,
    ReplayAttempt,
    ReplayJob,
    ReplayJobItem,
    Status,
)
from recovery.replay.job_store import JobStore
from tests.helpers.replay import populated

pytestmark = pytest.mark.django_db(transaction=True)


def test_record_writes_items_messages_logs_and_counters_in_one_go(wired, operator):
    job, store, messages = populated("store.record", 4, operator)
    Message.objects.filter(pk=messages[1].pk).update(status=Status.REPLAYED, replay_count=0)
    claimed, skipped, _left = store.claim(10, ["pending", "replayed"])
    assert skipped == 0 and len(claimed) == 4
    by_message = {c.message_id: c.item_id for c in claimed}
    # The fourth item is given back before its outcome arrives: the fence keeps it pending.
    store.release([by_message[messages[3].pk]])

    def result(message, outcome, detail=""):
        return (by_message[message.pk], message.pk, outcome, detail, "", "store.record")

    counts = store.record(
        [
            result(messages[0], "confirmed"),
            result(messages[1], "returned", "returned by the broker: 312 NO_ROUTE"),
            result(messages[2], "nacked", "the broker nacked the publish"),
            result(messages[3], "confirmed"),
        ],
        operator.pk,
        "api",
    )
    store.close()

    assert counts == {"confirmed": 1, "returned": 1, "nacked": 1, "failed": 0}
    states = dict(ReplayJobItem.objects.filter(job=job).values_list("message_id", "state"))
    assert [states[m.pk] for m in messages] == ["confirmed", "returned", "nacked", "pending"]
    rows = {m.pk: m for m in Message.objects.filter(pk__in=[m.pk for m in messages])}
    sent = rows[messages[0].pk]
    assert (sent.status, sent.replay_count, sent.status_reason) == (Status.REPLAYED, 1, "")
    assert sent.last_replayed_at is not None
    # Replayed before and returned now: it needs attention again, and says why.
    back = rows[messages[1].pk]
    assert (back.status, back.replay_count) == (Status.PENDING, 0)
    assert back.status_reason == "returned by the broker: 312 NO_ROUTE"
    assert rows[messages[2].pk].status == Status.PENDING
    assert rows[messages[3].pk].status_reason == ""  # not written: not held any more

    attempts = ReplayAttempt.objects.filter(job=job).order_by("message_id")
    assert [(a.message_id, a.outcome, a.user_id, a.routing_key) for a in attempts] == [
        (messages[0].pk, "confirmed", operator.pk, "store.record"),
        (messages[1].pk, "returned", operator.pk, "store.record"),
        (messages[2].pk, "nacked", operator.pk, "store.record"),
    ]
    logged = Activity.objects.filter(job=job, action="replay").order_by("message_id")
    assert [(a.message_id, a.user_id, a.via) for a in logged] == [
        (m.pk, operator.pk, "api") for m in messages[:3]
    ]
    assert logged[1].detail == {
        "message": messages[1].pk,
        "exchange": "",
        "routing_key": "store.record",
        "outcome": "returned",
        "detail": "returned by the broker: 312 NO_ROUTE",
        "edited": False,
        "job": job.pk,
    }
    assert len({a.created_at for a in attempts} | {a.created_at for a in logged}) == 1
    job.refresh_from_db()
    assert (job.sent, job.confirmed, job.returned, job.failed) == (3, 1, 1, 1)


def test_records_of_another_runner_are_fenced_off(wired, operator):
    job, owner, messages = populated("store.fence", 2, operator)
    claimed, _skipped, _left = owner.claim(10, ["pending"])
    intruder = JobStore(job.pk, "runner-b")
    rows = [(c.item_id, c.message_id, "confirmed", "", "", "store.fence") for c in claimed]
    assert intruder.record(rows, None, "system")["confirmed"] == 0
    intruder.close()
    owner.close()
    assert not ReplayAttempt.objects.filter(job=job).exists()
    assert not Activity.objects.filter(job=job, action="replay").exists()
    assert ReplayJob.objects.get(pk=job.pk).sent == 0
    assert Message.objects.filter(status=Status.REPLAYED).count() == 0


def test_item_updates_stay_heap_only():
    """No index of the items may cover ``state`` (as a key or in a predicate), and the pages
    keep room for new versions: then claiming and recording an item writes no index entry."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid = 'recovery_replayjobitem'::regclass"
        )
        indexes = dict(cur.fetchall())
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = 'recovery_replayjobitem'")
        options = cur.fetchone()[0]
    assert indexes and not [name for name, sql in indexes.items() if "state" in sql]
    assert "fillfactor=25" in options


def test_item_claims_and_outcomes_are_hot_updates(wired, operator):
    # A runner's name is host:pid:random; a long host name makes the claimed version wider.
    runner = "replay-worker-7.production.example.com:123456:0123abcd"
    job, store, _messages = populated("store.hot", 200, operator, runner=runner)
    pg = store.connect()

    def updates():
        return pg.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%(t)s::regclass),"
            " pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass)",
            {"t": "recovery_replayjobitem"},
        ).fetchone()

    # This backend's counts not yet sent to the statistics (they add up across transactions).
    before = updates()
    claimed, _skipped, _left = store.claim(200, ["pending"])
    after_claims = updates()
    rows = [(c.item_id, c.message_id, "confirmed", "", "", "store.hot") for c in claimed]
    store.record(rows, None, "system")
    after_outcomes = updates()
    store.close()
    claims = [a - b for a, b in zip(after_claims, before, strict=True)]
    outcomes = [a - b for a, b in zip(after_outcomes, after_claims, strict=True)]
    # Before migration 0012 none was (``state`` was indexed). Every claim finds room on its
    # page; an outcome does too once the page's pending versions are pruned, which waits for
    # the oldest snapshot of the database (other tests' connections may hold it back).
    assert claims == [200, 200]
    assert outcomes[0] == 200 and outcomes[1] >= 100, outcomes


def test_log_rows_follow_deletes_made_through_django(wired, operator):
    """The log tables and the items have no database foreign keys; Django applies their
    on_delete."""
    job, store, messages = populated("store.logs", 2, operator)
    claimed, _skipped, _left = store.claim(10, ["pending"])
    rows = [(c.item_id, c.message_id, "confirmed", "", "", "store.logs") for c in claimed]
    store.record(rows, operator.pk, "console")
    store.close()
    with psycopg.connect(database_conninfo()) as pg:
        checked = pg.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid IN "
            "('recovery_replayattempt'::regclass, 'recovery_activity'::regclass, "
            "'recovery_replayjobitem'::regclass)"
        ).fetchone()[0]
    assert checked == 0

    gone = messages[0]
    Message.objects.filter(pk=gone.pk).delete()
    assert not ReplayJobItem.objects.filter(message_id=gone.pk).exists()  # CASCADE
    assert not ReplayAttempt.objects.filter(message_id=gone.pk).exists()  # CASCADE
    assert Activity.objects.filter(action="replay", message__isnull=True, job=job).count() == 1

    ReplayJob.objects.filter(pk=job.pk).delete()
    assert ReplayAttempt.objects.filter(message=messages[1], job__isnull=True).count() == 1
    assert Activity.objects.filter(action="replay", job__isnull=True).count() == 2
    assert not ReplayJobItem.objects.filter(job_id=job.pk).exists()  # CASCADE


def test_a_message_deleted_behind_djangos_back_is_skipped(wired, operator):
    """Without a foreign key a raw SQL delete leaves the message's items behind: the claim
    skips them and says why, and claims the rest."""
    job, store, messages = populated("store.raw_delete", 3, operator)
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        pg.execute("DELETE FROM recovery_message WHERE id = %s", (messages[1].pk,))
    claimed, skipped, any_left = store.claim(10, ["pending"])
    store.close()
    assert skipped == 1 and any_left
    assert sorted(c.message_id for c in claimed) == [messages[0].pk, messages[2].pk]
    item = ReplayJobItem.objects.get(job=job, message_id=messages[1].pk)
    assert (item.state, item.detail) == ("skipped", "skipped: the message no longer exists")
    assert ReplayJob.objects.get(pk=job.pk).skipped == 1
