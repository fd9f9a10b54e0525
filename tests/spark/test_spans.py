"""spark/spans.py: OpenTelemetry messaging span rows -> the log contract's two frames, and an audit
of a day with one service on logs and one on spans only."""

import pytest
from pyspark.sql import types as T

from spark import spans
from spark.schema import CONSUMER_LOG_SCHEMA, PRODUCER_LOG_SCHEMA
from tests.helpers.spark import DAY_MS, at, consume, publish

pytestmark = pytest.mark.spark

TRACE = "a" * 32


def span(span_id, operation=None, kind="internal", service="orders", trace=TRACE, **fields):
    row = {
        "trace_id": trace,
        "span_id": span_id,
        "parent_span_id": None,
        "links": [],
        "kind": kind,
        "start_ns": at(10) * 1_000_000,
        "status_code": "unset",
        "service_name": service,
        "service_instance": None,
        "operation": operation,
        "destination": "orders",
        "routing_key": "order.created",
        "message_id": None,
        "consumer_group": None,
        "attributes": {},
    }
    row.update(fields)
    return row


def frame(spark, rows):
    data = [tuple(r[f.name] for f in spans.SPAN_READ_SCHEMA.fields) for r in rows]
    return spark.createDataFrame(data, spans.SPAN_READ_SCHEMA)


def facts(spark, rows):
    producers, consumers = spans.span_facts(frame(spark, rows))
    return (
        sorted(producers.collect(), key=lambda r: (r.message_id, r.ts)),
        sorted(consumers.collect(), key=lambda r: (r.message_id, r.ts)),
    )


def test_the_frames_have_the_log_contracts_columns_and_a_source(spark):
    producers, consumers = spans.span_facts(frame(spark, []))
    assert producers.columns == [
        *PRODUCER_LOG_SCHEMA.fieldNames(),
        "file_hour_ms",
        "malformed",
        "source",
    ]
    assert consumers.columns == [
        *CONSUMER_LOG_SCHEMA.fieldNames(),
        "file_hour_ms",
        "malformed",
        "source",
    ]


def test_current_convention_send_and_process(spark):
    producers, consumers = facts(
        spark,
        [
            span("1" * 16, "send", message_id="m1"),
            span(
                "2" * 16,
                "process",
                service="billing",
                message_id="m1",
                consumer_group="billing",
                service_instance="b-1",
                start_ns=at(10, 0, 1) * 1_000_000,
            ),
            span(
                "3" * 16,
                "process",
                service="billing",
                message_id="m1",
                status_code="error",
                start_ns=at(10, 0, 2) * 1_000_000,
            ),
        ],
    )
    (p,) = producers
    assert (p.producer, p.exchange, p.routing_key, p.message_id, p.outcome, p.attempt) == (
        "orders",
        "orders",
        "order.created",
        "m1",
        "sent",
        1,
    )
    assert p.ts == at(10) and p.file_hour_ms == at(10) and not p.malformed and p.source == "span"
    ok, failed = consumers
    assert (ok.consumer_group, ok.consumer, ok.outcome) == ("billing", "billing@b-1", "delivered")
    # no group attribute: the consuming service is the group
    assert (failed.consumer_group, failed.outcome) == ("billing", "failed")


def test_old_convention_and_kind_only(spark):
    # the intake folds messaging.operation publish -> send, deliver -> process; a span with
    # neither attribute keeps a null operation and its kind decides
    producers, consumers = facts(
        spark,
        [
            span("1" * 16, None, kind="producer", message_id="m1"),
            span("2" * 16, None, kind="consumer", service="billing", message_id="m1"),
            span("3" * 16, "receive", service="billing", message_id="m2"),
            span("4" * 16, None, kind="internal", message_id="m3"),  # not messaging
        ],
    )
    assert [(p.message_id, p.outcome) for p in producers] == [("m1", "sent")]
    assert [(c.message_id, c.outcome) for c in consumers] == [
        ("m1", "delivered"),
        ("m2", "delivered"),
    ]


def test_send_error_is_an_error_attempt(spark):
    producers, _ = facts(spark, [span("1" * 16, "send", message_id="m1", status_code="error")])
    assert [p.outcome for p in producers] == ["error"]


def test_no_id_by_creation_context_via_parent_and_via_link(spark):
    create = span("1" * 16, "create")
    child = span("2" * 16, "receive", service="billing", parent_span_id="1" * 16)
    linked = span(
        "3" * 16,
        "process",
        service="shipping",
        trace="b" * 32,
        links=[{"trace_id": TRACE, "span_id": "1" * 16}],
    )
    producers, consumers = facts(spark, [create, child, linked])
    expected = f"otel:{TRACE}:{'1' * 16}"
    assert [p.message_id for p in producers] == [expected]
    assert {c.message_id for c in consumers} == {expected}
    assert not any(c.malformed for c in consumers)


def test_nested_spans_are_one_fact(spark):
    # pika: two send spans per publish, the consumer the child of the inner one; a process
    # span the child of its receive, inheriting its id
    outer = span("1" * 16, "send")
    inner = span("2" * 16, "send", parent_span_id="1" * 16)
    receive = span("3" * 16, "receive", service="billing", parent_span_id="2" * 16)
    process = span("4" * 16, "process", service="billing", parent_span_id="3" * 16)
    producers, consumers = facts(spark, [outer, inner, receive, process])
    expected = f"otel:{TRACE}:{'2' * 16}"
    assert [p.message_id for p in producers] == [expected]
    assert [(c.message_id, c.outcome) for c in consumers] == [(expected, "delivered")]


