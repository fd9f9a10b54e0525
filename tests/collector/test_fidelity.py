"""Fidelity: what a consumer receives after publish -> dead-letter -> store -> replay is what was
published: the body bytes, every property, every header value with its AMQP type."""

import datetime
import decimal
import os

import pytest

from recovery.client.headers import LongBytes, RawTimestamp
from recovery.models import Message, Status
from recovery.replay import replay_message
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import reject_next, stored

pytestmark = pytest.mark.django_db(transaction=True)

EVERY_HEADER_TYPE = {
    "string": "héllo wörld ✓",
    "empty-string": "",
    "int": 42,
    "negative": -7,
    "int64": 2**40,
    "float": 1.5,
    "tiny-float": -2.5e-300,
    "decimal": decimal.Decimal("12.50"),
    "true": True,
    "false": False,
    "timestamp": datetime.datetime(2026, 11, 21, 12, 30, 5),
    "bytes": b"\x00\x01\xfe\xff",
    "null": None,
    "table": {"nested": {"deeper": {"deepest": [1, "two", False]}}, "$t": "looks like a tag"},
    "array": [1, "a", 2.25, None, {"k": "v"}, [b"\x00", decimal.Decimal("-0.001")]],
    "empty-table": {},
    "empty-array": [],
    # pika would turn these into a byte array, or fail to decode them at all.
    "latin1-long-string": LongBytes("café".encode("latin-1")),
    "millis-as-timestamp": RawTimestamp(1_795_000_000_000),
    "nul-inside": "a\x00b",
}

EVERY_PROPERTY = {
    "content_type": "application/x-custom",
    "content_encoding": "gzip",
    "delivery_mode": 2,
    "priority": 7,
    "correlation_id": "corr-1",
    "reply_to": "amq.rabbitmq.reply-to.x",
    "message_id": "fid-props",
    "timestamp": 1_795_000_000,
    "type": "order.created",
    "user_id": "guest",  # RabbitMQ checks it against the connection's user
    "app_id": "shop",
    "cluster_id": "eu-1",
}


def same(received, sent):
    """Equal values *and* equal types, recursively (datetimes compared as UTC instants)."""
    if isinstance(sent, datetime.datetime):
        return isinstance(received, datetime.datetime) and received.replace(
            tzinfo=None
        ) == sent.replace(tzinfo=None)
    if type(sent) is int:
        # pika hands a 64-bit AMQP integer over as its own int subclass ``long``.
        return isinstance(received, int) and not isinstance(received, bool) and received == sent
    if type(received) is not type(sent):
        return False
    if isinstance(sent, dict):
        return sent.keys() == received.keys() and all(same(received[k], sent[k]) for k in sent)
    if isinstance(sent, list):
        return len(sent) == len(received) and all(map(same, received, sent))
    return received == sent


def round_trip(amqp, queue, body, **props):
    """Publish, reject (dead-letter), wait for the store, replay, receive: (row, props, body)."""
    declare_app_queue(amqp, queue)
    publish(amqp, queue, body, **props)
    reject_next(amqp, queue)
    [row] = stored(message_id=props["message_id"], timeout=60)
    attempt = replay_message(row)
    assert attempt.outcome == "confirmed", attempt.detail
    method, received_props, received_body = wait_for(
        lambda: (lambda r: r if r[0] else None)(amqp.basic_get(queue, auto_ack=True)),
        timeout=30,
        message=f"the replayed message on {queue}",
    )
    return row, received_props, received_body


def test_every_header_type_comes_back_with_its_value_and_type(collector, amqp):
    row, props, _body = round_trip(
        amqp, "fid.headers", b"h", message_id="fid-headers", headers=EVERY_HEADER_TYPE
    )

    for name, value in EVERY_HEADER_TYPE.items():
        assert same(row.wire_headers[name], value), (name, row.wire_headers[name])
        assert same(props.headers[name], value), (name, props.headers[name])
    assert props.headers["x-recovery-origin"] == row.pk


def test_every_property_comes_back(collector, amqp):
    row, props, body = round_trip(
        amqp, "fid.props", b"p", expiration="600000", headers={"k": "v"}, **EVERY_PROPERTY
    )

    for name, value in EVERY_PROPERTY.items():
        assert row.properties[name] == value, name
        assert getattr(props, name) == value, name
    # RabbitMQ moves a per-message TTL into x-death when it dead-letters; the replay leaves it out
    # (a TTL that killed a message once would kill it again).
    assert "expiration" not in row.properties
    assert row.x_death[0]["original-expiration"] == "600000"
    assert props.expiration is None
    assert (row.content_type, row.content_encoding, row.correlation_id) == (
        "application/x-custom",
        "gzip",
        "corr-1",
    )
    assert body == b"p"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("every-byte", bytes(range(256)) * 4),
        ("not-utf8", "Grüße, café".encode("latin-1") + b"\xc3\x28\xa0\xa1"),
        ("empty", b""),
        ("nul-bytes", b"\x00" * 100),
    ],
)
def test_bodies_come_back_byte_for_byte(collector, amqp, name, body):
    row, props, received = round_trip(
        amqp, f"fid.body.{name}", body, message_id=f"fid-{name}", content_type="text/plain"
    )

    assert row.body_bytes == body and row.body_size == len(body)
    assert received == body
    assert props.content_type == "text/plain"


