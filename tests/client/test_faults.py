"""The seeds' experiment, scaled: force-close every connection while sending, lose nothing.

And the other side of the promise: when the broker is gone for longer than the give-up time,
every given-up message still reaches Lazarus (the outbox, then the returns queue).
"""

import collections
import contextlib
import os
import subprocess
import threading
import time

import pika
import pytest

from recovery.client import IdempotentConsumer, ReliablePublisher
from tests.helpers.client import read_jsonl

FAULT_SENDS = int(os.environ.get("CLIENT_FAULT_SENDS", "200000"))
DROP_EVERY_S = 2.0
WINDOW = 1000


@contextlib.contextmanager
def blocking_channel(url):
    """A short-lived channel: a long-lived one would be force-closed with the rest."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def close_all_connections(vhost):
    subprocess.run(
        ["rabbitmqctl", "-q", "close_all_connections", "--vhost", vhost, "fault test"],
        check=True,
        capture_output=True,
        timeout=30,
    )


class Dropper(threading.Thread):
    """Force-closes every connection of the vhost about every DROP_EVERY_S seconds."""

    def __init__(self, vhost):
        super().__init__(daemon=True)
        self.vhost = vhost
        self.halt = threading.Event()
        self.drops = 0

    def run(self):
        next_drop = time.monotonic() + DROP_EVERY_S
        while not self.halt.wait(max(0.0, next_drop - time.monotonic())):
            close_all_connections(self.vhost)
            self.drops += 1
            next_drop += DROP_EVERY_S


@pytest.mark.slow
def test_force_closed_connections_lose_nothing(amqp_url, vhost, names, tmp_path):
    with blocking_channel(amqp_url) as channel:
        channel.queue_declare(names["queue"], durable=True)
    handled = set()
    all_seen = threading.Event()

    def handler(delivery):
        handled.add(delivery.message_id)
        if len(handled) >= FAULT_SENDS:
            all_seen.set()

    consumer = IdempotentConsumer(
        amqp_url, names["queue"], group="fault", handler=handler, log_dir=tmp_path / "c"
    )
    consumer_thread = threading.Thread(target=consumer.run)
    consumer_thread.start()
    publisher = ReliablePublisher(
        amqp_url,
        producer="fault",
        log_dir=tmp_path / "p",
        window=WINDOW,
        returns_queue=names["returns"],
    )
    dropper = Dropper(vhost)
    dropper.start()
    started = time.monotonic()
    try:
        sent = [publisher.publish("", names["queue"], b"x" * 1024) for _ in range(FAULT_SENDS)]
        assert publisher.flush(timeout=60)
        assert all_seen.wait(120), f"consumer saw {len(handled)} of {FAULT_SENDS}"
    finally:
        dropper.halt.set()
        dropper.join()
        publisher.close()
        consumer.stop()
        consumer_thread.join(10)
    elapsed = time.monotonic() - started

    assert dropper.drops >= 1
    assert handled == set(sent)
    # Nothing given up: the returns queue stayed empty, no attempt was a give-up.
    with blocking_channel(amqp_url) as channel:
        returns = channel.queue_declare(names["returns"], passive=True).method.message_count
    assert returns == 0
    producer_lines = read_jsonl(tmp_path / "p", "producer")
    acked = {line["message_id"] for line in producer_lines if line["outcome"] == "ack"}
    assert acked == set(sent)
    assert {line["outcome"] for line in producer_lines} <= {"ack", "error"}
    # A producer duplicate can only come from an attempt cut off by a drop (outcome "error"):
    # at most the window in flight at each drop.
    cut_attempts = sum(1 for line in producer_lines if line["outcome"] == "error")
    assert cut_attempts <= WINDOW * dropper.drops
    deliveries = collections.Counter(
        line["message_id"] for line in read_jsonl(tmp_path / "c", "consumer")
    )
    assert set(deliveries) == set(sent)
    duplicates = sum(deliveries.values()) - len(deliveries)
    print(
        f"\n{FAULT_SENDS} sends in {elapsed:.1f}s, {dropper.drops} forced drops, "
        f"{cut_attempts} resent attempts, {duplicates} duplicate deliveries (all skipped)"
    )
