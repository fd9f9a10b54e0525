"""Every source the collector drains, with the kind and reason RabbitMQ or the client gives it."""

import datetime

import pytest

from recovery.models import Kind, Reason, Status
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import reject_next, stored

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_stores_every_dead_letter_reason(collector, amqp):
    declare_app_queue(amqp, "src.rejects")
    declare_app_queue(amqp, "src.ttl", **{"x-message-ttl": 20})
    declare_app_queue(amqp, "src.small", **{"x-max-length": 1})
    declare_app_queue(amqp, "src.quorum", **{"x-queue-type": "quorum", "x-delivery-limit": 1})
    publish(amqp, "src.rejects", b"r", message_id="why-rejected")
    reject_next(amqp, "src.rejects")
    publish(amqp, "src.ttl", b"t", message_id="why-expired")
    publish(amqp, "src.small", b"m1", message_id="why-maxlen")
    publish(amqp, "src.small", b"m2", message_id="stays")
    publish(amqp, "src.quorum", b"q", message_id="why-delivery-limit")
    # A quorum queue dead-letters a message once it was delivered more than the limit.
    for _ in range(2):
        method, _props, _body = wait_for(
            lambda: (lambda r: r if r[0] else None)(amqp.basic_get("src.quorum")),
            message="the quorum queue delivery",
        )
        amqp.basic_nack(method.delivery_tag, requeue=True)

    expected = {
        "why-rejected": (Reason.REJECTED, "src.rejects"),
        "why-expired": (Reason.EXPIRED, "src.ttl"),
        "why-maxlen": (Reason.MAXLEN, "src.small"),
        "why-delivery-limit": (Reason.DELIVERY_LIMIT, "src.quorum"),
    }
    rows = stored(4, message_id__in=expected)
    for row in rows:
        assert (row.kind, row.reason, row.source_queue) == (
            Kind.DEAD_LETTER,
            *expected[row.message_id],
        )
        assert row.death_count == 1
        assert row.first_death_at is not None and row.first_death_at == row.last_death_at
        assert row.routing_keys == [row.source_queue]
        assert row.status == Status.PENDING
        assert row.headers["x-first-death-queue"] == row.source_queue
        assert row.headers["x-first-death-reason"] == row.reason
        # The recovery queue's own delivery counter describes our queue, not the message.
        assert "x-delivery-count" not in row.headers


def test_it_keeps_the_whole_death_history(collector, amqp):
    """A retry loop: rejected in A, expired in a delay queue B, back to A... then to the DLX."""
    amqp.exchange_delete("hist.retry")
    amqp.exchange_declare("hist.retry", "fanout")
    amqp.queue_delete("hist.a")
    amqp.queue_delete("hist.delay")
    amqp.queue_declare("hist.a", arguments={"x-dead-letter-exchange": "hist.retry"})
    amqp.queue_declare(
        "hist.delay",
        arguments={
            "x-message-ttl": 10,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "hist.a",
        },
    )
    amqp.queue_bind("hist.delay", "hist.retry")
    publish(amqp, "hist.a", b"try me", message_id="hist-1")
    reject_next(amqp, "hist.a")  # -> delay -> expires -> back to A
    reject_next(amqp, "hist.a")
    # Third failure: the operator's policy sends it to Lazarus instead of the delay queue.
    amqp.queue_unbind("hist.delay", "hist.retry")
    amqp.exchange_bind("recovery.dlx", "hist.retry", "#")
    reject_next(amqp, "hist.a")

    [row] = stored(message_id="hist-1")
    assert (row.kind, row.reason, row.source_queue) == (Kind.DEAD_LETTER, Reason.REJECTED, "hist.a")
    assert row.death_count == 3 + 2
    deaths = row.x_death
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("hist.a", "rejected", 3),
        ("hist.delay", "expired", 2),
    ]
    assert deaths[1]["exchange"] == "hist.retry"
    assert row.headers["x-first-death-queue"] == "hist.a"
    assert row.headers["x-first-death-reason"] == "rejected"
    assert row.first_death_at <= row.last_death_at
    assert row.default_target() == ("", "hist.a")


