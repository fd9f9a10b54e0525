"""ReliablePublisher under a broker resource alarm (``connection.blocked``): it holds the messages
in its retry cache, confirms nothing falsely and gives nothing up, then resumes on unblock."""

import contextlib
import logging
import subprocess
import time

import pika
import pika.frame
import pika.spec
import psycopg
import pytest

from recovery.client import ReliablePublisher
from recovery.client.outbox import OUTBOX_DDL, ensure_tables
from recovery.client.publisher import BLOCKED_AT_CLOSE
from tests.helpers import drain, wait_for
from tests.helpers.client import read_jsonl


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


def test_it_hands_what_it_holds_to_the_outbox_when_closed_while_blocked(
    amqp_url, names, pg_dsn, tmp_path, caplog
):
    """Closed during the alarm: the timeouts that would give the held messages up are stopped,
    so close() itself hands every one to the outbox, with the reason; none is lost."""
    with blocking_channel(amqp_url) as channel:
        channel.queue_declare(names["queue"], durable=True)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ensure_tables(conn, OUTBOX_DDL)  # so a missing row fails the assert, not the query
    producer = f"closed-blocked-{names['queue']}"
    publisher = ReliablePublisher(
        amqp_url,
        producer=producer,
        log_dir=tmp_path,
        returns_queue=names["returns"],
        confirm_timeout=0.3,
        give_up_after=0.5,
        outbox_dsn=pg_dsn,
    )
    publisher.publish("", names["queue"], b"before")
    assert publisher.flush(timeout=20)
    alarm = pika.frame.Method(0, pika.spec.Connection.Blocked(reason="low on memory"))
    publisher._call_soon(lambda: publisher._on_blocked(None, alarm))
    wait_for(lambda: publisher.blocked, message="blocked")
    held = [publisher.publish("", names["queue"], f"held-{i}".encode()) for i in range(20)]
    with caplog.at_level(logging.WARNING, logger="recovery.client.publisher"):
        publisher.close(timeout=0.5)  # the alarm never clears

    assert publisher.owned == 0
    assert f"{BLOCKED_AT_CLOSE}: 20 messages go to the outbox" in caplog.text
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT message_id, kind, reason, headers->>'x-recovery-detail', body"
            " FROM recovery_outbox WHERE producer = %s ORDER BY id",
            (producer,),
        ).fetchall()
    assert [r[0] for r in rows] == held
    assert {r[1:4] for r in rows} == {("unconfirmed", "timeout", BLOCKED_AT_CLOSE)}
    assert bytes(rows[0][4]) == b"held-0"
    with blocking_channel(amqp_url) as channel:
        assert len(drain(channel, names["queue"])) == 1  # only "before" went out
    errors = [line for line in read_jsonl(tmp_path, "producer") if line["outcome"] == "error"]
    assert sorted(line["message_id"] for line in errors) == sorted(held)


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
