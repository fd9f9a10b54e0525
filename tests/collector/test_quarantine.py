"""What cannot be stored goes to recovery.quarantine with the reason; nothing is acked before it is
stored somewhere."""

import pytest

from recovery.broker.topology import QUORUM
from recovery.collector import consumer as collector_module
from recovery.collector.consumer import start_collectors, stop_collectors
from recovery.models import Message
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import depth, drain_queue, reject_next, stored

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 64 * 1024


@pytest.fixture
def small_collector(transactional_db, wired, clean_queues):
    """Collector threads whose body limit is 64 KiB."""
    stop_event, threads = start_collectors(flush_seconds=0.05, max_body_bytes=LIMIT)
    yield threads
    stop_collectors(stop_event, threads)


def quarantined(amqp, count, timeout=30):
    wait_for(
        lambda: depth(amqp, "recovery.quarantine") >= count,
        timeout=timeout,
        message=f"{count} quarantined message(s)",
    )
    return drain_queue(amqp, "recovery.quarantine")


def test_a_body_over_the_limit_is_quarantined_with_the_reason(small_collector, amqp, wired):
    declare_app_queue(amqp, "q.big")
    big = b"B" * (LIMIT + 1)
    publish(amqp, "q.big", b"small", message_id="fits")
    publish(amqp, "q.big", big, message_id="too-big", headers={"tenant": "acme"})
    reject_next(amqp, "q.big")
    reject_next(amqp, "q.big")

    [(_method, props, body)] = quarantined(amqp, 1)
    assert body == big
    assert props.message_id == "too-big"
    assert props.headers["tenant"] == "acme"
    assert props.headers["x-quarantine-reason"] == (
        f"body {LIMIT + 1} B > limit {LIMIT} B (COLLECTOR_MAX_BODY_BYTES)"
    )
    assert props.headers["x-quarantine-source"] == "recovery.dead_letters"
    assert props.headers["x-quarantine-vhost"] == wired
    assert props.headers["x-death"][0]["queue"] == "q.big"  # the evidence travels with it
    stored(message_id="fits")
    assert not Message.objects.filter(message_id="too-big").exists()
    wait_for(lambda: depth(amqp, "recovery.dead_letters") == 0, message="the DLQ to be acked")


def test_a_delivery_the_parser_chokes_on_is_quarantined(collector, amqp, monkeypatch):
    real = collector_module.delivery_to_row

    def choking_parser(*args, **kwargs):
        properties = args[4]
        if properties.message_id == "chokes":
            raise KeyError("simulated parser bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(collector_module, "delivery_to_row", choking_parser)
    declare_app_queue(amqp, "q.parse")
    publish(amqp, "q.parse", b"fine", message_id="parses")
    publish(amqp, "q.parse", b"poison", message_id="chokes")
    reject_next(amqp, "q.parse")
    reject_next(amqp, "q.parse")

    [(_method, props, body)] = quarantined(amqp, 1)
    assert (props.message_id, body) == ("chokes", b"poison")
    assert props.headers["x-quarantine-reason"] == "parse error: KeyError: 'simulated parser bug'"
    stored(message_id="parses")


def test_headers_nested_too_deep_to_decode_are_quarantined_byte_for_byte(collector, amqp):
    import sys

    import pika.data

    deep = {"leaf": True}
    for _ in range(2000):  # deeper than any thread's recursion limit lets pika decode
        deep = {"n": deep}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50000)
    try:
        declare_app_queue(amqp, "q.deep")
        publish(amqp, "q.deep", b"deep", message_id="deep-1", headers={"deep": deep})
        pieces = []
        pika.data.encode_table(pieces, {"deep": deep})
    finally:
        sys.setrecursionlimit(limit)
    original_entries = b"".join(pieces)[4:]
    reject_next(amqp, "q.deep")  # this consumer, too, gets the headers undecoded

    [(_method, props, body)] = quarantined(amqp, 1)
    assert (props.message_id, body) == ("deep-1", b"deep")
    # Undecodable again here, but the entries are the original bytes, after x-death & co.
    assert original_entries in props.headers.raw
    assert b"x-quarantine-reason" in props.headers.raw
    assert b"headers nested too deep to decode" in props.headers.raw


def test_a_row_the_database_refuses_is_quarantined_and_the_rest_stored(collector, amqp):
    # jsonb cannot hold U+0000 in a key (values are encoded around it; keys cannot be).
    declare_app_queue(amqp, "q.refused")
    publish(amqp, "q.refused", b"ok-1", message_id="ok-1")
    publish(amqp, "q.refused", b"nul key", message_id="nul-key", headers={"bad\x00key": 1})
    publish(amqp, "q.refused", b"ok-2", message_id="ok-2")
    for _ in range(3):
        reject_next(amqp, "q.refused")

    [(_method, props, body)] = quarantined(amqp, 1)
    assert (props.message_id, body) == ("nul-key", b"nul key")
    assert props.headers["x-quarantine-reason"].startswith("database refused: ")
    stored(2, message_id__in=["ok-1", "ok-2"])


def test_nothing_is_acked_while_the_quarantine_will_not_take_it(small_collector, amqp):
    """A full quarantine queue refuses the publish: the message waits in the DLQ, then goes."""
    amqp.queue_delete("recovery.quarantine")
    amqp.queue_declare(
        "recovery.quarantine",
        durable=True,
        arguments={**QUORUM, "x-max-length": 0, "x-overflow": "reject-publish"},
    )
    declare_app_queue(amqp, "q.blocked")
    publish(amqp, "q.blocked", b"B" * (LIMIT + 1), message_id="waits")
    reject_next(amqp, "q.blocked")

    errors = lambda: sum(t.counters.errors for t in small_collector)  # noqa: E731
    wait_for(lambda: errors() >= 2, timeout=30, message="the collector to retry")
    assert depth(amqp, "recovery.quarantine") == 0

    # Had it been acked, it would be gone for good; it is not: it arrives once there is room.
    amqp.queue_delete("recovery.quarantine")
    amqp.queue_declare("recovery.quarantine", durable=True, arguments=QUORUM)
    [(_method, props, _body)] = quarantined(amqp, 1, timeout=60)
    assert props.message_id == "waits"
    wait_for(lambda: depth(amqp, "recovery.dead_letters") == 0, message="the DLQ to be acked")
