import json
import time
import uuid

import pika
from django.conf import settings
from django.core.management.base import BaseCommand

from recovery.broker import connect
from recovery.topology import declare_recovery_topology

DEMO_EXCHANGE = "demo.orders"


def declare_demo(channel):
    """Demo exchange and queues, each dead-lettering to the recovery DLX in its own way."""
    dlx = {"x-dead-letter-exchange": settings.RECOVERY_DLX}
    channel.exchange_declare(
        DEMO_EXCHANGE,
        "topic",
        durable=True,
        arguments={"alternate-exchange": settings.RECOVERY_UNROUTED},
    )
    queues = {
        "demo.orders.created": dlx,
        "demo.orders.expiring": {**dlx, "x-message-ttl": 1000},
        "demo.orders.small": {**dlx, "x-max-length": 5},
    }
    for queue, args in queues.items():
        channel.queue_declare(queue, durable=True, arguments=args)
        channel.queue_bind(queue, DEMO_EXCHANGE, queue.removeprefix("demo.") + ".#")
    return list(queues)


class Command(BaseCommand):
    help = "Make demo traffic that really dead-letters: rejects, TTL expiry, overflow, no route."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=10, help="messages per fault per round")
        parser.add_argument(
            "--every",
            type=float,
            default=0,
            help="repeat every N seconds until interrupted (0 = once)",
        )

    def handle(self, *args, count, every, **options):
        while True:
            self.round(count)
            if not every:
                return
            time.sleep(every)

    def round(self, count):
        conn = connect()
        try:
            channel = conn.channel()
            declare_recovery_topology(channel)
            declare_demo(channel)
            channel.confirm_delivery()
            for i in range(count):
                for key in (
                    "orders.created.eu",
                    "orders.expiring.us",
                    "orders.small.eu",
                    "nowhere.at.all",
                ):
                    body = json.dumps({"order": i, "key": key, "amount": "12.50"}).encode()
                    props = pika.BasicProperties(
                        message_id=uuid.uuid4().hex,
                        content_type="application/json",
                        delivery_mode=2,
                        headers={"x-demo": True, "attempt": 1},
                    )
                    channel.basic_publish(DEMO_EXCHANGE, key, body, props)
            # The demo consumer fails every order it reads.
            rejected = 0
            while True:
                method, _props, _body = channel.basic_get("demo.orders.created")
                if method is None:
                    break
                channel.basic_reject(method.delivery_tag, requeue=False)
                rejected += 1
            self.stdout.write(
                f"demo: published {4 * count}, rejected {rejected}, "
                f"{count} expire in 1 s, overflow beyond 5, {count} unroutable"
            )
        finally:
            conn.close()
