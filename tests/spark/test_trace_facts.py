"""spark/trace_facts.py and its driver-side rules: the broker's firehose records -> the log
contract's frames, the broker's routing as the exact expectation, the tap's gaps as input gaps
(the end-to-end day against the real broker: tests/trace/test_audit_from_trace.py)."""

import pytest

from spark import spans, trace_facts
from spark.expectations import SPAN_END, SPAN_START, Expectation, trace_differences
from spark.log_facts import gap_windows, trace_gap_rows
from spark.schema import HOUR_MS, PRODUCER_LOG_SCHEMA
from tests.helpers.spark import at

pytestmark = pytest.mark.spark


def record(key, kind, ts=None, **fields):
    row = {
        "key": key,
        "kind": kind,
        "ts_ms": ts if ts is not None else at(10),
        "exchange": "orders",
        "routing_keys": ["order.created"],
        "routed_queues": None,
        "queue": None,
        "redelivered": None,
        "message_id": None,
        "user": "svc",
        "body_size": 10,
        "body_sha": None,
    }
    row.update(fields)
    return row


def frame(spark, rows):
    data = [tuple(r[f.name] for f in trace_facts.TRACE_READ_SCHEMA.fields) for r in rows]
    return spark.createDataFrame(data, trace_facts.TRACE_READ_SCHEMA)


def test_publishes_and_deliveries_become_facts_and_routes(spark):
    rows = [
        record("a", "publish", message_id="m-1", routed_queues=["billing.q", "audit.q"]),
        record("a", "publish", message_id="m-1", routed_queues=["billing.q", "audit.q"]),  # replay
        record("b", "publish", body_sha="f" * 32, routed_queues=["recovery.unrouted"]),
        record("c", "publish", routed_queues=["billing.q"]),  # no id, no body digest
        record("d", "deliver", ts=at(11), message_id="m-1", queue="billing.q", redelivered=True),
        record("e", "deliver", ts=at(11), message_id="m-1", queue="recovery.dead_letters"),
    ]
    producers, consumers, routes = trace_facts.trace_facts(
        frame(spark, rows), {"billing.q": "billing"}, ["recovery.unrouted", "recovery.dead_letters"]
    )
    assert producers.columns == [
        *PRODUCER_LOG_SCHEMA.fieldNames(),
        "file_hour_ms",
        "malformed",
        "source",
    ]
    got = sorted(
        (r.message_id or "", r.producer, r.outcome, r.malformed, r.source)
        for r in producers.collect()
    )
    assert got == [
        ("", "broker:svc", "ack", True, "trace"),  # no id, no body digest: malformed
        ("m-1", "broker:svc", "ack", False, "trace"),  # its replayed record dropped by key
        ("trace:" + "f" * 32, "broker:svc", "ack", False, "trace"),
    ]
    # Lazarus's own queues are neither a delivery nor a route.
    [delivery] = consumers.collect()
    assert (delivery.consumer_group, delivery.queue, delivery.redelivered, delivery.outcome) == (
        "billing",
        "billing.q",
        True,
        "delivered",
    )
    assert sorted((r.routing_key, tuple(r.groups)) for r in routes.collect()) == [
        ("order.created", ("(routed to no queue)",)),
        ("order.created", ("audit.q", "billing")),
    ]


def test_route_runs_cut_where_the_routing_changes_even_when_it_flaps(spark):
    def route(ts, *groups, key="k"):
        return ("x", key, ts, list(groups))

    routes = spark.createDataFrame(
        [
            route(1, "a"),
            route(2, "a"),
            route(3, "a", "b"),
            route(4, "a"),  # back: the (set) spans overlap, the exact path cuts each change
            route(1, "c", key="calm"),
            route(9, "c", "d", key="calm"),
        ],
        "exchange string, routing_key string, ts long, groups array<string>",
    )
    assert trace_facts.route_runs(routes) == [
        ("x", "calm", ("c",), 1),
        ("x", "calm", ("c", "d"), 9),
        ("x", "k", ("a",), 1),
        ("x", "k", ("a", "b"), 3),
        ("x", "k", ("a",), 4),
    ]


