"""The recovery topology (``recovery.broker.topology``): ``wire`` and its policies, with the real
broker and the real collector."""

import pytest

from tests.helpers import publish, wait_for
from tests.test_dead_letter_path import reject_all, stored


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
