"""ReliablePublisher against the real broker: confirms, returns, nacks, give-ups and the outbox."""

import datetime
import socket

import pika
import psycopg
import pytest

from recovery.client import ReliablePublisher, forward_outbox
from tests.helpers.client import consume_n, read_jsonl

RECOVERY_HEADERS = (
    "x-recovery-kind",
    "x-recovery-reason",
    "x-recovery-exchange",
    "x-recovery-routing-key",
    "x-recovery-attempts",
    "x-recovery-first-attempt-at",
    "x-recovery-producer",
)


def closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def test_it_publishes_with_confirms_and_keeps_message_ids(amqp_url, channel, names, tmp_path):
    channel.queue_declare(names["queue"], durable=True)
    publisher = ReliablePublisher(
        amqp_url, producer="orders", log_dir=tmp_path, returns_queue=names["returns"]
    )
    sent = [publisher.publish("", names["queue"], f"body-{i}".encode()) for i in range(500)]
    given = publisher.publish("", names["queue"], b"mine", message_id="order-42")
    assert publisher.flush(timeout=20)
    publisher.close()

    got = consume_n(channel, names["queue"], 501)
    assert [p.message_id for p, _ in got] == [*sent, "order-42"]
    assert given == "order-42"
    assert all(len(m) == 32 for m in sent)  # uuid4 hex
    assert got[0][1] == b"body-0"
    assert got[0][0].delivery_mode == 2
    lines = read_jsonl(tmp_path, "producer")
    assert len(lines) == 501
    assert {line["outcome"] for line in lines} == {"ack"}


def test_it_forwards_a_returned_message_with_recovery_headers(amqp_url, channel, names):
    channel.exchange_declare(names["exchange"], "direct")
    publisher = ReliablePublisher(amqp_url, producer="billing", returns_queue=names["returns"])
    props = pika.BasicProperties(content_type="text/plain", headers={"tenant": "acme"})
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    message_id = publisher.publish(names["exchange"], "nowhere", b"lost?", properties=props)
    assert publisher.flush(timeout=20)
    publisher.close()

    [(props, body)] = consume_n(channel, names["returns"], 1)
    assert body == b"lost?"
    assert props.message_id == message_id
    assert props.content_type == "text/plain"
    headers = props.headers
    assert headers["tenant"] == "acme"
    assert headers["x-recovery-kind"] == "returned"
    assert headers["x-recovery-reason"] == "no_route"
    assert headers["x-recovery-exchange"] == names["exchange"]
    assert headers["x-recovery-routing-key"] == "nowhere"
    assert headers["x-recovery-attempts"] == 1
    assert headers["x-recovery-producer"] == "billing"
    assert headers["x-recovery-first-attempt-at"] >= before
    assert set(RECOVERY_HEADERS) <= set(headers)


def test_it_gives_up_a_message_published_to_a_missing_exchange(amqp_url, channel, names):
    publisher = ReliablePublisher(amqp_url, producer="p", returns_queue=names["returns"])
    publisher.publish(names["exchange"], "k", b"no exchange")
    channel.queue_declare(names["queue"])
    ok = publisher.publish("", names["queue"], b"fine after the channel came back")
    assert publisher.flush(timeout=20)
    publisher.close()

    [(props, _)] = consume_n(channel, names["returns"], 1)
    assert props.headers["x-recovery-kind"] == "returned"
    assert [p.message_id for p, _ in consume_n(channel, names["queue"], 1)] == [ok]


