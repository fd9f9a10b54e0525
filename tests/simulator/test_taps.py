"""The simulator's tap queues are durable (RabbitMQ 4.3 refuses a queue that is neither durable
nor exclusive) classic queues that expire when unused."""

import pika
from django.conf import settings

from recovery.broker.management import Management
from recovery.simulator.observe import TAP_EXPIRES_MS, Taps
from tests.helpers import wait_for


def test_the_taps_are_durable_classic_queues_that_expire(wired):
    taps = Taps(
        pika.URLParameters(settings.RABBITMQ_URL),
        "taps-1",
        "recovery.dlx",
        "recovery.unrouted",
        None,
    )
    taps.declare()
    management = Management()
    try:
        for name in (taps.dead_letter_tap, taps.unrouted_tap):
            queue = wait_for(lambda n=name: management.queue(wired, n), message=name)
            assert (queue["durable"], queue["exclusive"], queue["auto_delete"]) == (
                True,
                False,
                False,
            )
            assert queue["type"] == "classic"
            assert queue["arguments"] == {"x-expires": TAP_EXPIRES_MS, "x-queue-type": "classic"}
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        channel = connection.channel()
        for name in (taps.dead_letter_tap, taps.unrouted_tap):
            channel.queue_delete(name)
        connection.close()