def test_it_stores_what_the_alternate_exchange_caught(collector, amqp):
    amqp.exchange_delete("src.orders")
    amqp.exchange_declare(
        "src.orders", "topic", durable=True, arguments={"alternate-exchange": "recovery.unrouted"}
    )
    publish(amqp, "orders.eu.42.created", b'{"id": 42}', exchange="src.orders", message_id="lost-1")

    [row] = stored(message_id="lost-1")
    # The delivery from recovery.unrouted still names the exchange it was published to and its
    # routing key: that is where a replay sends it back.
    assert (row.kind, row.reason) == (Kind.UNROUTABLE, Reason.NO_ROUTE)
    assert (row.source_exchange, row.routing_keys) == ("src.orders", ["orders.eu.42.created"])
    assert row.source_queue == ""
    assert row.death_count == 0
    assert row.default_target() == ("src.orders", "orders.eu.42.created")
    assert row.group_label == "src.orders → orders.eu.#.created · no_route"
    assert bytes(row.body) == b'{"id": 42}'


@pytest.mark.parametrize(
    ("kind", "reason", "detail"),
    [
        ("returned", "no_route", "312 NO_ROUTE"),
        ("nacked", "nack", None),
        ("unconfirmed", "timeout", None),
    ],
)
def test_it_stores_what_the_client_library_handed_over(collector, amqp, kind, reason, detail):
    first_attempt = datetime.datetime(2026, 11, 21, 8, 30, 0)
    headers = {
        "tenant": "acme",
        "x-recovery-kind": kind,
        "x-recovery-reason": reason,
        "x-recovery-exchange": "billing",
        "x-recovery-routing-key": "invoice.created",
        "x-recovery-attempts": 3,
        "x-recovery-first-attempt-at": first_attempt,
        "x-recovery-producer": "billing-api",
    }
    if detail:
        headers["x-recovery-detail"] = detail
    publish(amqp, "recovery.returns", b"invoice", message_id=f"ret-{kind}", headers=headers)

    [row] = stored(message_id=f"ret-{kind}")
    assert (row.kind, row.reason) == (kind, reason)
    assert (row.source_exchange, row.routing_keys, row.source_queue) == (
        "billing",
        ["invoice.created"],
        "",
    )
    assert row.death_count == 3  # attempts
    assert row.first_death_at == first_attempt.replace(tzinfo=datetime.UTC)
    assert row.default_target() == ("billing", "invoice.created")
    assert row.headers["x-recovery-producer"] == "billing-api"
    # Numbers in a detail would make every message its own group.
    suffix = " · # NO_ROUTE" if detail else ""
    assert row.group_label == f"billing → invoice.created · {reason}{suffix}"


def test_a_message_in_the_returns_queue_without_the_contract_is_still_stored(collector, amqp):
    publish(amqp, "recovery.returns", b"who sent this", message_id="stray-1")
    publish(
        amqp,
        "recovery.returns",
        b"odd reason",
        message_id="stray-2",
        headers={"x-recovery-kind": "nacked", "x-recovery-reason": "gremlins"},
    )

    first, second = stored(2, message_id__in=["stray-1", "stray-2"])
    assert (first.kind, first.reason) == (Kind.RETURNED, Reason.UNKNOWN)
    # A known kind with an unknown reason keeps the kind and takes the kind's reason.
    assert (second.kind, second.reason) == (Kind.NACKED, Reason.NACK)


def test_a_letter_published_to_the_dlx_by_a_framework_goes_back_where_it_came_from(collector, amqp):
    """Spring's RepublishMessageRecoverer: no x-death, x-original-* and exception headers."""
    publish(
        amqp,
        "orders.created",
        b"{}",
        exchange="recovery.dlx",
        message_id="spring-1",
        headers={
            "x-original-exchange": "orders",
            "x-original-routingKey": "orders.created",
            "x-exception-message": "Order 1234 not found",
            "x-exception-stacktrace": "java.lang.IllegalStateException: ...",
        },
    )

    [row] = stored(message_id="spring-1")
    assert (row.kind, row.reason, row.source_queue) == (Kind.DEAD_LETTER, Reason.UNKNOWN, "")
    assert (row.source_exchange, row.routing_keys) == ("orders", ["orders.created"])
    assert row.default_target() == ("orders", "orders.created")
    assert row.group_label == "orders → orders.created · unknown · Order # not found"
