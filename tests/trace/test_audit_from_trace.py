"""The audit of a day from the broker's trace alone (#48): a publisher and a consumer that write
no log line and export no span (plain pika), the firehose on, the tap writing records, losses
injected in the broker itself; the nightly audit names exactly the messages the broker lost,
and the dead-lettered ones as recoverable with their store ids.

One topic exchange ``witness`` (no alternate exchange), a queue per fate:

- ``w.ok``       bound ``ok.#``: consumed and acked (messages without a message id: known by
                 their body's digest);
- ``w.ttl``      bound ``ttl.#``: a 300 ms TTL, no dead-letter exchange, no consumer: lost;
- ``w.dlx``      bound ``dlx.#``: a 300 ms TTL into Lazarus's dead-letter exchange: in the
                 store, recoverable;
- ``w.drop``     bound ``drop.#``: ``x-max-length`` 2 with ``drop-head``: of 5, the first 3 are
                 dropped (lost), the last 2 are fetched;
- ``w.gone``     bound ``gone.#``: deleted with its 3 messages in it: lost;
- ``w.backlog``  bound ``backlog.#``: its one message is still in it when the audit runs:
                 unverified (the firehose cannot say which messages a queue still holds);
- a publish with the key ``nowhere.1``, which nothing is bound to: routed to no queue, lost;
- a Node service (amqplib; its OpenTelemetry spans go to a sink Lazarus never reads, so to
  Lazarus it writes nothing either) publishes 4 through ``w.node`` to a Node consumer that
  takes them all, and 2 into ``w.ttl``: those are lost.
"""

import pika
import pytest
from django.conf import settings
from django.utils import timezone

from recovery.audit.run import run_audit
from recovery.broker import trace
from recovery.models import Message
from tests.helpers import wait_for
from tests.helpers.audit import evidence_ids, next_morning
from tests.telemetry.services import harness

pytestmark = [pytest.mark.slow, pytest.mark.spark]

EXCHANGE = "witness"
QUEUES = {
    "w.ok": ("ok.#", {}),
    "w.ttl": ("ttl.#", {"x-message-ttl": 300}),
    "w.dlx": ("dlx.#", {"x-message-ttl": 300, "x-dead-letter-exchange": settings.RECOVERY_DLX}),
    "w.drop": ("drop.#", {"x-max-length": 2, "x-overflow": "drop-head"}),
    "w.gone": ("gone.#", {}),
    "w.backlog": ("backlog.#", {}),
    "w.node": ("node.#", {}),
}


def declare(channel):
    channel.exchange_declare(EXCHANGE, "topic", durable=True)
    for queue, (pattern, arguments) in QUEUES.items():
        channel.queue_delete(queue)
        channel.queue_declare(queue, durable=True, arguments=arguments)
        channel.queue_bind(queue, EXCHANGE, pattern)


def publish(channel, routing_key, message_id=None, body=None):
    channel.basic_publish(
        EXCHANGE,
        routing_key,
        body or f"body of {message_id}".encode(),
        pika.BasicProperties(message_id=message_id, delivery_mode=2),
    )


def depth(channel, queue):
    return channel.queue_declare(queue, passive=True).method.message_count


def record_counts():
    kinds = [r["kind"] for r in trace.read_records()]
    return kinds.count("publish"), kinds.count("deliver")


def audit(today):
    run = run_audit(
        today,
        producer_logs="/nonexistent/producer-logs",
        consumer_logs="/nonexistent/consumer-logs",
        bindings=[],  # no binding history: the broker names the queues
        now=next_morning(today),
        master="local[1]",
    )
    assert run.status == "succeeded", run.error
    return run, evidence_ids(run)


def node_services(workdir):
    """The Node service: a consumer of ``w.node`` (all 4), then a producer of 4 to it and 2 to
    ``w.ttl``; their spans go to a capture sink, never to Lazarus."""
    with harness.CaptureSink() as sink:
        ready = workdir / "node-consumer.ready"
        common = {"amqp_url": settings.RABBITMQ_URL, "otlp_endpoint": sink.endpoint}
        consumer = harness.start_service(
            "node",
            "consume",
            queue="w.node",
            idle=1.0,
            expect=4,
            ready_file=ready,
            record=workdir / "node-consumer.jsonl",
            **common,
        )
        harness.wait_until(ready.exists, what="the Node consumer")
        for key, prefix, count in (("node.created", "nd-", 4), ("ttl.node", "nt-", 2)):
            producer = harness.start_service(
                "node",
                "produce",
                exchange=EXCHANGE,
                routing_key=key,
                count=count,
                id_prefix=prefix,
                record=workdir / f"node-{prefix}.jsonl",
                **common,
            )
            harness.finish(producer)
        harness.finish(consumer)
    return harness.read_record(workdir / "node-consumer.jsonl")


