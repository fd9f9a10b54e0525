"""The firehose tap against the real broker (#48): wire --trace, the records, resume, gaps."""

import io
import time
import uuid

import pika
import pytest
from django.conf import settings
from django.core.management import call_command

from recovery.broker import trace
from recovery.broker.management import Management
from recovery.broker.trace_tap import start_taps, stop_taps


def channel():
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    return connection, connection.channel()


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def records_of(message_id, kind=None):
    return [r for r in trace.read_records(kind=kind) if r["message_id"] == message_id]


def test_wire_trace_on_sets_tracing_and_declares_the_queue(traced):
    management = Management()
    assert trace.tracing_on(traced, management)
    queue = management.queue(traced, settings.RECOVERY_TRACE_QUEUE)
    assert queue["type"] == trace.trace_queue_type(None) == "quorum"  # 3.10 here
    bindings = management.bindings(traced)
    assert any(
        b["source"] == "amq.rabbitmq.trace"
        and b["destination"] == settings.RECOVERY_TRACE_QUEUE
        and b["routing_key"] == "#"
        for b in bindings
    )
    # Idempotent.
    call_command("wire", "--trace", "on", "--vhost", traced, stdout=io.StringIO())
    assert trace.tracing_on(traced, management)


def test_wire_trace_off_turns_it_off_and_leaves_the_queue(traced):
    out = io.StringIO()
    call_command("wire", "--trace", "off", "--vhost", traced, stdout=out)
    assert not trace.tracing_on(traced)
    assert "left as it is" in out.getvalue()
    assert Management().queue(traced, settings.RECOVERY_TRACE_QUEUE)["name"]


def test_publish_routed_to_two_queues_delivery_and_unroutable(tap):
    connection, ch = channel()
    suffix = uuid.uuid4().hex[:6]
    exchange, q1, q2 = f"t.ex.{suffix}", f"t.q1.{suffix}", f"t.q2.{suffix}"
    ch.exchange_declare(exchange, "topic", auto_delete=True)
    for q in (q1, q2):
        ch.queue_declare(q, auto_delete=False)
        ch.queue_bind(q, exchange, "k")
    routed, unroutable = f"m-{suffix}", f"u-{suffix}"
    ch.basic_publish(exchange, "k", b"hello", pika.BasicProperties(message_id=routed))
    ch.basic_publish(exchange, "none", b"x", pika.BasicProperties(message_id=unroutable))
    method, _, _ = wait_for(lambda: (got := ch.basic_get(q1))[0] is not None and got)
    ch.basic_nack(method.delivery_tag, requeue=True)  # the second delivery is a redelivery
    again = wait_for(lambda: (got := ch.basic_get(q1))[0] is not None and got)
    ch.basic_ack(again[0].delivery_tag)
    try:
        publish = wait_for(lambda: records_of(routed, "publish"))[0]
        assert publish["exchange"] == exchange
        assert publish["routing_keys"] == ["k"]
        assert sorted(publish["routed_queues"]) == sorted([q1, q2])
        assert publish["queue"] is None and publish["redelivered"] is None
        assert publish["body_size"] == 5 and publish["vhost"] == tap.vhost
        assert publish["node"] and publish["user"] == "guest" and publish["channel"] >= 1
        delivers = wait_for(
            lambda: (d := records_of(routed, "deliver")) and any(r["redelivered"] for r in d) and d
        )
        assert {d["queue"] for d in delivers} == {q1}
        assert {d["redelivered"] for d in delivers} == {False, True}
        nowhere = wait_for(lambda: records_of(unroutable, "publish"))[0]
        assert nowhere["routed_queues"] == []
        # The tap's own consumption of the trace queue is not traced (the broker skips
        # messages of amq.rabbitmq.trace), so no loop.
        assert not [r for r in trace.read_records() if r["queue"] == settings.RECOVERY_TRACE_QUEUE]
    finally:
        ch.queue_delete(q1)
        ch.queue_delete(q2)
        connection.close()