def test_settle_gives_the_real_outcome(spark):
    process = span("1" * 16, "process", service="billing", message_id="m1")
    settle = span(
        "2" * 16,
        "settle",
        service="billing",
        parent_span_id="1" * 16,
        attributes={"messaging.operation.name": "reject"},
    )
    _, consumers = facts(spark, [process, settle])
    assert [(c.message_id, c.outcome) for c in consumers] == [("m1", "reject")]


def test_a_batch_send_is_not_a_fact(spark):
    batch = span("9" * 16, "send", links=[{"trace_id": TRACE, "span_id": "1" * 16}])
    producers, _ = facts(spark, [span("1" * 16, "create", message_id="m1"), batch])
    assert [p.message_id for p in producers] == ["m1"]


def test_log_wins_over_a_span_of_the_same_fact(spark):
    from tests.helpers.spark import log_frame

    logs = log_frame(spark, PRODUCER_LOG_SCHEMA, [publish("m1", at(10))])
    span_producers, _ = spans.span_facts(
        frame(
            spark,
            [span("1" * 16, "send", message_id="m1"), span("2" * 16, "send", message_id="m2")],
        )
    )
    rows = spans.merged(logs, span_producers, ("message_id",)).collect()
    assert sorted((r.message_id, r.outcome, r.source) for r in rows) == [
        ("m1", "ack", "log"),
        ("m2", "sent", "span"),
    ]


def test_a_mixed_day_finds_the_injected_ids(spark):
    """orders logs (log contract); payments has spans only. Injected: o-lost (confirmed, no
    delivery), p-lost (sent, no delivery: confirmation unknown), p-dup (two deliveries),
    p-failed (only a failed span: received, outcome unknown), p-dl (dead-lettered: in Lazarus)."""
    from spark.audit import audit_frames
    from spark.schema import STORE_EXPORT_SCHEMA, epoch_ms
    from tests.helpers.spark import LATER, dead_letter, log_frame

    bindings = [
        {
            "exchange": "orders",
            "routing_key": "order.*",
            "consumer_group": "billing",
            "queue": "bq",
        },
        {"exchange": "payments", "routing_key": "pay.*", "consumer_group": "ledger", "queue": "lq"},
    ]
    producer_logs = log_frame(
        spark, PRODUCER_LOG_SCHEMA, [publish("o-ok", at(10)), publish("o-lost", at(10, 1))]
    )
    consumer_logs = log_frame(spark, CONSUMER_LOG_SCHEMA, [consume("o-ok", at(10, 0, 1))])

    def pay(mid, minute):
        return span(
            f"{minute:016x}",
            "send",
            service="payments",
            destination="payments",
            routing_key="pay.done",
            message_id=mid,
            start_ns=at(10, minute) * 1_000_000,
        )

    def ledger(mid, minute, n=0, **kw):
        return span(
            f"{minute:08x}{n:08x}",
            "process",
            service="ledger",
            trace="c" * 32,
            message_id=mid,
            start_ns=at(10, minute, 5 + n) * 1_000_000,
            **kw,
        )

    rows = [
        pay("p-ok", 2),
        pay("p-lost", 3),
        pay("p-dup", 4),
        pay("p-failed", 5),
        pay("p-dl", 6),
        ledger("p-ok", 2),
        ledger("p-dup", 4),
        ledger("p-dup", 4, 1),
        ledger("p-failed", 5, status_code="error"),
    ]
    span_producers, span_consumers = spans.span_facts(frame(spark, rows))
    producers = spans.merged(producer_logs, span_producers, ("message_id",))
    consumers = spans.merged(consumer_logs, span_consumers, ("message_id", "consumer_group"))
    store_row = dead_letter(7, "p-dl", at(10, 30), queue="lq")
    outputs = audit_frames(
        producers,
        consumers,
        spark.createDataFrame([store_row], STORE_EXPORT_SCHEMA),
        bindings,
        DAY_MS,
        3_600_000,
        5000,
        epoch_ms(LATER),
    )
    totals = outputs["totals"].first().asDict()
    assert (totals["lost"], totals["lost_confirmation_unknown"]) == (1, 1)
    assert (totals["recoverable"], totals["received_unknown"]) == (1, 1)
    assert (totals["confirmed"], totals["sent"], totals["unconfirmed"]) == (2, 5, 0)
    assert totals["dup_msgs"] == 1
    lost = {(r.message_id, r.verdict, r.producer_source) for r in outputs["lost"].collect()}
    assert lost == {("o-lost", "lost", "log"), ("p-lost", "lost_confirmation_unknown", "span")}
    assert [(r.message_id, r.store_id) for r in outputs["recoverable"].collect()] == [("p-dl", 7)]
    assert [r.message_id for r in outputs["received_unknown"].collect()] == ["p-failed"]
    assert [r.message_id for r in outputs["duplicates"].collect()] == ["p-dup"]


def test_spans_without_consumer_spans_are_unverified(spark):
    from spark.audit import audit_frames
    from spark.schema import STORE_EXPORT_SCHEMA, epoch_ms
    from tests.helpers.spark import LATER

    bindings = [{"exchange": "payments", "routing_key": "#", "consumer_group": "ledger"}]
    rows = [span("1" * 16, "send", service="payments", destination="payments", message_id="p1")]
    producers, consumers = spans.span_facts(frame(spark, rows))
    outputs = audit_frames(
        producers,
        consumers,
        spark.createDataFrame([], STORE_EXPORT_SCHEMA),
        bindings,
        DAY_MS,
        3_600_000,
        5000,
        epoch_ms(LATER),
    )
    totals = outputs["totals"].first().asDict()
    assert (totals["unverified"], totals["lost_confirmation_unknown"]) == (1, 0)
    assert totals["missing_consumer_logs"] == 1
    assert T  # the types module stays imported for readers of the schema
