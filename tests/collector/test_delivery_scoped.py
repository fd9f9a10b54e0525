"""Headers a quorum queue stamps on each delivery (x-delivery-count; x-acquired-count from
RabbitMQ 4.3) describe the delivery, not the message: a redelivery carrying other values is the
message already stored, and a replay does not send them."""

import datetime

import pytest

from recovery.models import Message
from tests.helpers import publish, wait_for
from tests.helpers.collector import stored

pytestmark = pytest.mark.django_db(transaction=True)

DEATH = {
    "count": 1,
    "reason": "rejected",
    "queue": "scoped.orders",
    "time": datetime.datetime(2026, 11, 26, 12, 0, 0),
    "exchange": "",
    "routing-keys": ["scoped.orders"],
}


def test_the_same_message_with_other_acquired_counts_is_stored_once(collector, amqp):
    """3.10 sets no x-acquired-count: the broker is emulated by publishing the dead letter as a
    4.3 redelivery would arrive, twice, with the counters a 4.3 quorum queue would stamp."""
    for acquired, delivered in ((1, 0), (2, 1)):
        headers = {
            "x-death": [DEATH],
            "tenant": "a",
            "x-acquired-count": acquired,
            "x-delivery-count": delivered,
        }
        publish(amqp, "recovery.dead_letters", b"once", message_id="scoped-1", headers=headers)
    # One different message after them: once it is stored, both copies were processed.
    publish(
        amqp,
        "recovery.dead_letters",
        b"after",
        message_id="scoped-2",
        headers={"x-death": [DEATH]},
    )
    stored(message_id="scoped-2")
    wait_for(
        lambda: amqp.queue_declare("recovery.dead_letters", passive=True).method.message_count == 0,
        message="the collector to ack both copies",
    )

    [message] = Message.objects.filter(message_id="scoped-1")
    assert message.headers.keys() == {"x-death", "tenant"}
    assert message.source_queue == "scoped.orders"


def test_a_replay_does_not_send_the_delivery_counters():
    from recovery.replay.wire import wire_message
    from tests.helpers import make_message

    message = make_message(
        headers={"tenant": "a", "x-acquired-count": 4, "x-delivery-count": 3},
    )
    properties, _body = wire_message(message)
    assert "x-acquired-count" not in properties.headers
    assert "x-delivery-count" not in properties.headers
    assert properties.headers["tenant"] == "a"