def test_the_broker_names_what_it_lost_with_no_log_and_no_span(tap, collector, tmp_path):
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    declare(channel)
    assert len(node_services(tmp_path)) == 4  # the Node consumer took its 4
    bodies = [f"order {n} of a service that logs nothing".encode() for n in range(4)]
    for body in bodies:
        publish(channel, "ok.created", body=body)
    for n in range(3):
        publish(channel, "ttl.created", f"ttl-{n}")
        publish(channel, "dlx.created", f"dlx-{n}")
        publish(channel, "gone.created", f"gone-{n}")
    for n in range(5):
        publish(channel, "drop.created", f"drop-{n}")
    publish(channel, "nowhere.1", "nowhere-1")
    publish(channel, "backlog.created", "backlog-0")

    consumed = []
    for _ in bodies:
        method, _, body = wait_for(lambda: channel.basic_get("w.ok"), message="w.ok's messages")
        channel.basic_ack(method.delivery_tag)
        consumed.append(body)
    assert sorted(consumed) == sorted(bodies)
    fetched = []
    while (got := channel.basic_get("w.drop"))[0] is not None:
        channel.basic_ack(got[0].delivery_tag)
        fetched.append(got[2])
    assert fetched == [b"body of drop-3", b"body of drop-4"]  # drop-head dropped 0..2
    wait_for(lambda: depth(channel, "w.ttl") == 0 and depth(channel, "w.dlx") == 0, timeout=20)
    channel.queue_delete("w.gone")  # with its three messages
    wait_for(
        lambda: Message.objects.filter(message_id__startswith="dlx-").count() == 3,
        timeout=20,
        message="w.dlx's expired messages in the store",
    )
    connection.close()
    # 26 publishes, 10 deliveries, and the collector's 3 of the dead letters (Lazarus's own)
    try:
        wait_for(lambda: record_counts() == (26, 13), timeout=20)
    except AssertionError:
        raise AssertionError(f"the tap wrote {record_counts()}: {trace.read_records()}") from None

    run, evidence = audit(timezone.now().date())
    lost = {f"{fate}-{n}" for fate in ("ttl", "gone", "drop") for n in range(3)} | {"nowhere-1"}
    lost |= {"nt-1", "nt-2"}  # the Node service's, expired in w.ttl
    assert evidence.get("lost") == lost, (evidence, run.config["trace"], run.warnings)
    stored = dict(
        Message.objects.filter(message_id__startswith="dlx-").values_list("message_id", "pk")
    )
    assert {r.message_id: r.store_id for r in run.evidence.filter(kind="recoverable")} == stored
    assert evidence.get("unverified") == {"backlog-0"}  # still queued: not lost, not fine
    assert set(evidence) == {"lost", "recoverable", "unverified"}, evidence  # nothing else
    # The lost message routed nowhere is named as such; each row names the trace as its source.
    groups = dict(run.evidence.filter(kind="lost").values_list("message_id", "consumer_group"))
    assert groups["nowhere-1"] == "(routed to no queue)"
    assert groups["ttl-0"] == "w.ttl" and groups["drop-0"] == "w.drop"
    sources = dict(run.evidence.values_list("message_id", "consumer_source"))
    assert set(run.evidence.values_list("producer_source", flat=True)) == {"trace"}
    assert sources["drop-0"] == "trace"  # w.drop's deliveries were traced
    assert sources["ttl-0"] == ""  # nothing was ever delivered from w.ttl: no consumer source
    totals = run.totals
    assert totals["distinct_published"] == 26 and totals["confirmed"] == 26
    assert totals["lost"] == 12 and totals["recoverable"] == 3 and totals["unverified"] == 1
    assert totals["delivered_unique"] == 10
    assert run.config["expected_by"] == {"traced": 9}
    # The tap ran throughout: no trace_gap. w.backlog held a message when the audit ran (as
    # may other tests' queues of this vhost, which nothing here routed to: no gap of theirs).
    assert run.config["trace"]["gaps"] == []
    assert not [w for w in run.warnings if w["code"] == "trace_gap"], run.warnings
    assert "w.backlog" in {g["queue"] for g in run.config["trace"]["queued"]}
    assert set(run.input_gaps.values_list("consumer_group", flat=True)) == {"w.backlog"}


def test_a_tap_stopped_mid_day_is_a_trace_gap_and_no_loss(traced, collector, settings):
    from recovery.broker.trace_tap import start_taps, stop_taps

    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    declare(channel)
    stop_event, threads = start_taps([traced], flush_seconds=0.3)
    publish(channel, "ok.created", "before-0")
    wait_for(lambda: channel.basic_get("w.ok", auto_ack=True)[0] is not None)
    wait_for(lambda: len(trace.read_records(kind="deliver")) == 1, message="the first records")
    stop_taps(stop_event, threads)
    stopped = trace.now_ms()
    # While no tap runs: a message expires unseen in a queue with no dead-letter exchange. The
    # trace queue keeps its records, but nothing can say the tap's view of this time is whole.
    publish(channel, "ttl.created", "during-0")
    wait_for(lambda: depth(channel, "w.ttl") == 0, timeout=20)
    pause = 12.5  # longer than the audit's 10 s of slack between a tap's flushes
    wait_for(lambda: trace.now_ms() - stopped > pause * 1000, timeout=pause + 5)
    stop_event, threads = start_taps([traced], flush_seconds=0.3)
    try:
        publish(channel, "ok.created", "after-0")
        wait_for(lambda: channel.basic_get("w.ok", auto_ack=True)[0] is not None)
        wait_for(
            lambda: (
                len(trace.read_records(kind="deliver")) == 2
                and len(trace.read_records(kind="publish")) == 3
            ),
            message="the records after the pause",
        )
        connection.close()
        run, evidence = audit(timezone.now().date())
    finally:
        stop_taps(stop_event, threads)
    gaps = [g for g in run.config["trace"]["gaps"] if g["kind"] == "uncovered"]
    assert len(gaps) == 1, run.config["trace"]["gaps"]
    assert gaps[0]["from_ms"] <= stopped + 1000 and gaps[0]["until_ms"] - stopped >= pause * 1000
    assert {"code": "trace_gap", "count": 1} in run.warnings
    assert "lost" not in evidence, evidence  # never lost ...
    assert evidence.get("unverified") == {"during-0"}  # ... and never fine
    rows = list(run.input_gaps.values_list("side", "process"))
    assert rows and all(side == "trace" for side, _ in rows), rows
    assert all(process.startswith("trace_gap uncovered ") for _, process in rows), rows
