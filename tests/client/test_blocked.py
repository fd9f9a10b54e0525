"""ReliablePublisher under a broker resource alarm (``connection.blocked``): it holds the messages
in its retry cache, confirms nothing falsely and gives nothing up, then resumes on unblock."""

import contextlib
import logging
import subprocess
import time

import pika
import pika.frame
import pika.spec
import pytest

from recovery.client import ReliablePublisher
from tests.client.conftest import read_jsonl
from tests.helpers import drain, wait_for


@contextlib.contextmanager
def blocking_channel(url):
    """A short-lived channel: an idle one would have to outlive the alarm."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def rabbitmqctl(*args):
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True)


def test_it_holds_messages_while_blocked_and_resumes_on_unblock(amqp_url, names, caplog):
    """The loop's blocked/unblocked callbacks called on its I/O thread, the broker real: while
    blocked nothing is sent, timed out or given up; after unblock everything is confirmed."""
    with blocking_channel(amqp_url) as channel:
        channel.queue_declare(names["queue"], durable=True)
    publisher = ReliablePublisher(
        amqp_url,
        producer="alarmed",
        returns_queue=names["returns"],
        confirm_timeout=0.3,
        give_up_after=0.5,
    )
    try:
        first = publisher.publish("", names["queue"], b"before")
        assert publisher.flush(timeout=20)  # connected and confirming
        alarm = pika.frame.Method(0, pika.spec.Connection.Blocked(reason="low on disk"))
        with caplog.at_level(logging.INFO, logger="recovery.client.publisher"):
            publisher._call_soon(lambda: publisher._on_blocked(None, alarm))
            wait_for(lambda: publisher.blocked, message="blocked")
            held = [publisher.publish("", names["queue"], f"held-{i}".encode()) for i in range(20)]
            # Well past confirm_timeout and give_up_after: still owned, none sent.
            assert not publisher.flush(timeout=1.5)
            assert publisher.owned == len(held)
            with blocking_channel(amqp_url) as channel:
                queued = channel.queue_declare(names["queue"], passive=True).method.message_count
            assert queued == 1
            publisher._call_soon(lambda: publisher._on_unblocked(None, None))
            assert publisher.flush(timeout=20)
        assert not publisher.blocked
        assert "blocked the connection (low on disk): holding" in caplog.text
        assert "unblocked the connection" in caplog.text
    finally:
        publisher.close()
    with blocking_channel(amqp_url) as channel:
        got = drain(channel, names["queue"])
        assert drain(channel, names["returns"]) == []
    assert [p.message_id for p, _ in got] == [first, *held]


@pytest.mark.disruptive
def test_a_real_disk_alarm_blocks_the_publisher_and_loses_nothing(
    amqp_url, management, names, tmp_path, caplog
):
    """The disk free limit set above the free space (as tests/broker's alarm test does): the
    broker blocks the publishing connection; nothing is confirmed or given up while the alarm
    lasts; once it clears, every message is confirmed and arrives, once."""
    with blocking_channel(amqp_url) as channel:
        channel.queue_declare(names["queue"], durable=True)
    [before] = management.request("GET", "/nodes")
    assert not before["disk_free_alarm"]
    publisher = ReliablePublisher(
        amqp_url,
        producer="alarm",
        log_dir=tmp_path,
        returns_queue=names["returns"],
        confirm_timeout=1.0,
        give_up_after=2.0,
    )
    try:
        first = publisher.publish("", names["queue"], b"before the alarm")
        assert publisher.flush(timeout=20)
        try:
            rabbitmqctl("set_disk_free_limit", str(before["disk_free"] * 10))
            wait_for(
                lambda: management.request("GET", "/nodes")[0]["disk_free_alarm"],
                timeout=30,
                message="the disk alarm",
            )
            with caplog.at_level(logging.WARNING, logger="recovery.client.publisher"):
                held = [
                    publisher.publish("", names["queue"], f"held-{i}".encode()) for i in range(50)
                ]
                wait_for(lambda: publisher.blocked, timeout=20, message="the publisher blocked")
                time.sleep(3)  # past confirm_timeout and give_up_after
            assert publisher.owned == len(held)  # none confirmed, none given up
            assert "the broker blocked the connection" in caplog.text
        finally:
            rabbitmqctl("set_disk_free_limit", str(before["disk_free_limit"]))
            wait_for(
                lambda: not management.request("GET", "/nodes")[0]["disk_free_alarm"],
                timeout=30,
                message="the disk alarm cleared",
            )
        assert publisher.flush(timeout=30)
        assert not publisher.blocked
    finally:
        publisher.close()
    with blocking_channel(amqp_url) as channel:
        got = drain(channel, names["queue"])
        assert drain(channel, names["returns"]) == []
    assert sorted(p.message_id for p, _ in got) == sorted([first, *held])
    lines = read_jsonl(tmp_path, "producer")
    assert len(lines) == 1 + len(held)  # one attempt each: nothing resent
    assert {line["outcome"] for line in lines} == {"ack"}
