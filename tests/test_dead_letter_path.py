"""The spine, end to end: app queue -> DLX -> collector -> store -> replay -> app queue."""

import datetime
import decimal
import json

import pytest
from django.conf import settings

from recovery.models import Kind, Message, Reason, Status
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import receive, reject_all, stored

ODD_HEADERS = {
    "str": "héllo",
    "int": 42,
    "big": 2**40,
    "neg": -7,
    "float": 1.5,
    "decimal": decimal.Decimal("12.50"),
    "bool": True,
    "none": None,
    "ts": datetime.datetime(2026, 11, 21, 12, 30, 5),
    "bytes": b"\x00\xff\xfe",
    "table": {"nested": {"deep": [1, "two", False]}, "$t": "looks like a tag"},
    "array": [1, "a", 2.25, None, {"k": "v"}],
}


@pytest.mark.django_db(transaction=True)
def test_it_stores_a_rejected_message_with_exact_body_and_headers(collector, amqp):
    declare_app_queue(amqp, "app.orders")
    body = b"\x00\x01binary \xff body \xc3\x28"
    publish(
        amqp,
        "app.orders",
        body,
        message_id="m-1",
        correlation_id="c-1",
        content_type="application/octet-stream",
        headers=ODD_HEADERS,
        priority=3,
        app_id="shop",
        type="order.created",
    )
    assert reject_all(amqp, "app.orders", 1) == 1

    [message] = stored(message_id="m-1")
    assert message.kind == Kind.DEAD_LETTER
    assert message.reason == Reason.REJECTED
    assert message.source_queue == "app.orders"
    assert message.vhost == settings.RECOVERY_VHOSTS[0]
    assert message.body_bytes == body
    assert message.body_size == len(body)
    assert message.correlation_id == "c-1"
    assert message.death_count == 1
    assert message.status == Status.PENDING
    wire = message.wire_headers
    for key, value in ODD_HEADERS.items():
        assert wire[key] == value, key
        assert type(wire[key]) is type(value), key
    assert message.properties["priority"] == 3
    assert message.properties["app_id"] == "shop"
    assert message.x_death[0]["queue"] == "app.orders"
    assert message.x_death[0]["reason"] == "rejected"


@pytest.mark.django_db(transaction=True)
def test_it_stores_expired_and_overflowed_messages(collector, amqp):
    declare_app_queue(amqp, "app.ttl", **{"x-message-ttl": 50})
    declare_app_queue(amqp, "app.small", **{"x-max-length": 2})
    publish(amqp, "app.ttl", b"late", message_id="ttl-1")
    for i in range(5):
        publish(amqp, "app.small", f"n{i}".encode(), message_id=f"max-{i}")

    [expired] = stored(message_id="ttl-1")
    assert (expired.kind, expired.reason, expired.source_queue) == (
        Kind.DEAD_LETTER,
        Reason.EXPIRED,
        "app.ttl",
    )
    overflowed = stored(3, reason=Reason.MAXLEN)
    assert sorted(m.message_id for m in overflowed) == ["max-0", "max-1", "max-2"]
    assert {m.source_queue for m in overflowed} == {"app.small"}
    assert sorted(bytes(m.body) for m in overflowed) == [b"n0", b"n1", b"n2"]


@pytest.mark.django_db(transaction=True)
def test_it_replays_through_the_api_to_the_queue_it_died_in(collector, amqp, api, operator):
    declare_app_queue(amqp, "app.pay")
    body = json.dumps({"amount": "9.99"}).encode()
    publish(amqp, "app.pay", body, message_id="pay-1", headers={"tenant": "acme"})
    reject_all(amqp, "app.pay", 1)
    [message] = stored(message_id="pay-1")

    response = api.as_user(operator).post(f"/api/v1/messages/{message.pk}/replay")

    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "confirmed"
    props, received = receive(amqp, "app.pay")
    assert received == body
    assert props.message_id == "pay-1"
    assert props.headers["tenant"] == "acme"
    assert props.headers["x-recovery-replay-count"] == 1
    assert props.headers["x-recovery-origin"] == message.pk
    assert props.headers["x-recovery-replayed-by"] == "otto"
    assert "x-death" not in props.headers
    message.refresh_from_db()
    assert (message.status, message.replay_count) == (Status.REPLAYED, 1)


@pytest.mark.django_db(transaction=True)
def test_it_replays_from_the_console_button(collector, amqp, client, operator):
    declare_app_queue(amqp, "app.console")
    publish(amqp, "app.console", b"press the button", message_id="btn-1")
    reject_all(amqp, "app.console", 1)
    [message] = stored(message_id="btn-1")
    client.force_login(operator)

    page = client.get(f"/messages/{message.pk}/")
    assert b'id="replay-button"' in page.content
    response = client.post(f"/messages/{message.pk}/replay", HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert b"replayed" in response.content
    props, received = receive(amqp, "app.console")
    assert (props.message_id, received) == ("btn-1", b"press the button")


@pytest.mark.django_db(transaction=True)
def test_it_leaves_a_returned_replay_pending_with_the_reason(collector, amqp, api, operator):
    declare_app_queue(amqp, "app.gone")
    publish(amqp, "app.gone", b"x", message_id="gone-1")
    reject_all(amqp, "app.gone", 1)
    [message] = stored(message_id="gone-1")
    amqp.queue_delete("app.gone")

    response = api.as_user(operator).post(f"/api/v1/messages/{message.pk}/replay")

    assert response.json()["outcome"] == "returned"
    message.refresh_from_db()
    assert message.status == Status.PENDING
    assert "NO_ROUTE" in message.status_reason


@pytest.mark.django_db(transaction=True)
def test_a_redelivered_dead_letter_does_not_create_a_second_row(wired, clean_queues, amqp):
    """A collector that committed but crashed before its ack: the broker redelivers."""
    import psycopg

    from recovery.collector.consumer import start_collectors, stop_collectors
    from recovery.collector.insert import store_rows
    from recovery.collector.rows import delivery_to_row
    from recovery.db import database_conninfo

    declare_app_queue(amqp, "app.redeliver")
    publish(amqp, "app.redeliver", b"once", message_id="re-1")
    reject_all(amqp, "app.redeliver", 1)
    method, props, body = wait_for(
        lambda: (lambda r: r if r[0] else None)(amqp.basic_get("recovery.dead_letters")),
        message="the dead letter",
    )
    row = delivery_to_row(
        wired, "recovery.dead_letters", method.exchange, method.routing_key, props, body
    )
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        assert store_rows(pg, [row]) == 1
    amqp.basic_nack(method.delivery_tag, requeue=True)  # "crash" before the ack

    stop_event, threads = start_collectors(flush_seconds=0.05)
    try:
        depth = lambda: amqp.queue_declare("recovery.dead_letters", passive=True).method  # noqa: E731
        wait_for(lambda: depth().message_count == 0, message="the DLQ to drain")
        time_to_settle = 0.5
        amqp.connection.sleep(time_to_settle)
    finally:
        stop_collectors(stop_event, threads)
    assert Message.objects.filter(message_id="re-1").count() == 1