@pytest.mark.slow  # a scale test: 20 MB through the broker and the store
def test_a_twenty_megabyte_body_comes_back_byte_for_byte(collector, amqp):
    body = os.urandom(21 * 1024 * 1024)
    row, _props, received = round_trip(amqp, "fid.body.large", body, message_id="fid-large")

    assert row.body_size == len(body)
    assert row.body_bytes == body
    assert received == body


def test_a_replayed_message_that_dies_again_links_to_its_record_then_is_poisoned(
    collector, amqp, settings
):
    declare_app_queue(amqp, "fid.poison")
    publish(amqp, "fid.poison", b"always fails", message_id="poison-1")
    reject_next(amqp, "fid.poison")
    [record] = stored(message_id="poison-1")
    chain = [record]
    for replays in range(1, settings.POISON_THRESHOLD + 1):
        replay_message(chain[-1])
        reject_next(amqp, "fid.poison")  # the consumer fails it again
        returned = wait_for(
            lambda previous=chain[-1]: Message.objects.filter(origin=previous).first(),
            message=f"return #{replays}",
        )
        assert returned.replay_count == replays
        assert returned.message_id == "poison-1"
        assert returned.death_count == 1  # a fresh x-death: the replay stripped the old one
        chain.append(returned)

    statuses = [m.status for m in chain[1:]]
    threshold = settings.POISON_THRESHOLD
    assert statuses == [Status.PENDING] * (threshold - 1) + [Status.POISONED]
    assert [m.origin_id for m in chain] == [None, *(m.pk for m in chain[:-1])]
    chain[0].refresh_from_db()
    assert chain[0].status == Status.REPLAYED


def test_a_return_whose_record_is_gone_is_stored_without_a_link(collector, amqp):
    declare_app_queue(amqp, "fid.orphan")
    publish(
        amqp,
        "fid.orphan",
        b"x",
        message_id="orphan-1",
        headers={"x-recovery-origin": 987654321, "x-recovery-replay-count": 1},
    )
    reject_next(amqp, "fid.orphan")

    [row] = stored(message_id="orphan-1")
    assert row.origin_id is None
    assert row.replay_count == 1


def test_messages_that_failed_the_same_way_share_a_failure_group(collector, amqp):
    declare_app_queue(amqp, "fid.groups")
    failures = [
        ("g1", "ValidationError", "Order 1001 has no lines"),
        ("g2", "ValidationError", "Order 2002 has no lines\n  at line 7"),
        ("g3", "TimeoutError", "Order 1001 has no lines"),
        ("g4", None, None),
    ]
    for message_id, exc_type, exc_message in failures:
        headers = {}
        if exc_type:
            headers = {"x-exception-type": exc_type, "x-exception-message": exc_message}
        publish(amqp, "fid.groups", b"{}", message_id=message_id, headers=headers)
        reject_next(amqp, "fid.groups")

    rows = {m.message_id: m for m in stored(4, source_queue="fid.groups")}
    assert rows["g1"].group_key == rows["g2"].group_key
    assert (
        rows["g1"].group_label == "fid.groups · rejected · ValidationError · Order # has no lines"
    )
    assert len({rows[k].group_key for k in ("g1", "g3", "g4")}) == 3
    assert rows["g4"].group_label == "fid.groups · rejected"


def test_header_names_that_are_not_utf8_come_back_as_their_bytes(collector, amqp):
    """#20: a name of octets that are not UTF-8 used to come back as the text of its repr."""
    headers = {b"\xff\xfe": "odd name", "$b64:looks-like-ours": 1, "plain": {b"\xc3(": True}}
    row, props, _body = round_trip(amqp, "fid.names", b"n", message_id="fid-names", headers=headers)

    assert props.headers[b"\xff\xfe"] == "odd name"
    assert props.headers["$b64:looks-like-ours"] == 1
    assert props.headers["plain"] == {b"\xc3(": True}
    assert "b'\\xff\\xfe'" not in row.headers  # stored as its octets, not their repr
