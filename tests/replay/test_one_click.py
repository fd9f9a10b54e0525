"""One message at a time: targets, confirms, returns, nacks, discard, restore, edit-and-replay."""

import decimal
import time

import pytest
from django.core.exceptions import ValidationError

from recovery.errors import StateError
from recovery.models import Activity, Message, MessageEdit, ReplayAttempt, Status
from recovery.replay import discard_message, edit_and_replay, replay_message, restore_message
from tests.helpers import declare_app_queue
from tests.helpers.replay import consume_until_idle, queue_depth, store, unroutable_row
from tests.helpers.replay import dead_letters as stored_dead_letters

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_replays_a_dead_letter_to_the_queue_it_died_in(wired, amqp, operator):
    declare_app_queue(amqp, "one.orders")
    [message] = stored_dead_letters(
        "one.orders", 1, body=b"\x00body\xff", headers={"tenant": "acme", "n": 7}
    )

    attempt = replay_message(message, user=operator)

    assert attempt.outcome == ReplayAttempt.Outcome.CONFIRMED
    assert (attempt.exchange, attempt.routing_key) == ("", "one.orders")
    [(props, body)] = consume_until_idle("one.orders")
    assert body == b"\x00body\xff"
    assert props.message_id == message.message_id
    assert props.headers["tenant"] == "acme" and props.headers["n"] == 7
    assert "x-death" not in props.headers
    assert props.headers["x-recovery-origin"] == message.pk
    assert props.headers["x-recovery-replay-count"] == 1
    assert props.headers["x-recovery-replayed-by"] == operator.username
    message.refresh_from_db()
    assert (message.status, message.replay_count) == (Status.REPLAYED, 1)
    activity = Activity.objects.get(action="replay", message=message)
    assert activity.user == operator and activity.detail["outcome"] == "confirmed"


def test_it_sends_unroutable_messages_back_to_their_exchange_and_key(wired, amqp, operator):
    amqp.exchange_declare("one.shop", "topic", durable=True)
    declare_app_queue(amqp, "one.shop.orders")
    amqp.queue_bind("one.shop.orders", "one.shop", "order.*")
    [message] = store([unroutable_row("one.shop", "order.created", b"o-1")])

    attempt = replay_message(message, user=operator)

    assert (attempt.exchange, attempt.routing_key) == ("one.shop", "order.created")
    assert [body for _p, body in consume_until_idle("one.shop.orders")] == [b"o-1"]


def test_a_returned_replay_leaves_the_message_pending_with_the_reason(wired, operator):
    [message] = stored_dead_letters("one.nowhere", 1)  # the queue does not exist

    attempt = replay_message(message, user=operator)

    assert attempt.outcome == ReplayAttempt.Outcome.RETURNED
    assert "312" in attempt.detail and "NO_ROUTE" in attempt.detail
    message.refresh_from_db()
    assert message.status == Status.PENDING
    assert "NO_ROUTE" in message.status_reason


