"""The retention archive (RETENTION_ARCHIVE_DIR, #34): what retention deletes is written first,
and ``manage.py import_archive`` brings it back byte for byte; a directory that cannot be
written stops retention, deletes nothing, and fires the retention_archive alert."""

import datetime
import decimal
import errno
import gzip
import json
import os
import uuid

import pytest
import time_machine
from django.core.management import call_command
from django.utils import timezone

from recovery.alerts.checks import run_check
from recovery.client.headers import LongBytes
from recovery.models import Activity, AlertRule, HistoryAction, Message, MessageHistory, Status
from recovery.replay import replay_message
from recovery.retention import archive as archive_module
from recovery.retention.run import apply_retention
from tests.helpers import declare_app_queue, make_message, publish, wait_for

DAY = datetime.timedelta(days=1)
COLUMNS = archive_module.COLUMNS


def row_of(pk):
    return Message.objects.filter(pk=pk).values(*COLUMNS).get()


def take_one(channel, queue):
    result = {}

    def got():
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            result["message"] = (properties, body)
        return method is not None

    wait_for(got, 10, message=f"a message on {queue}")
    return result["message"]


def expired(**fields):
    """A replayed message whose last change was 31 days ago (RETENTION_DAYS is 30)."""
    message = make_message(status=Status.REPLAYED, **fields)
    Message.objects.filter(pk=message.pk).update(updated_at=timezone.now() - 31 * DAY)
    return message


def rule_state():
    rule = AlertRule(name="archive", kind="retention_archive")
    return run_check(rule, timezone.now())


@pytest.mark.django_db(transaction=True)
def test_it_archives_deletes_imports_and_replays_a_collected_message_byte_for_byte(
    collector, amqp, settings, tmp_path
):
    settings.RETENTION_DAYS = 30
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path / "archive")
    queue = f"archive.orders.{uuid.uuid4().hex[:6]}"
    declare_app_queue(amqp, queue)
    body = bytes(range(256)) + "ü €".encode()  # not UTF-8 as a whole
    headers = {
        "tenant": "acme",
        "amount": decimal.Decimal("12.34"),
        "ratio": 0.25,
        "count": 7,
        "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "nested": {"a": [1, "two", {"b": True}]},
        "raw": b"\xff\xfe",
        "latin": LongBytes("café".encode("latin-1")),
    }
    props = {
        "message_id": "order-123",
        "correlation_id": "c-9",
        "content_type": "application/octet-stream",
        "content_encoding": "identity",
        "priority": 3,
        "type": "order.created",
        "app_id": "shop",
        "timestamp": 1767000000,
        "reply_to": "replies",
        "headers": headers,
    }
    publish(amqp, queue, body, **props)
    method, _, _ = amqp.basic_get(queue)
    amqp.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered to Lazarus
    stored = wait_for(lambda: Message.objects.filter(source_queue=queue).first(), 15)
    message = Message.objects.get(pk=stored.pk)

    # The operator replayed it once (it is now 'replayed'); what the application got:
    replay_message(message)
    first_props, first_body = take_one(amqp, queue)
    assert first_body == body
    before = row_of(message.pk)
    assert before["status"] == Status.REPLAYED

    with time_machine.travel(timezone.now() + 31 * DAY, tick=False):
        result = apply_retention()
    assert (result["messages"], result["archived"]) == (1, 1), result
    assert not Message.objects.filter(pk=message.pk).exists()
    [deleted] = MessageHistory.objects.filter(store_id=message.pk, action=HistoryAction.DELETED)
    day = datetime.datetime.fromisoformat(result["cutoff"]).date() + 30 * DAY
    path = archive_module.archive_file(settings.RETENTION_ARCHIVE_DIR, message.vhost, day)
    assert path.parent.name == message.vhost.replace("/", "%2F")
    with gzip.open(path, "rt") as lines:
        [line] = [json.loads(text) for text in lines]
    assert line["message_id"] == "order-123" and line["fingerprint"] == before["fingerprint"]

    call_command("import_archive", str(path))
    assert row_of(message.pk) == before  # every column, the body's bytes included
    assert Activity.objects.get(action="import_archive").detail["imported"] == 1
    call_command("import_archive", str(path))  # idempotent
    assert (
        Activity.objects.filter(action="import_archive").order_by("id").last().detail["skipped"]
        == 1
    )
    assert Message.objects.filter(fingerprint=before["fingerprint"]).count() == 1

    replay_message(Message.objects.get(pk=message.pk))
    again_props, again_body = take_one(amqp, queue)
    assert again_body == body
    # The same message as the first replay delivered; only the replay's own count and time move.
    moving = {"x-recovery-replay-count", "x-recovery-replayed-at"}
    assert {k: v for k, v in again_props.headers.items() if k not in moving} == {
        k: v for k, v in first_props.headers.items() if k not in moving
    }
    assert again_props.headers["x-recovery-replay-count"] == 2
    for name in ("message_id", "correlation_id", "content_type", "content_encoding", "priority"):
        assert getattr(again_props, name) == getattr(first_props, name) == props[name], name
    for name in ("type", "app_id", "timestamp", "reply_to", "delivery_mode"):
        assert getattr(again_props, name) == getattr(first_props, name), name
    for key in ("tenant", "count", "nested", "ratio", "when"):
        assert again_props.headers[key] == headers[key]
    assert again_props.headers["amount"] == headers["amount"]
    assert again_props.headers["raw"] == headers["raw"]
    assert again_props.headers["latin"] == headers["latin"]


