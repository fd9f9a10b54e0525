"""The library producers and consumers embed so that Lazarus sees every message: no Django here.

``ReliablePublisher`` publishes with confirms and hands anything the broker would not take to
Lazarus; ``IdempotentConsumer`` consumes with manual acks and dedup by message_id; both write the
audit logs of ``LOGS.md``. ``forward_outbox`` is what Lazarus calls to move outbox rows on.
"""

from recovery.client.consumer import Delivery, IdempotentConsumer
from recovery.client.outbox import forward_outbox
from recovery.client.publisher import ReliablePublisher

__all__ = ["Delivery", "IdempotentConsumer", "ReliablePublisher", "forward_outbox"]
