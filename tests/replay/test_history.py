"""The message history (#34): one row per action on a message, written by every action path
(one click, edit, bulk job, discard, restore, by filter, retention), with real PostgreSQL and
RabbitMQ, and found by message id in the console and the API after the message is deleted."""

import datetime

import pytest
from django.utils import timezone

from recovery.models import Message, MessageHistory, ReplayJob, Status
from recovery.replay import (
    discard_matching,
    discard_message,
    edit_and_replay,
    replay_message,
    restore_matching,
    restore_message,
)
from recovery.replay.jobs import create_job
from recovery.retention.run import apply_retention
from tests.helpers import declare_app_queue
from tests.helpers.replay import consume_until_idle, dead_letters, run

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = (
    "message_id",
    "store_id",
    "queue",
    "action",
    "who",
    "via",
    "job_id",
    "outcome",
    "target_exchange",
    "target_routing_key",
)


def history_of(message):
    """The history rows of one stored message, oldest first, as tuples of FIELDS."""
    rows = MessageHistory.objects.filter(store_id=message.pk).order_by("at", "id")
    return [tuple(getattr(row, name) for name in FIELDS) for row in rows]


def expire_now(*messages):
    """Make messages old enough for retention (their last change 31 days ago)."""
    old = timezone.now() - datetime.timedelta(days=31)
    Message.objects.filter(pk__in=[m.pk for m in messages]).update(updated_at=old)


def test_one_click_and_edit_replays_leave_their_outcome_and_target(wired, amqp, operator):
    declare_app_queue(amqp, "hist.orders")
    arrives, edited, returned = dead_letters("hist.orders", 2) + dead_letters("hist.nowhere", 1)

    replay_message(arrives, user=operator)
    edit_and_replay(edited, operator, body="fixed")
    replay_message(returned, user=operator)

    assert len(consume_until_idle("hist.orders")) == 2
    assert history_of(arrives) == [
        (arrives.message_id, arrives.pk, "hist.orders", "replay", "otto", "console", None)
        + ("confirmed", "", "hist.orders")
    ]
    assert history_of(edited) == [
        (edited.message_id, edited.pk, "hist.orders", "edit_replay", "otto", "console", None)
        + ("confirmed", "", "hist.orders")
    ]
    [row] = MessageHistory.objects.filter(store_id=returned.pk)
    assert (row.action, row.outcome, row.target_routing_key) == (
        "replay",
        "returned",
        "hist.nowhere",
    )
    assert "NO_ROUTE" in row.detail
    assert row.vhost == wired and row.group_key == returned.group_key
    assert row.group_label == returned.group_label and row.group_label


def test_a_replay_through_the_api_names_the_token_user(wired, amqp, operator, api):
    declare_app_queue(amqp, "hist.api")
    [message] = dead_letters("hist.api", 1)

    response = api.as_user(operator).post(f"/api/v1/messages/{message.pk}/replay")

    assert response.status_code == 200, response.content
    assert history_of(message) == [
        (message.message_id, message.pk, "hist.api", "replay", "otto", "api", None)
        + ("confirmed", "", "hist.api")
    ]


def test_a_bulk_job_leaves_a_row_per_message_with_the_job(wired, amqp, operator):
    declare_app_queue(amqp, "hist.bulk")
    sent = dead_letters("hist.bulk", 3)
    lost = dead_letters("hist.bulk.gone", 2)  # no such queue: returned
    job = create_job(operator, message_ids=[m.pk for m in sent + lost])

    assert run(job) == ReplayJob.State.DONE

    for message in sent:
        assert history_of(message) == [
            (message.message_id, message.pk, "hist.bulk", "replay", "otto", "console", job.pk)
            + ("confirmed", "", "hist.bulk")
        ]
    for message in lost:
        [row] = MessageHistory.objects.filter(store_id=message.pk)
        assert (row.outcome, row.job_id, row.who) == ("returned", job.pk, "otto")
        assert "NO_ROUTE" in row.detail