def test_it_retries_nacks_then_forwards_them_as_nacked(amqp_url, channel, names, tmp_path):
    channel.queue_declare(
        names["queue"], arguments={"x-max-length": 5, "x-overflow": "reject-publish"}
    )
    publisher = ReliablePublisher(
        amqp_url, producer="p", log_dir=tmp_path, returns_queue=names["returns"], max_attempts=3
    )
    ids = [publisher.publish("", names["queue"], b"x") for _ in range(8)]
    assert publisher.flush(timeout=20)
    publisher.close()

    forwarded = consume_n(channel, names["returns"], 3)
    assert sorted(p.message_id for p, _ in forwarded) == sorted(ids[5:])
    for props, _ in forwarded:
        assert props.headers["x-recovery-kind"] == "nacked"
        assert props.headers["x-recovery-reason"] == "nack"
        assert props.headers["x-recovery-attempts"] == 3
    nacks = [line for line in read_jsonl(tmp_path, "producer") if line["outcome"] == "nack"]
    assert sorted((line["message_id"], line["attempt"]) for line in nacks) == sorted(
        (mid, attempt) for mid in ids[5:] for attempt in (1, 2, 3)
    )


def test_it_writes_give_ups_to_the_outbox_when_the_broker_is_unreachable(
    amqp_url, channel, names, pg_dsn, tmp_path
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS recovery_outbox")
    publisher = ReliablePublisher(
        closed_port_url(),
        producer="offline",
        log_dir=tmp_path,
        confirm_timeout=0.3,
        max_attempts=2,
        outbox_dsn=pg_dsn,
    )
    ids = [publisher.publish("ex", "rk", f"m{i}".encode()) for i in range(50)]
    assert publisher.flush(timeout=10)
    publisher.close()

    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT message_id, kind, reason, exchange, routing_key, body, producer,"
            " headers->>'x-recovery-kind', forwarded_at FROM recovery_outbox ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == ids
    assert {(r[1], r[2], r[3], r[4], r[6], r[7], r[8]) for r in rows} == {
        ("unconfirmed", "timeout", "ex", "rk", "offline", "unconfirmed", None)
    }
    assert bytes(rows[0][5]) == b"m0"
    lines = read_jsonl(tmp_path, "producer")
    assert sorted(line["message_id"] for line in lines) == sorted(ids)
    assert {line["outcome"] for line in lines} == {"error"}

    channel.queue_declare(names["returns"], durable=True, arguments={"x-queue-type": "quorum"})
    assert forward_outbox(pg_dsn, amqp_url, returns_queue=names["returns"]) == 50
    assert forward_outbox(pg_dsn, amqp_url, returns_queue=names["returns"]) == 0
    forwarded = consume_n(channel, names["returns"], 50)
    assert [p.message_id for p, _ in forwarded] == ids
    assert forwarded[0][0].headers["x-recovery-kind"] == "unconfirmed"
    assert forwarded[0][0].headers["x-recovery-exchange"] == "ex"
    assert isinstance(forwarded[0][0].headers["x-recovery-first-attempt-at"], datetime.datetime)


def test_it_resends_what_a_crashed_producer_left_sending(amqp_url, channel, names, pg_dsn):
    channel.queue_declare(names["queue"])
    crashed = ReliablePublisher(
        closed_port_url(), producer="crashy", store_dsn=pg_dsn, give_up_after=3600
    )
    ids = [crashed.publish("", names["queue"], f"m{i}".encode()) for i in range(20)]
    # The process dies: nothing confirmed, nothing handed over; only its I/O thread is stopped
    # so it does not keep dialling the closed port for the rest of the session.
    crashed._ioloop.add_callback_threadsafe(crashed._shutdown)
    restarted = ReliablePublisher(amqp_url, producer="crashy", store_dsn=pg_dsn)
    assert restarted.flush(timeout=20)
    restarted.close()

    got = consume_n(channel, names["queue"], 20)
    assert [p.message_id for p, _ in got] == ids
    assert [body for _, body in got][:2] == [b"m0", b"m1"]
    with psycopg.connect(pg_dsn) as conn:
        statuses = conn.execute(
            "SELECT status, count(*) FROM recovery_sending WHERE producer = 'crashy'"
            " GROUP BY status"
        ).fetchall()
    assert statuses == [("sent", 20)]


def test_publish_after_close_is_an_error(amqp_url, names):
    publisher = ReliablePublisher(amqp_url, producer="p", returns_queue=names["returns"])
    publisher.close()
    with pytest.raises(RuntimeError):
        publisher.publish("", names["queue"], b"late")
