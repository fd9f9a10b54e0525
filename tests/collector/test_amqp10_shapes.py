"""AMQP 1.0 dead letters (RabbitMQ 4.0+) as a 0-9-1 consumer receives them: the consumer's
`modified` annotations and an id 0-9-1 cannot carry arrive as headers. 3.10 speaks no AMQP 1.0
the 4.x way, so the message is published over 0-9-1 with those headers, and rejected."""

import pytest

from tests.helpers import declare_app_queue, publish
from tests.helpers.collector import reject_next, stored

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_binary_id_and_the_dead_letter_annotations_are_kept(collector, amqp):
    declare_app_queue(amqp, "amqp10.orders")
    annotations = {
        "x-opt-dead-letter-category": "business-logic",
        "x-opt-dead-letter-reason": "Customer 4411 not eligible for discount",
    }
    publish(amqp, "amqp10.orders", b"a", headers={"x-message-id": b"\x00\xffid", **annotations})
    publish(
        amqp,
        "amqp10.orders",
        b"b",
        headers={"x-message-id": b"order-77", "x-correlation-id": b"c" * 300, **annotations},
    )
    for _ in range(2):
        reject_next(amqp, "amqp10.orders")

    one, two = sorted(stored(2, source_queue="amqp10.orders"), key=lambda m: m.body)
    assert one.message_id == "hex:00ff6964"
    assert (two.message_id, two.correlation_id) == ("order-77", "c" * 255)
    # Grouped on the consumer's reason like a framework's exception headers (numbers folded).
    assert one.group_key == two.group_key
    assert one.group_label == (
        "amqp10.orders · rejected · business-logic · Customer # not eligible for discount"
    )