def test_discard_and_restore_one_or_by_filter(wired, operator):
    one, *matching = dead_letters("hist.curate", 3)

    discard_message(one, operator, reason="bad data")
    restore_message(one, operator)
    assert discard_matching(operator, {"queue": "hist.curate"}, reason="flood")[0] == 3
    assert restore_matching(operator, {"queue": "hist.curate"})[0] == 3

    assert [(row[3], row[4]) for row in history_of(one)] == [
        ("discard", "otto"),
        ("restore", "otto"),
        ("discard", "otto"),
        ("restore", "otto"),
    ]
    details = list(
        MessageHistory.objects.filter(store_id=one.pk).order_by("at", "id").values_list("detail")
    )
    assert details == [("bad data",), ("restored to pending",), ("flood",), ("restored by filter",)]
    for message in matching:
        assert [row[3] for row in history_of(message)] == ["discard", "restore"]


def test_was_order_123_replayed_by_whom_and_did_it_arrive_after_retention(
    wired, amqp, operator, viewer, api, client, settings
):
    """Create, act, delete via retention, then find the history by message id."""
    settings.RETENTION_DAYS = 30
    declare_app_queue(amqp, "hist.order")
    [order] = dead_letters("hist.order", 1, message_id="order-123")
    [other] = dead_letters("hist.order", 1, message_id="order-124")
    replay_message(order, user=operator)
    discard_message(other, operator)
    expire_now(order, other)

    assert apply_retention()["messages"] == 2

    assert not Message.objects.filter(pk__in=[order.pk, other.pk]).exists()
    assert [row[3:] for row in history_of(order)] == [
        ("replay", "otto", "console", None, "confirmed", "", "hist.order"),
        ("deleted", "", "system", None, "", "", ""),
    ]
    # The API: newest first, paginated like every list.
    response = api.as_user(viewer).get("/api/v1/history", message_id="order-123", page_size=1)
    assert response.status_code == 200, response.content
    page = response.json()
    [deleted] = page["results"]
    assert (deleted["action"], deleted["stored"], deleted["via"]) == ("deleted", False, "system")
    assert page["next"] is not None
    [replayed] = api.get(page["next"].split("testserver")[1]).json()["results"]
    assert (replayed["action"], replayed["who"], replayed["outcome"]) == (
        "replay",
        "otto",
        "confirmed",
    )
    assert (replayed["queue"], replayed["store_id"]) == ("hist.order", order.pk)
    assert replayed["group_label"] == order.group_label
    # The console.
    client.force_login(viewer)
    page = client.get("/history/", {"message_id": "order-123"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "order-124" not in html
    assert html.count("order-123") >= 2 and "deleted by retention" in html and "confirmed" in html
    assert f"/messages/{order.pk}/" not in html  # gone: no link to it
    # A stored message's page links to the history of its id.
    [again] = dead_letters("hist.order", 1, message_id="order-123")
    detail = client.get(f"/messages/{again.pk}/").content.decode()
    assert 'href="/history/?message_id=order-123"' in detail
    listed = client.get("/history/", {"message_id": "order-123"}).content.decode()
    assert f"/messages/{again.pk}/" not in listed  # nothing done to the new copy yet


def test_the_history_is_kept_for_history_days_then_retention_deletes_it(wired, operator, settings):
    settings.HISTORY_DAYS = 400
    [message] = dead_letters("hist.days", 1)
    discard_message(message, operator)
    restore_message(message, operator)
    old, recent = MessageHistory.objects.filter(store_id=message.pk).order_by("id")
    MessageHistory.objects.filter(pk=old.pk).update(at=timezone.now() - datetime.timedelta(401))
    MessageHistory.objects.filter(pk=recent.pk).update(at=timezone.now() - datetime.timedelta(399))

    result = apply_retention()

    assert result["history"] == 1 and result["messages"] == 0
    assert list(MessageHistory.objects.filter(store_id=message.pk)) == [recent]
    assert Message.objects.get(pk=message.pk).status == Status.PENDING


def test_a_history_row_is_part_of_the_action_s_transaction(wired, operator, monkeypatch):
    """A history row that cannot be written undoes the action: what was done is never unrecorded."""
    [message] = dead_letters("hist.atomic", 1)

    def broken(*args, **kwargs):
        raise RuntimeError("no history")

    monkeypatch.setattr(MessageHistory, "record_messages", broken)
    with pytest.raises(RuntimeError):
        discard_message(message, operator)

    assert Message.objects.get(pk=message.pk).status == Status.PENDING
    assert not MessageHistory.objects.exists()
