"""One tiny, exact fixture per audit rule (definitions: the docstring of spark/transforms.py)."""

import json
import random
import re
from datetime import datetime

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from spark import metrics
from spark.schema import topic_pattern_regex
from tests.helpers.spark import DAY, at, consume, dead_letter, publish

pytestmark = pytest.mark.spark  # slow where a test needs the session (conftest.py)

ZERO = {
    "lost": 0,
    "pending": 0,
    "unverified": 0,
    "dup_msgs": 0,
    "dup_deliveries": 0,
    "dup_producer_retry": 0,
    "dup_broker_redelivery": 0,
    "dup_consumer_reprocessing": 0,
    "dead_lettered": 0,
    "recovered": 0,
    "orphan_consumptions": 0,
    "clock_skew": 0,
    "late_deliveries": 0,
    "malformed_lines": 0,
    "input_gaps": 0,
}


def pick(totals: dict, expected: dict) -> dict:
    return {name: totals[name] for name in expected}


def window_start(hour: int) -> datetime:
    return DAY.replace(hour=hour, tzinfo=None)


def test_it_attributes_an_unflagged_second_delivery_of_a_retried_publish_to_the_retry(spark, audit):
    totals, out = audit(
        producers=[
            publish("m1", at(10), attempt=1, outcome="timeout"),
            publish("m1", at(10, 0, 5), attempt=2, outcome="ack"),
        ],
        consumers=[consume("m1", at(10, 0, 1)), consume("m1", at(10, 0, 6))],
    )
    expected = {
        **ZERO,
        "publish_attempts": 2,
        "distinct_published": 1,
        "producer_retries": 1,
        "confirmed": 1,
        "delivered_unique": 1,
        "dup_msgs": 1,
        "dup_deliveries": 1,
        "dup_producer_retry": 1,
    }
    assert pick(totals, expected) == expected
    assert_df_equality(
        out["duplicates"].select("message_id", "consumer_group", "cause", "extra_deliveries"),
        spark.createDataFrame(
            [("m1", "billing", "producer_retry", 1)],
            "message_id string, consumer_group string, cause string, extra_deliveries long",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.quick
def test_it_attributes_a_redelivered_delivery_to_the_broker(audit):
    totals, _ = audit(
        producers=[publish("m1", at(10))],
        consumers=[
            consume("m1", at(10, 0, 1), outcome="requeue"),
            consume("m1", at(10, 0, 2), redelivered=True),
        ],
    )
    expected = {**ZERO, "delivered_unique": 1, "dup_msgs": 1, "dup_deliveries": 1}
    expected["dup_broker_redelivery"] = 1
    assert pick(totals, expected) == expected


def test_it_counts_a_second_handling_without_cause_as_consumer_reprocessing(audit):
    totals, _ = audit(
        producers=[publish("m1", at(10))],
        consumers=[consume("m1", at(10, 0, 1)), consume("m1", at(10, 5), consumer="c2")],
    )
    expected = {"dup_deliveries": 1, "dup_consumer_reprocessing": 1, "dup_producer_retry": 0}
    assert pick(totals, expected) == expected


@pytest.mark.quick
def test_it_counts_dead_lettered_then_replayed_then_consumed_as_recovered_not_lost(audit):
    totals, out = audit(
        producers=[publish("m1", at(10))],
        consumers=[
            consume("m1", at(10, 0, 1), outcome="reject"),
            consume("m1", at(10, 30)),  # the replay
        ],
        store=[dead_letter(7, "m1", at(10, 0, 2), reason="rejected", replay_count=1)],
    )
    expected = {
        **ZERO,
        "delivered_unique": 1,
        "dead_lettered": 1,
        "dead_lettered_rejected": 1,
        "dead_lettered_expired": 0,
        "recovered": 1,
    }
    assert pick(totals, expected) == expected
    assert out["lost"].count() == 0


def test_it_does_not_call_a_dead_letter_waiting_in_the_store_lost(audit):
    totals, _ = audit(
        producers=[publish("m1", at(10))],
        store=[dead_letter(7, "m1", at(10, 0, 2), reason="expired")],
    )
    expected = {**ZERO, "dead_lettered": 1, "dead_lettered_expired": 1, "delivered_unique": 0}
    assert pick(totals, expected) == expected


def test_it_ignores_a_consumption_after_the_grace_and_reports_the_message_lost(audit):
    # Window 10:00-11:00, grace 60 min: the deadline is 12:00.
    totals, out = audit(
        producers=[publish("m1", at(10, 10))],
        consumers=[consume("m1", at(12, 0, 1))],
    )
    expected = {**ZERO, "late_deliveries": 1, "delivered_unique": 0, "lost": 1}
    assert pick(totals, expected) == expected
    assert [r.message_id for r in out["lost"].collect()] == ["m1"]


def test_it_counts_a_consumption_before_its_publish_as_clock_skew(audit):
    totals, _ = audit(
        producers=[publish("m1", at(10, 0, 5)), publish("m2", at(10, 1))],
        consumers=[consume("m1", at(10, 0, 1)), consume("m2", at(10, 1, 2))],
    )
    expected = {
        **ZERO,
        "delivered_unique": 2,
        "clock_skew": 1,
        "latency_p50_ms": 2000,
        "latency_max_ms": 2000,
        "within_sla_share": 1.0,
    }
    assert pick(totals, expected) == expected


def test_it_reports_latency_percentiles_and_the_share_within_the_sla(audit):
    latencies = [100 * i for i in range(1, 101)]  # 100 ms .. 10 s
    totals, _ = audit(
        producers=[publish(f"m{i}", at(10)) for i in range(100)],
        consumers=[consume(f"m{i}", at(10) + ms) for i, ms in enumerate(latencies)],
        sla_ms=5000,
    )
    expected = {
        "latency_p50_ms": 5000,
        "latency_p95_ms": 9500,
        "latency_p99_ms": 9900,
        "latency_max_ms": 10_000,
        "within_sla_share": 0.5,
    }
    assert pick(totals, expected) == expected


def _nearest_rank(latencies: list[int], percent: int) -> int:
    ordered = sorted(latencies)
    return ordered[-(-percent * len(ordered) // 100) - 1]


def test_it_keeps_every_latency_figure_exact_to_the_millisecond(audit):
    # The rollup counts latencies in buckets of a few milliseconds (metrics.LATENCY_SLOTS):
    # odd milliseconds on both sides of bucket edges and of the SLA, in two windows and two
    # groups, with clock skew, must read as the sorted latencies themselves do.
    rng = random.Random(35)
    sla_ms = 1003
    latencies = {}
    producers, consumers = [], []
    for i in range(240):
        hour = 10 + i % 2
        group = "billing" if i % 3 else "audit"
        ms = rng.choice([rng.randrange(0, 2500), rng.randrange(995, 1012), -rng.randrange(1, 40)])
        producers.append(publish(f"m{i}", at(hour, 5)))
        consumers.append(consume(f"m{i}", at(hour, 5) + ms, group=group, queue=group))
        latencies.setdefault((hour, group), []).append(ms)
    bindings = [
        {"exchange": "orders", "routing_key": "order.*", "consumer_group": g, "queue": g}
        for g in ("billing", "audit")
    ]
    totals, out = audit(producers=producers, consumers=consumers, bindings=bindings, sla_ms=sla_ms)

    def figures(values):
        on_clock = [v for v in values if v >= 0]
        return {
            "latency_p50_ms": _nearest_rank(on_clock, 50),
            "latency_p95_ms": _nearest_rank(on_clock, 95),
            "latency_p99_ms": _nearest_rank(on_clock, 99),
            "latency_max_ms": max(on_clock),
            "clock_skew": len(values) - len(on_clock),
            "within_sla_share": sum(v <= sla_ms for v in on_clock) / len(on_clock),
        }

    every = [v for values in latencies.values() for v in values]
    assert pick(totals, figures(every)) == figures(every)
    rows = out["windows"].where(F.col("exchange").isNotNull()).collect()
    assert {
        (r.window_start.hour, r.consumer_group): pick(r.asDict(), figures(every)) for r in rows
    } == {(hour, group): figures(values) for (hour, group), values in latencies.items()}


def test_the_latency_histogram_spreads_each_bucket_back_to_its_milliseconds():
    slots = metrics.LATENCY_SLOTS
    counts = {c: [0, 0] for c in metrics.SLOT_COLUMNS}
    counts[metrics.SLOT_COLUMNS[0]] = [2, 0]
    counts[metrics.SLOT_COLUMNS[-1]] = [1, 4]
    buckets = pa.table(
        {
            "window_ms": [0, 0],
            "exchange": ["orders", "orders"],
            "consumer_group": ["billing", "billing"],
            "latency_ms": [0, 3 * slots],
            **counts,
        }
    )
    assert metrics.histogram_rows(buckets).to_pylist() == [
        {
            "window_ms": 0,
            "exchange": "orders",
            "consumer_group": "billing",
            "latency_ms": ms,
            "n": n,
        }
        for ms, n in ((0, 2), (slots - 1, 1), (4 * slots - 1, 4))
    ]
    assert metrics.histogram_rows(buckets.slice(0, 0)).num_rows == 0


@pytest.mark.quick
def test_it_counts_a_consumption_nobody_logged_publishing_as_an_orphan(audit):
    totals, out = audit(
        producers=[publish("m1", at(10))],
        consumers=[
            consume("m1", at(10, 0, 1)),
            consume("ghost", at(11, 5)),
            consume("replayed-old", at(11, 6)),  # known to the store: not an orphan
        ],
        store=[dead_letter(3, "replayed-old", at(9), replay_count=1)],
    )
    assert pick(totals, {"orphan_consumptions": 0}) == {"orphan_consumptions": 1}
    rows = out["windows"].where(F.col("orphan_consumptions") > 0).collect()
    assert [(r.window_start, r.exchange, r.consumer_group) for r in rows] == [
        (window_start(11), None, "billing")
    ]
    assert [r.message_id for r in out["orphans"].collect()] == ["ghost"]


@pytest.mark.quick
def test_it_reports_a_confirmed_message_nobody_consumed_as_lost_with_evidence(spark, audit):
    totals, out = audit(
        producers=[publish("m1", at(10)), publish("m2", at(10, 1))],
        consumers=[consume("m2", at(10, 1, 1))],
    )
    expected = {**ZERO, "lost": 1, "delivered_unique": 1, "expected_confirmed": 2}
    assert pick(totals, expected) == expected
    assert totals["loss_ppm"] == 500_000.0
    assert_df_equality(
        out["lost"],
        spark.createDataFrame(
            [
                (
                    window_start(10),
                    "orders",
                    "order.created",
                    "billing",
                    "m1",
                    1,
                    "lost",
                    None,
                    "bound",
                )
            ],
            "window_start timestamp, exchange string, routing_key string, "
            "consumer_group string, message_id string, attempts int, verdict string, "
            "store_id long, expected_by string",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_the_rollup_leaves_the_sessions_partition_size_as_it_found_it(spark, audit):
    # The rollup sets its own size while it checkpoints (rollup.ROLLUP_PARTITION_BYTES; what
    # that buys is measured in bench/audit.py, not here): the day comes out the same, and the
    # caller's setting, or its absence, is back afterwards.
    key = "spark.sql.adaptive.advisoryPartitionSizeInBytes"
    day = {
        "producers": [publish("m1", at(10)), publish("m2", at(10, 1))],
        "consumers": [consume("m2", at(10, 1, 1))],
    }
    spark.conf.set(key, "123456")
    try:
        totals, _ = audit(**day)
        assert (totals["lost"], totals["delivered_unique"]) == (1, 1)
        assert spark.conf.get(key) == "123456"
    finally:
        spark.conf.unset(key)
    audit(**day)
    assert spark.conf.get(key, None) is None  # unset before, unset after


def test_it_does_not_expect_unconfirmed_or_returned_messages(audit):
    totals, _ = audit(
        producers=[
            publish("m1", at(10), outcome="timeout"),
            publish("m2", at(10), outcome="returned"),
            publish("m3", at(10), outcome="nack"),
        ],
    )
    expected = {**ZERO, "unconfirmed": 1, "returned": 1, "nacked": 1, "confirmed": 0}
    assert pick(totals, expected) == expected


def test_it_holds_each_fanout_group_to_account_and_counts_a_message_once(spark, audit):
    bindings = [
        {"exchange": "orders", "routing_key": "#", "consumer_group": "billing"},
        {"exchange": "orders", "routing_key": "order.*", "consumer_group": "audit"},
        {"exchange": "orders", "routing_key": "refund.#", "consumer_group": "refunds"},
    ]
    totals, out = audit(
        producers=[publish("m1", at(10))],
        consumers=[
            consume("m1", at(10, 0, 1), group="billing"),
            # audit's consumer is alive (a group that writes no line is a missing log, not
            # a loss: test_it_calls_a_bound_group_without_any_line_unverified) but never acks.
            consume("m1", at(10, 0, 2), group="audit", outcome="requeue"),
        ],
        bindings=bindings,
    )
    expected = {"distinct_published": 1, "delivered_unique": 1, "lost": 1}
    assert pick(totals, expected) == expected
    rows = out["windows"].where(F.col("exchange").isNotNull())
    assert_df_equality(
        rows.select("consumer_group", "distinct_published", "delivered_unique", "lost"),
        spark.createDataFrame(
            [("billing", 1, 1, 0), ("audit", 1, 0, 1)],
            "consumer_group string, distinct_published long, delivered_unique long, lost long",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_it_counts_malformed_lines_without_failing(spark, tmp_path):
    from spark.audit import run_audit

    hour = tmp_path / "producer" / "dt=2026-03-01" / "hour=10"
    hour.mkdir(parents=True)
    good = json.dumps(publish("m1", at(10)))
    (hour / "p1.jsonl").write_text(
        "\n".join(
            [
                good,
                "{not json",
                '{"v": 1, "ts": "yesterday", "producer": "p1", "message_id": "m2"}',
                '{"v": 9, "ts": 1, "producer": "p1", "message_id": "m3", "exchange": "x", '
                '"outcome": "ack"}',
            ]
        )
        + "\n"
    )
    # billing's consumer is alive (it requeued m1) but never acked it: m1 is lost.
    consumer_hour = tmp_path / "consumer" / "dt=2026-03-01" / "hour=10"
    consumer_hour.mkdir(parents=True)
    (consumer_hour / "c1.jsonl").write_text(
        json.dumps(consume("m1", at(10, 0, 1), outcome="requeue")) + "\n"
    )
    out = run_audit(
        spark,
        "2026-03-01",
        str(tmp_path / "producer"),
        str(tmp_path / "consumer"),
        None,
        [{"exchange": "orders", "routing_key": "#", "consumer_group": "billing"}],
        now="2026-03-05T00:00:00Z",
    )
    totals = out["totals"].first()
    assert (totals.malformed_lines, totals.distinct_published, totals.lost) == (3, 1, 1)
    spark.catalog.clearCache()


@pytest.mark.quick
def test_it_flags_an_input_gap_and_does_not_call_its_messages_lost(spark, audit):
    totals, out = audit(
        producers=[
            publish("a", at(9), producer="p1"),
            # p1 writes nothing at 10:00 ...
            publish("b", at(11), producer="p1"),
            publish("m1", at(10, 30), producer="p2"),  # never consumed
        ],
        consumers=[consume("a", at(9, 0, 1)), consume("b", at(11, 0, 1), consumer="c2")],
    )
    expected = {**ZERO, "input_gaps": 1, "lost": 0, "unverified": 1, "delivered_unique": 2}
    assert pick(totals, expected) == expected
    assert [(r.window_start, r.source, r.process) for r in out["input_gaps"].collect()] == [
        (window_start(10), "producer", "p1")
    ]
    assert [(r.message_id, r.verdict) for r in out["lost"].collect()] == [("m1", "unverified")]


def test_it_keeps_a_window_provisional_until_its_grace_has_passed(spark, audit):
    # now = 11:30, grace 60: the 09:00 window (deadline 11:00) is FINAL, 10:00 (12:00) is not.
    totals, out = audit(
        producers=[publish("old", at(9, 10)), publish("new", at(10, 10))],
        # billing's consumer is alive (it requeued "old") but never acked it.
        consumers=[consume("old", at(9, 10, 1), outcome="requeue")],
        now=DAY.replace(hour=11, minute=30),
    )
    rows = out["windows"].where(F.col("exchange").isNotNull())
    assert_df_equality(
        rows.select("window_start", "status", "lost", "pending", "loss_ppm"),
        spark.createDataFrame(
            [
                (window_start(9), "FINAL", 1, 0, 1_000_000.0),
                (window_start(10), "PROVISIONAL", None, 1, None),
            ],
            "window_start timestamp, status string, lost long, pending long, loss_ppm double",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    expected = {"status": "PROVISIONAL", "lost": 1, "pending": 1}
    assert pick(totals, expected) == expected
    assert [r.message_id for r in out["lost"].collect()] == ["old"]


def test_it_keeps_a_message_in_the_window_of_its_first_attempt(audit):
    # First attempt the evening before: not the audited day's message, and not an orphan.
    totals, _ = audit(
        producers=[
            publish("m1", at(-1, 59), attempt=1, outcome="timeout"),
            publish("m1", at(0, 0, 3), attempt=2),
        ],
        consumers=[consume("m1", at(0, 0, 4))],
    )
    expected = {"distinct_published": 0, "orphan_consumptions": 0, "lost": 0}
    assert pick(totals, expected) == expected


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("#", "", True),
        ("#", "a.b", True),
        ("order.*", "order.created", True),
        ("order.*", "order.created.eu", False),
        ("order.#", "order", True),
        ("order.#", "order.created.eu", True),
        ("#.eu", "eu", True),
        ("#.eu", "order.created.eu", True),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.*.z", "a.z", False),
        ("a.b", "a.b", True),
        ("a.b", "aXb", False),
    ],
)
def test_it_matches_routing_keys_with_topic_semantics(pattern, key, matches):
    assert bool(re.fullmatch(topic_pattern_regex(pattern), key)) is matches
