"""The recovery topology (``recovery.broker.topology``): ``wire`` and its policies, with the real
broker and the real collector."""

import pika
import pytest
from django.conf import settings

from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import reject_all, stored


@pytest.mark.django_db(transaction=True)
def test_wire_makes_matching_queues_dead_letter_by_policy(collector, amqp, wired):
    from recovery.broker.management import Management
    from recovery.broker.topology import wire

    wire(wired, queues_regex=r"^policy\.")
    amqp.queue_delete("policy.orders")
    amqp.queue_declare("policy.orders", durable=True)  # no DLX argument: the policy adds it
    management = Management()
    wait_for(
        lambda: management.queue(wired, "policy.orders").get("policy"),
        message="the policy to apply",
    )
    publish(amqp, "policy.orders", b"by policy", message_id="pol-1")
    reject_all(amqp, "policy.orders", 1)

    [message] = stored(message_id="pol-1")
    assert message.source_queue == "policy.orders"
    assert wire(wired, queues_regex=r"^policy\.")["queue_policy"]  # idempotent


def _return_once(way, queue):
    """Take the message from ``queue`` on a connection of its own and give it back the way
    ``way`` says: each is a return that RabbitMQ 4.0-4.2 counts against the delivery limit."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    method = wait_for(
        lambda: channel.basic_get(queue)[0], timeout=5, message=f"the message on {queue}"
    )
    if way == "requeue":
        channel.basic_nack(method.delivery_tag, requeue=True)
    elif way == "reject":
        channel.basic_reject(method.delivery_tag, requeue=True)
    elif way == "cancel":
        channel.close()  # a closed channel gives back what it holds unacked
    connection.close()  # "reconnect": the connection goes with the message unacked


def _depth(channel, queue):
    return channel.queue_declare(queue, passive=True).method.message_count


@pytest.mark.slow  # a real collector and a message returned past its limit: ten seconds
@pytest.mark.django_db(transaction=True)
def test_a_message_past_a_recovery_queues_delivery_limit_is_parked_then_stored(
    amqp, wired, clean_queues
):
    """RabbitMQ 4.0 gives quorum queues a delivery limit of 20 and counts every return; an
    operator policy can set one on any version. Emulated with an explicit x-delivery-limit
    (3.10 honours it): the recovery queue parks the message, the collector stores it."""
    from recovery.broker.coverage import uncovered
    from recovery.broker.management import Management
    from recovery.broker.topology import QUORUM, RECOVERY_POLICY, Names
    from recovery.collector.consumer import start_collectors, stop_collectors
    from recovery.models import Message

    names = Names.from_settings()
    management = Management()
    amqp.queue_delete(names.returns)
    amqp.queue_declare(names.returns, durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
    try:
        wait_for(
            lambda: management.queue(wired, names.returns).get("policy") == RECOVERY_POLICY,
            message="the recovery policy to apply",
        )
        [flagged] = [row for row in uncovered(wired, management) if row.name == names.returns]
        assert flagged.problem == "recovery_delivery_limit"
        assert flagged.detail == (
            "delivery limit 2: a message returned to it more often is parked in "
            "recovery.parked (the collector stores it)"
        )
        headers = {"x-recovery-kind": "nacked", "x-recovery-reason": "nack", "app": "shop"}
        publish(amqp, names.returns, b"keep me", message_id="limit-1", headers=headers)
        for way in ("requeue", "cancel", "reject"):
            _return_once(way, names.returns)
        wait_for(lambda: _depth(amqp, names.parked) == 1, message="the message to be parked")
        assert _depth(amqp, names.returns) == 0

        stop_event, threads = start_collectors(flush_seconds=0.05)
        try:
            [message] = stored(message_id="limit-1")
            wait_for(lambda: _depth(amqp, names.parked) == 0, message="the parked message acked")
        finally:
            stop_collectors(stop_event, threads)
        assert message.body == b"keep me"
        assert (message.kind, message.reason) == ("nacked", "nack")
        # Stored as it was in recovery.returns: no death of ours, no delivery counter.
        assert message.headers == headers
        assert Message.objects.count() == 1
    finally:
        amqp.queue_delete(names.returns)
        amqp.queue_declare(names.returns, durable=True, arguments=QUORUM)


def test_wire_puts_the_recovery_policy_on_the_source_queues_only(wired):
    from recovery.broker.management import Management
    from recovery.broker.topology import (
        RECOVERY_POLICY,
        RECOVERY_POLICY_PRIORITY,
        Names,
        recovery_policies,
    )

    names = Names.from_settings()
    [policy] = [p for p in Management().policies(wired) if p["name"] == RECOVERY_POLICY]
    assert policy["priority"] == RECOVERY_POLICY_PRIORITY
    assert policy["pattern"] == r"^(?:recovery\.dead_letters|recovery\.unrouted|recovery\.returns)$"
    # 3.10 (here): no default limit, and a negative delivery-limit would be refused.
    assert policy["definition"] == {
        "dead-letter-exchange": "recovery.parked",
        "dead-letter-strategy": "at-least-once",
        "overflow": "reject-publish",
    }
    # 4.0+ (or a version the API does not say): unlimited, and the quarantine too.
    for version in ((4, 0), (4, 3), None):
        (_, _, definition), (name, pattern, limit) = recovery_policies(names, version)
        assert definition["delivery-limit"] == -1
        assert (name, pattern, limit) == (
            "lazarus-quarantine",
            r"^recovery\.quarantine$",
            {"delivery-limit": -1},
        )


def test_at_least_once_without_reject_publish_is_said_to_be_at_most_once(amqp, wired):
    """RabbitMQ 3.10+ falls back to at-most-once dead-lettering, silently, when a quorum queue
    asks for at-least-once without overflow reject-publish."""
    from recovery.broker.coverage import uncovered
    from recovery.broker.management import Management

    strategy = {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once"}
    declare_app_queue(amqp, "alo.without", **strategy)
    declare_app_queue(amqp, "alo.with", **strategy, **{"x-overflow": "reject-publish"})
    management = Management()
    wait_for(
        lambda: {"alo.without", "alo.with"} <= {q["name"] for q in management.queues(wired)},
        message="both queues listed",
    )
    rows = {r.name: r for r in uncovered(wired, management) if r.name.startswith("alo.")}
    assert set(rows) == {"alo.without"}
    assert rows["alo.without"].problem == "dead_letters_at_most_once"
    assert "overflow drop-head" in rows["alo.without"].detail
    for name in ("alo.without", "alo.with"):
        amqp.queue_delete(name)