@pytest.mark.django_db
def test_it_writes_one_file_per_vhost_and_day_appending_each_batch_as_a_gzip_member(
    settings, tmp_path
):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    old = [expired(vhost="/", body=b"a" * 10) for _ in range(5)]
    other = expired(vhost="shop eu", body=b"\x00\x01")
    now = timezone.now()

    result = apply_retention(now=now, batch=2)

    assert (result["messages"], result["archived"]) == (6, 6)
    root = archive_module.archive_file(tmp_path, "/", now.date())
    eu = archive_module.archive_file(tmp_path, "shop eu", now.date())
    assert root == tmp_path / "%2F" / f"{now:%Y-%m-%d}.jsonl.gz"
    assert eu.parent.name == "shop%20eu"
    assert root.read_bytes().count(b"\x1f\x8b\x08") >= 3  # batches of 2: three members or more
    rows = list(archive_module.read_archive(root))
    assert sorted(r["id"] for r in rows) == sorted(m.pk for m in old)
    assert [r["body"] for r in archive_module.read_archive(eu)] == [b"\x00\x01"]
    assert other.pk not in {r["id"] for r in rows}


@pytest.mark.django_db
def test_an_unwritable_directory_stops_retention_deletes_nothing_and_fires_the_alert(
    settings, tmp_path
):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path / "archive")
    messages = [expired() for _ in range(3)]
    assert rule_state().firing is False  # never failed

    # A directory under a regular file cannot be created, by root either.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings.RETENTION_ARCHIVE_DIR = str(blocker / "archive")
    result = apply_retention()

    assert result["messages"] == 0 and "Not a directory" in result["archive_error"]
    assert Message.objects.filter(pk__in=[m.pk for m in messages]).count() == 3
    assert not MessageHistory.objects.filter(action=HistoryAction.DELETED).exists()
    activity = Activity.objects.get(action="retention")
    assert activity.detail["archive_error"] == result["archive_error"]
    check = rule_state()
    assert check.firing and "Not a directory" in check.summary, check

    settings.RETENTION_ARCHIVE_DIR = str(tmp_path / "archive")
    assert apply_retention()["messages"] == 3
    assert rule_state().firing is False
    # Nothing to delete and nothing failed before: no activity row.
    apply_retention()
    apply_retention()
    assert Activity.objects.filter(action="retention").count() == 2


@pytest.mark.django_db
def test_a_full_disk_stops_retention_and_leaves_the_file_readable(settings, tmp_path):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    now = timezone.now()
    first = expired()
    apply_retention(now=now)
    path = archive_module.archive_file(tmp_path, first.vhost, now.date())
    size = path.stat().st_size
    kept = [expired(vhost=first.vhost) for _ in range(2)]

    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    os.fsync = full
    try:
        result = apply_retention(now=now)
    finally:
        os.fsync = real_fsync

    assert "No space left on device" in result["archive_error"]
    assert Message.objects.filter(pk__in=[m.pk for m in kept]).count() == 2
    assert path.stat().st_size == size  # the half-written member was cut off
    assert [r["id"] for r in archive_module.read_archive(path)] == [first.pk]
    assert rule_state().firing


