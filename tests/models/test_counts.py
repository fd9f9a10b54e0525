"""MessageCount, the trigger-kept rollup the overview and failure groups read, stays exact."""

import datetime

import pika
import psycopg
import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from recovery.collector.insert import store_rows
from recovery.db import database_conninfo
from recovery.models import Message, MessageCount
from tests.helpers import make_message

pytestmark = pytest.mark.django_db

KEY = ["vhost", "kind", "source_queue", "source_exchange", "reason", "status", "group_key"]


def rollup():
    rows = MessageCount.objects.values(*KEY).annotate(total=Sum("n")).filter(total__gt=0)
    return {tuple(r[k] for k in KEY): r["total"] for r in rows}


def recount():
    rows = Message.objects.values(*KEY).annotate(total=Count("id")).order_by()
    return {tuple(r[k] for k in KEY): r["total"] for r in rows}


def test_it_counts_inserts_status_changes_and_deletes():
    first = make_message(source_queue="a")
    make_message(source_queue="a")
    make_message(source_queue="b", reason="expired", kind="dead_letter")
    assert rollup() == recount()

    Message.objects.filter(pk=first.pk).update(status="replayed")
    Message.objects.filter(source_queue="b").update(status="discarded")
    assert rollup() == recount()

    Message.objects.filter(source_queue="a").delete()
    assert rollup() == recount()


def test_an_update_that_changes_no_counted_column_adds_no_rows():
    message = make_message()
    before = MessageCount.objects.count()
    Message.objects.filter(pk=message.pk).update(updated_at=timezone.now(), status_reason="x")
    assert MessageCount.objects.count() == before


def test_it_buckets_by_utc_hour_of_collection():
    when = datetime.datetime(2026, 3, 1, 10, 59, 59, tzinfo=datetime.UTC)
    make_message(collected_at=when)
    make_message(collected_at=when + datetime.timedelta(seconds=1))
    hours = dict(MessageCount.objects.values_list("hour").annotate(total=Sum("n")).order_by("hour"))
    assert hours == {
        datetime.datetime(2026, 3, 1, 10, tzinfo=datetime.UTC): 1,
        datetime.datetime(2026, 3, 1, 11, tzinfo=datetime.UTC): 1,
    }


@pytest.mark.django_db(transaction=True)
def test_the_collectors_copy_path_is_counted_even_in_another_session_time_zone():
    """The collector writes with psycopg COPY + INSERT … SELECT on its own connection."""
    from recovery.collector.rows import delivery_to_row

    props = pika.BasicProperties(
        message_id="copy-1", headers={"x-death": [{"queue": "q1", "reason": "rejected"}]}
    )
    rows = [
        delivery_to_row("/", "recovery.dead_letters", "recovery.dlx", "q1", props, b"one"),
        delivery_to_row("/", "recovery.dead_letters", "recovery.dlx", "q1", props, b"two"),
    ]
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        pg.execute("SET TIME ZONE 'Asia/Kolkata'")  # a half-hour offset would shift the buckets
        assert store_rows(pg, rows) == 2
        assert store_rows(pg, rows) == 0  # redelivery: nothing new, nothing counted
    assert rollup() == recount()
    [hour] = MessageCount.objects.values_list("hour", flat=True).distinct()
    assert (hour.minute, hour.second) == (0, 0)


def test_compact_folds_deltas_and_keeps_the_sums():
    messages = [make_message(source_queue="c") for _ in range(5)]
    for m in messages[:3]:
        Message.objects.filter(pk=m.pk).update(status="replayed")
    rows_before = MessageCount.objects.count()
    expected = rollup()

    removed = MessageCount.compact()

    assert removed > 0
    assert MessageCount.objects.count() == rows_before - removed
    assert rollup() == expected == recount()
    assert not MessageCount.objects.filter(n=0).exists()
    assert MessageCount.compact() == 0  # nothing left to fold


def test_rebuild_recounts_from_the_messages():
    make_message()
    make_message(status="poisoned")
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO recovery_messagecount (hour, vhost, kind, source_queue, "
            "source_exchange, reason, status, group_key, n) "
            "VALUES (now(), '/', 'dead_letter', 'ghost', '', 'rejected', 'pending', 'g', 7)"
        )
    assert rollup() != recount()
    MessageCount.rebuild()
    assert rollup() == recount()


def test_celery_beat_compacts_the_counts_every_minute():
    from console.celery import app
    from recovery.models.tasks import compact_message_counts

    app.loader.import_default_modules()
    entry = app.conf.beat_schedule["compact-message-counts"]
    assert entry["task"] in app.tasks and entry["schedule"] == 60.0
    make_message()
    Message.objects.update(status="replayed")
    assert compact_message_counts() > 0
    assert rollup() == recount()