def test_a_nacked_replay_leaves_the_message_pending(wired, amqp, operator):
    declare_app_queue(amqp, "one.full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    amqp.basic_publish("", "one.full", b"already there")
    [message] = stored_dead_letters("one.full", 1)

    attempt = replay_message(message, user=operator)

    assert attempt.outcome == ReplayAttempt.Outcome.NACKED
    message.refresh_from_db()
    assert message.status == Status.PENDING and "nacked" in message.status_reason


def test_it_replays_to_a_chosen_queue_or_exchange(wired, amqp, operator):
    declare_app_queue(amqp, "one.other")
    first, second = stored_dead_letters("one.original", 2)

    replay_message(first, user=operator, queue="one.other")
    replay_message(second, user=operator, exchange="", routing_key="one.other")

    assert len(consume_until_idle("one.other")) == 2


def test_a_missing_target_exchange_fails_without_losing_the_message(wired, operator):
    [message] = stored_dead_letters("one.x", 1)

    attempt = replay_message(message, user=operator, exchange="one.no-such-exchange")

    assert attempt.outcome == ReplayAttempt.Outcome.FAILED
    assert "404" in attempt.detail
    message.refresh_from_db()
    assert message.status == Status.PENDING


def test_a_delayed_replay_waits_in_a_ttl_queue_then_arrives(wired, amqp, operator, settings):
    settings.REPLAY_DELAYS = [1, 10]
    declare_app_queue(amqp, "one.later")
    [message] = stored_dead_letters("one.later", 1, body=b"later")

    started = time.monotonic()
    attempt = replay_message(message, user=operator, delay_seconds=1)

    assert attempt.outcome == ReplayAttempt.Outcome.CONFIRMED
    assert "recovery.delay.1s" in attempt.detail
    assert queue_depth("one.later") == 0  # still waiting
    deadline = started + 10
    while queue_depth("one.later") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() - started >= 0.9
    [(props, body)] = consume_until_idle("one.later")
    assert body == b"later" and props.message_id == message.message_id


def test_a_delayed_replay_declares_its_route_on_the_connection_it_publishes_on(
    wired, amqp, operator, settings, monkeypatch
):
    """RabbitMQ 4.2+ (Khepri) confirms a declaration at a majority: a publish on another
    connection, maybe to another node, may not find the new delay exchange yet."""
    import pika

    settings.REPLAY_DELAYS = [3]
    amqp.exchange_delete("recovery.delay.3s")
    amqp.queue_delete("recovery.delay.3s")
    declare_app_queue(amqp, "one.khepri")
    [message] = stored_dead_letters("one.khepri", 1, body=b"k")
    opened = []  # every connection a one-click replay opens
    real = pika.BlockingConnection
    monkeypatch.setattr(
        pika, "BlockingConnection", lambda *a, **k: opened.append(1) or real(*a, **k)
    )

    attempt = replay_message(message, user=operator, delay_seconds=3)

    assert attempt.outcome == ReplayAttempt.Outcome.CONFIRMED
    assert "recovery.delay.3s" in attempt.detail
    assert len(opened) == 1  # the declaration and the publish: one connection
    assert queue_depth("recovery.delay.3s") == 1
    amqp.queue_delete("recovery.delay.3s")
    amqp.exchange_delete("recovery.delay.3s")


def test_a_delay_that_is_not_configured_is_refused(wired, operator):
    [message] = stored_dead_letters("one.d", 1)

    with pytest.raises(ValidationError) as error:
        replay_message(message, user=operator, delay_seconds=7)

    assert "delay_seconds" in error.value.message_dict
    message.refresh_from_db()
    assert message.status == Status.PENDING


def test_a_discarded_message_cannot_be_replayed_until_restored(wired, amqp, operator):
    declare_app_queue(amqp, "one.disc")
    [message] = stored_dead_letters("one.disc", 1)

    discard_message(message, operator, reason="test data")

    message.refresh_from_db()
    assert message.status == Status.DISCARDED and message.discarded_at is not None
    with pytest.raises(StateError):
        replay_message(message, user=operator)
    with pytest.raises(ValidationError):  # StateError is a ValidationError too (forms show it)
        discard_message(message, operator)

    restore_message(message, operator)

    message.refresh_from_db()
    assert message.status == Status.PENDING and message.discarded_at is None
    assert replay_message(message, user=operator).outcome == "confirmed"
    actions = list(
        Activity.objects.filter(message=message).order_by("id").values_list("action", flat=True)
    )
    assert actions == ["discard", "restore", "replay"]
    assert Activity.objects.get(action="discard").detail["reason"] == "test data"


def test_restore_gives_back_the_status_it_had(wired, operator):
    [message] = stored_dead_letters("one.poison", 1)
    Message.objects.filter(pk=message.pk).update(status=Status.POISONED)
    message.refresh_from_db()

    discard_message(message, operator)
    restore_message(message, operator)

    message.refresh_from_db()
    assert message.status == Status.POISONED


def test_edit_and_replay_sends_the_edit_and_keeps_the_original(wired, amqp, operator):
    declare_app_queue(amqp, "one.edit")
    [message] = stored_dead_letters("one.edit", 1, body=b'{"qty": -1}', headers={"v": 1})
    original_headers = dict(message.headers)

    attempt = edit_and_replay(
        message,
        operator,
        headers_json='{"v": 2, "fixed": true, "amount": {"$t": "decimal", "v": "9.50"}}',
        body='{"qty": 1}',
    )

    assert attempt.outcome == "confirmed" and attempt.edited
    [(props, body)] = consume_until_idle("one.edit")
    assert body == b'{"qty": 1}'
    assert props.headers["v"] == 2 and props.headers["fixed"] is True
    assert props.headers["amount"] == decimal.Decimal("9.50")
    assert props.message_id == message.message_id
    message.refresh_from_db()
    assert message.body_bytes == b'{"qty": -1}' and message.headers == original_headers
    edit = MessageEdit.objects.get(message=message)
    assert edit.user == operator and bytes(edit.body) == b'{"qty": 1}'
    assert edit.attempt == attempt and edit.headers["v"] == 2
    assert Activity.objects.get(action="edit_replay").detail["edit"] == edit.pk


@pytest.mark.parametrize(
    ("headers_json", "body"),
    [("{not json", None), ("[1, 2]", None), ({"bad": {"$t": "nope", "v": 1}}, None), (None, 5)],
)
def test_a_bad_edit_is_refused_and_nothing_is_sent(wired, operator, headers_json, body):
    [message] = stored_dead_letters("one.bad", 1)

    with pytest.raises(ValidationError) as error:
        edit_and_replay(message, operator, headers_json=headers_json, body=body)

    assert set(error.value.message_dict) <= {"headers_json", "body"}
    assert not ReplayAttempt.objects.exists() and not MessageEdit.objects.exists()
    message.refresh_from_db()
    assert message.status == Status.PENDING


def test_a_replay_without_a_broker_leaves_the_message_as_it_was(wired, operator, settings):
    from recovery.errors import BrokerUnavailable

    [message] = stored_dead_letters("one.down", 1)
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens there

    with pytest.raises(BrokerUnavailable, match="broker unavailable"):
        replay_message(message, user=operator)

    message.refresh_from_db()
    assert message.status == Status.PENDING
    assert not ReplayAttempt.objects.exists()