@pytest.mark.django_db
def test_a_real_enospc_device_stops_retention(settings, tmp_path):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    now = timezone.now()
    message = expired()
    path = archive_module.archive_file(tmp_path, message.vhost, now.date())
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")  # every write: ENOSPC

    result = apply_retention(now=now)

    assert "No space left on device" in result["archive_error"]
    assert Message.objects.filter(pk=message.pk).exists()


@pytest.mark.django_db
def test_the_import_renumbers_a_taken_id_and_clears_a_missing_origin(settings, tmp_path):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    now = timezone.now()
    origin = expired()
    copy = expired(origin=origin)
    apply_retention(now=now)
    path = archive_module.archive_file(tmp_path, origin.vhost, now.date())
    rows = list(archive_module.read_archive(path))
    assert {r["id"]: r["origin_id"] for r in rows} == {origin.pk: None, copy.pk: origin.pk}

    # Only the copy comes back: its origin is not in the store.
    counts = archive_module.import_rows([r for r in rows if r["id"] == copy.pk])
    assert counts == {"imported": 1, "skipped": 0, "renumbered": 0, "origin_cleared": 1}
    assert Message.objects.get(pk=copy.pk).origin_id is None
    # The origin's id is someone else's now (another database): it gets a new one.
    Message.objects.filter(pk=copy.pk).update(fingerprint="x" * 64)
    stranger = Message.objects.get(pk=copy.pk)
    counts = archive_module.import_rows([r for r in rows if r["id"] == copy.pk])
    assert counts["renumbered"] == 1 and counts["imported"] == 1
    assert Message.objects.get(pk=stranger.pk).fingerprint == "x" * 64
    newest = make_message()
    assert newest.pk > max(r["id"] for r in rows)


@pytest.mark.django_db
def test_a_message_changed_after_it_was_archived_is_not_deleted(settings, tmp_path, monkeypatch):
    settings.RETENTION_DAYS = 30
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    changed, unchanged = expired(), expired()
    write = archive_module.archive_messages

    def then_restored(directory, ids, day):
        written = write(directory, ids, day)
        # Between the write and the lock, an operator restores it (a change sets updated_at).
        Message.objects.filter(pk=changed.pk).update(
            status=Status.PENDING, updated_at=timezone.now()
        )
        return written

    monkeypatch.setattr(archive_module, "archive_messages", then_restored)
    result = apply_retention()

    assert (result["archived"], result["messages"]) == (2, 1)
    assert list(Message.objects.values_list("pk", flat=True)) == [changed.pk]
    assert not Message.objects.filter(pk=unchanged.pk).exists()


@pytest.mark.django_db
def test_an_import_with_touch_is_kept_by_the_next_retention_run(settings, tmp_path):
    settings.RETENTION_DAYS = 30
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    now = timezone.now()
    kept, again = expired(), expired()
    apply_retention(now=now)
    path = archive_module.archive_file(tmp_path, kept.vhost, now.date())
    rows = list(archive_module.read_archive(path))

    archive_module.import_rows([r for r in rows if r["id"] == kept.pk], touch=True)
    call_command("import_archive", str(path))  # the other one as it was: past retention

    assert apply_retention()["messages"] == 1
    assert list(Message.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not Message.objects.filter(pk=again.pk).exists()


@pytest.mark.django_db
def test_the_import_reads_past_a_member_cut_short_by_a_crash(settings, tmp_path):
    settings.RETENTION_ARCHIVE_DIR = str(tmp_path)
    now = timezone.now()
    first = expired()
    apply_retention(now=now)
    path = archive_module.archive_file(tmp_path, first.vhost, now.date())
    whole = path.read_bytes()
    # A crash halfway through the next append (its batch was never deleted), then a later run.
    second = expired()
    apply_retention(now=now)
    members = path.read_bytes()
    torn_member = members[len(whole) :][: (len(members) - len(whole)) // 2]
    third = expired()
    apply_retention(now=now)
    after = path.read_bytes()[len(members) :]
    path.write_bytes(whole + torn_member + after)

    torn = {}
    rows = list(archive_module.read_archive(path, torn))
    assert [r["id"] for r in rows] == [first.pk, third.pk] and torn == {"members": 1}
    path.write_bytes(whole + torn_member)  # cut short at the end
    torn = {}
    assert [r["id"] for r in archive_module.read_archive(path, torn)] == [first.pk]
    assert torn == {"members": 1}
    assert second.pk not in {r["id"] for r in rows}