def test_traced_expectations_hold_each_run_until_the_next():
    runs = [("x", "k", ("a",), 10), ("x", "k", ("a", "b"), 30), ("x", "j", ("c",), 5)]
    got = sorted(
        (e.pattern, e.consumer_group, e.from_ms, e.until_ms)
        for e in trace_facts.traced_expectations(runs)
    )
    assert got == sorted(
        [
            ("k", "a", SPAN_START, 30),
            ("k", "a", 30, SPAN_END),
            ("k", "b", 30, SPAN_END),
            ("j", "c", SPAN_START, SPAN_END),
        ]
    )
    assert all(e.source == "traced" and e.exact for e in trace_facts.traced_expectations(runs))


def test_bindings_that_differ_from_the_broker_are_named():
    keys = [(1, "x", "order.created"), (2, "x", "order.paid")]
    every = [
        Expectation("x", "order.*", "billing", source="bound"),
        Expectation("x", "order.created", "audit", source="traced", exact=True),
        Expectation("x", "order.created", "billing", source="traced", exact=True),
        Expectation("x", "order.paid", "(routed to no queue)", source="traced", exact=True),
    ]
    assert trace_differences(keys, every) == [
        ("x", "order.created", "audit", "routed, not bound"),
        ("x", "order.paid", "billing", "bound, not routed"),
    ]
    assert trace_differences(keys, every[1:]) == []  # no bindings: nothing to check against


def test_a_trace_gap_is_an_input_gap_of_every_traced_group_for_each_hour_it_touches():
    start = 5 * HOUR_MS
    gap = {"kind": "uncovered", "node": None, "from_ms": start - 60_000, "until_ms": start + 1}
    rows = trace_gap_rows([gap], ["a", "b"], 0, 24 * HOUR_MS)
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("trace", "a", 4 * HOUR_MS),
        ("trace", "b", 4 * HOUR_MS),
        ("trace", "a", start),
        ("trace", "b", start),
    ]
    assert rows[0][1].startswith("trace_gap uncovered 1970-01-01T04:59:00.000Z..")
    # A delivery hidden at hour H belongs to a window up to 1 h + grace before it.
    assert (3 * HOUR_MS, "a") in gap_windows(rows, grace_ms=HOUR_MS)


def test_the_strongest_source_wins_each_fact(spark):
    def fact(message_id, source, outcome):
        return (1, at(10), "p", message_id, "x", "k", 1, outcome, None, None, 0, False, source)

    schema = (
        "v long, ts long, producer string, message_id string, exchange string, "
        "routing_key string, attempt long, outcome string, confirm_ms long, size long, "
        "file_hour_ms long, malformed boolean, source string"
    )
    log = spark.createDataFrame([fact("both", "log", "ack")], schema)
    traced = spark.createDataFrame(
        [fact("both", "trace", "ack"), fact("traced", "trace", "ack")], schema
    )
    span = spark.createDataFrame(
        [fact("traced", "span", "sent"), fact("span-only", "span", "sent")], schema
    )
    merged = spans.strongest_first([log, traced, span], ("message_id",)).collect()
    assert sorted((r.message_id, r.source) for r in merged) == [
        ("both", "log"),
        ("span-only", "span"),
        ("traced", "trace"),  # the broker took it: stronger than a span's "sent"
    ]


def test_a_consumers_ack_beats_the_brokers_delivery(spark):
    def fact(message_id, group, source, outcome):
        return (1, at(11), group, "c", None, message_id, False, outcome, None, 0, False, source)

    schema = (
        "v long, ts long, consumer_group string, consumer string, queue string, "
        "message_id string, redelivered boolean, outcome string, handle_ms long, "
        "file_hour_ms long, malformed boolean, source string"
    )
    log = spark.createDataFrame([fact("m", "billing", "log", "ack")], schema)
    span = spark.createDataFrame([fact("m", "audit", "span", "reject")], schema)
    traced = spark.createDataFrame(
        [
            fact("m", "billing", "trace", "delivered"),  # the log's ack says more
            fact("m", "audit", "trace", "delivered"),  # the span's settle says more
            fact("m", "refunds", "trace", "delivered"),  # only the broker saw this one
        ],
        schema,
    )
    merged = spans.strongest_first([log, span, traced], ("message_id", "consumer_group"))
    assert sorted((r.consumer_group, r.source, r.outcome) for r in merged.collect()) == [
        ("audit", "span", "reject"),
        ("billing", "log", "ack"),
        ("refunds", "trace", "delivered"),
    ]
