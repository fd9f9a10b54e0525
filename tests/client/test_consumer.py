"""IdempotentConsumer against the real broker: dedup, poison messages to the DLX, PG dedup."""

import threading

import pika
import psycopg

from recovery.client import IdempotentConsumer
from tests.helpers.client import consume_n, read_jsonl


def publish(channel, queue, message_id, body=b"x"):
    channel.basic_publish("", queue, body, pika.BasicProperties(message_id=message_id))


def run_until(consumer, condition, timeout=15):
    """Run the consumer in a thread until ``condition()`` holds (checked by the handler side)."""
    thread = threading.Thread(target=consumer.run)
    thread.start()
    try:
        assert condition.wait(timeout), "consumer did not reach the expected state in time"
    finally:
        consumer.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_it_processes_once_and_acks_a_redelivered_duplicate(amqp_url, channel, names, tmp_path):
    channel.queue_declare(names["queue"])
    for message_id in ("a", "b", "a", "c"):
        publish(channel, names["queue"], message_id)
    handled = []
    seen_all = threading.Event()

    def handler(delivery):
        handled.append(delivery.message_id)
        if len(handled) == 3:
            seen_all.set()

    consumer = IdempotentConsumer(
        amqp_url, names["queue"], group="billing", handler=handler, log_dir=tmp_path
    )
    run_until(consumer, seen_all)

    assert handled == ["a", "b", "c"]
    lines = read_jsonl(tmp_path, "consumer")
    assert [(line["message_id"], line["outcome"]) for line in lines] == [
        ("a", "ack"),
        ("b", "ack"),
        ("a", "duplicate_skipped"),
        ("c", "ack"),
    ]
    assert channel.queue_declare(names["queue"], passive=True).method.message_count == 0


def test_it_rejects_a_message_to_the_dlx_after_max_attempts(amqp_url, channel, names, tmp_path):
    channel.exchange_declare(names["dlx"], "fanout")
    channel.queue_declare(names["dead"])
    channel.queue_bind(names["dead"], names["dlx"])
    channel.queue_declare(names["queue"], arguments={"x-dead-letter-exchange": names["dlx"]})
    publish(channel, names["queue"], "poison", b"bad")
    publish(channel, names["queue"], "good", b"ok")
    attempts = []
    good_done = threading.Event()

    def handler(delivery):
        attempts.append(delivery.message_id)
        if delivery.body == b"bad":
            raise ValueError("cannot handle this")
        good_done.set()

    consumer = IdempotentConsumer(
        amqp_url, names["queue"], group="g", handler=handler, log_dir=tmp_path, max_attempts=3
    )
    thread = threading.Thread(target=consumer.run)
    thread.start()
    [(props, body)] = consume_n(channel, names["dead"], 1, timeout=15)
    consumer.stop()
    thread.join(10)

    assert good_done.is_set()
    assert (props.message_id, body) == ("poison", b"bad")
    assert props.headers["x-death"][0]["reason"] == "rejected"
    assert attempts.count("poison") == 3
    outcomes = [line["outcome"] for line in read_jsonl(tmp_path, "consumer")]
    assert outcomes.count("requeue") == 2
    assert outcomes.count("reject") == 1


def test_postgres_dedup_commits_the_handler_work_with_the_processed_id(
    amqp_url, channel, names, pg_dsn
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ledger (message_id text, amount int)")
    channel.queue_declare(names["queue"])
    for message_id in ("t1", "t2", "t1", "boom", "t3"):
        publish(channel, names["queue"], message_id, b"10")
    done = threading.Event()

    def handler(delivery, db):
        db.execute("INSERT INTO ledger VALUES (%s, %s)", (delivery.message_id, int(delivery.body)))
        if delivery.message_id == "boom":
            raise RuntimeError("fails after writing: the write must roll back")
        if delivery.message_id == "t3":
            done.set()

    consumer = IdempotentConsumer(
        amqp_url,
        names["queue"],
        group=names["queue"],
        handler=handler,
        dedup=pg_dsn,
        max_attempts=1,
    )
    run_until(consumer, done)

    with psycopg.connect(pg_dsn) as conn:
        ledger = conn.execute("SELECT message_id FROM ledger ORDER BY message_id").fetchall()
        processed = conn.execute(
            "SELECT message_id FROM recovery_processed WHERE consumer_group = %s"
            " ORDER BY message_id",
            (names["queue"],),
        ).fetchall()
    assert ledger == [("t1",), ("t2",), ("t3",)]
    assert processed == ledger


def test_stop_returns_promptly_on_an_idle_queue(amqp_url, channel, names):
    channel.queue_declare(names["queue"])
    consumer = IdempotentConsumer(amqp_url, names["queue"], group="g", handler=lambda d: None)
    thread = threading.Thread(target=consumer.run)
    thread.start()
    threading.Event().wait(0.5)
    consumer.stop()
    thread.join(2)
    assert not thread.is_alive()