def test_records_are_partitioned_by_day_and_hour(tap):
    connection, ch = channel()
    mid = f"p-{uuid.uuid4().hex[:6]}"
    ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(message_id=mid))
    connection.close()
    record = wait_for(lambda: records_of(mid))[0]
    files = list(trace.root().glob("dt=*/hour=*/*.parquet"))
    assert files
    assert trace.partition(trace.root(), record["ts_ms"]) in {f.parent for f in files}
    assert not list(trace.root().rglob(".*.tmp"))


@pytest.mark.slow
def test_the_tap_restarts_and_resumes_without_loss_and_the_stop_is_a_gap(traced):
    started_ms = trace.now_ms()
    stop_event, threads = start_taps([traced], flush_seconds=0.3)
    connection, ch = channel()
    first = [f"a-{i}-{uuid.uuid4().hex[:4]}" for i in range(20)]
    for mid in first:
        ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(message_id=mid))
    wait_for(lambda: all(records_of(m) for m in first))
    stop_taps(stop_event, threads)
    stopped_ms = trace.now_ms()
    # Published while no tap runs: kept by the trace queue, read after the restart.
    second = [f"b-{i}-{uuid.uuid4().hex[:4]}" for i in range(20)]
    for mid in second:
        ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(message_id=mid))
    time.sleep(2.0)
    restarted_ms = trace.now_ms()
    stop_event, threads = start_taps([traced], flush_seconds=0.3)
    try:
        wait_for(lambda: all(records_of(m) for m in second))
        time.sleep(0.8)
        ended_ms = trace.now_ms()
    finally:
        stop_taps(stop_event, threads)
        connection.close()
    assert all(len(records_of(m)) == 1 for m in first + second)  # duplicates dropped by key
    gaps = trace.coverage_gaps(traced, started_ms + 500, ended_ms - 1000, slack_ms=700)
    uncovered = [g for g in gaps if g["kind"] == "uncovered"]
    assert len(uncovered) == 1, gaps
    assert uncovered[0]["from_ms"] <= stopped_ms + 500
    assert uncovered[0]["until_ms"] >= restarted_ms - 100


def test_no_coverage_at_all_is_one_gap(trace_dir):
    gaps = trace.coverage_gaps("nowhere", 0, 10_000)
    assert gaps == [{"kind": "uncovered", "node": None, "from_ms": 0, "until_ms": 10_000}]


def test_a_node_restart_and_a_retention_drop_are_gaps(trace_dir):
    tap = type("T", (), {})()
    from recovery.broker.trace_tap import Tap

    tap = Tap("v", base=trace_dir, management=object())
    tap.write_coverage("consumed", 0, 10_000, 0, 9, 10)
    tap.write_coverage("node_restart", 4_000, 5_000, None, None, 0, node="rabbit@b")
    tap.write_coverage("retention_drop", 6_000, 7_000, 10, 19, 10)
    gaps = trace.coverage_gaps("v", 0, 10_000, slack_ms=100)
    assert [(g["kind"], g["node"]) for g in gaps] == [
        ("node_restart", "rabbit@b"),
        ("retention_drop", None),
    ]


def test_the_broker_page_says_whether_the_firehose_is_on(traced, client, viewer):
    from recovery.broker.trace import set_tracing

    client.force_login(viewer)
    html = client.get("/broker/").content.decode()
    row = html[html.index('id="trace-status"') :]
    row = row[: row.index("</table>")]
    assert traced in row and '<span class="badge ok">on</span>' in row
    assert "none: no tap is writing" in row  # on, and nobody taps it: said
    set_tracing(traced, False)
    row = client.get("/broker/").content.decode()
    row = row[row.index('id="trace-status"') :]
    assert '<span class="badge ok">on</span>' not in row[: row.index("</table>")]


def test_the_broker_page_says_unknown_when_the_management_api_does_not_answer(
    client, viewer, settings, wired
):
    from tests.helpers import free_port

    settings.RABBITMQ_MANAGEMENT_URL = f"http://guest:guest@127.0.0.1:{free_port()}"
    client.force_login(viewer)
    html = client.get("/broker/?refresh=1").content.decode()
    row = html[html.index('id="trace-status"') :]
    row = row[: row.index("</table>")]
    assert "unknown" in row and ">off<" not in row