def test_compact_folds_hours_older_than_two_days_into_days():
    from console.views.overview import trend

    now = timezone.now()
    old_day = (now - datetime.timedelta(days=4)).replace(hour=0, minute=0, second=0, microsecond=0)
    for hours in (3, 9, 15):
        make_message(collected_at=old_day + datetime.timedelta(hours=hours, minutes=5))
    make_message(collected_at=now - datetime.timedelta(hours=1))
    week_before, day_before = trend(now, 7, 24), trend(now, 24, 1)

    MessageCount.compact()

    hours = dict(MessageCount.objects.values_list("hour").annotate(total=Sum("n")).order_by("hour"))
    assert hours[old_day] == 3  # one row for the old day, at its midnight
    assert len(hours) == 2  # and the recent hour stays an hour
    assert rollup() == recount()
    assert trend(now, 7, 24) == week_before and trend(now, 24, 1) == day_before


# ---- MessageTotal: the same counts without the hour, for what needs totals only (#17) ----------


def totals():
    from recovery.models import MessageTotal

    rows = MessageTotal.objects.values(*KEY).annotate(total=Sum("n")).filter(total__gt=0)
    return {tuple(r[k] for k in KEY): r["total"] for r in rows}


def test_totals_count_inserts_status_changes_deletes_and_keep_the_first_hour():
    from django.db.models import Min

    from recovery.models import MessageTotal

    early = datetime.datetime(2026, 3, 1, 10, 30, tzinfo=datetime.UTC)
    first = make_message(source_queue="t", collected_at=early)
    make_message(source_queue="t", collected_at=early + datetime.timedelta(hours=5))
    make_message(source_queue="u", reason="expired")
    assert totals() == recount()

    Message.objects.filter(pk=first.pk).update(status="replayed")
    Message.objects.filter(source_queue="u").update(status="discarded")
    assert totals() == recount()
    removed = MessageTotal.compact()
    assert removed > 0 and totals() == recount()
    assert not MessageTotal.objects.filter(n=0).exists()
    assert MessageTotal.compact() == 0
    first_hour = MessageTotal.objects.filter(source_queue="t").aggregate(m=Min("first_hour"))
    assert first_hour["m"] == early.replace(minute=0)

    Message.objects.filter(source_queue="t").delete()
    assert totals() == recount()
    MessageTotal.compact()
    assert not MessageTotal.objects.filter(source_queue="t").exists()


@pytest.mark.django_db(transaction=True)
def test_totals_count_the_collectors_copy_path():
    from recovery.collector.rows import delivery_to_row
    from recovery.models import MessageTotal

    props = pika.BasicProperties(
        message_id="copy-t", headers={"x-death": [{"queue": "q9", "reason": "rejected"}]}
    )
    rows = [
        delivery_to_row("/", "recovery.dead_letters", "recovery.dlx", "q9", props, body)
        for body in (b"one", b"two", b"three")
    ]
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        assert store_rows(pg, rows) == 3
        assert store_rows(pg, rows) == 0
    assert totals() == recount()
    MessageTotal.objects.all().delete()
    MessageTotal.rebuild()
    assert totals() == recount()


def test_the_busiest_groups_are_the_most_collected_this_hour_and_the_last(time_machine):
    from recovery.search.overview import changing_groups

    time_machine.move_to("2026-11-26 03:40:00+00:00", tick=False)
    now = timezone.now()
    this_hour, last_hour, earlier = (
        now - datetime.timedelta(minutes=10),
        now - datetime.timedelta(minutes=50),
        now - datetime.timedelta(hours=3),
    )
    collected = {
        "g1": [this_hour] * 3,
        "g2": [this_hour] + [last_hour] * 2,
        "g3": [last_hour] * 5,
        "g4": [this_hour],
        "g5": [last_hour] * 2,
        "g6": [last_hour],  # ties with g4 at 1, after it by key: the sixth, not shown
        "g7": [earlier] * 9,  # busy, but not in these two hours
    }
    for key, times in collected.items():
        for at in times:
            make_message(group_key=key, group_label=f"label {key}", collected_at=at)
    _new, busiest = changing_groups(now)
    assert [g["key"] for g in busiest] == ["g3", "g1", "g2", "g5", "g4"]
    shown = {g["key"]: g for g in busiest}
    assert shown["g3"]["spark"] == [0] * 10 + [5, 0]
    assert shown["g2"]["spark"][-2:] == [2, 1]
    assert (shown["g1"]["this_hour"], shown["g1"]["last_hour"]) == (3, 0)
    assert shown["g1"]["growing"] and not shown["g3"]["growing"]
    assert shown["g4"]["label"] == "label g4"
