"""The rollup's two paths give the same audit: each day below goes through the fold path and the
exact path (``rollup.takes_fold``, forced by ``audit_frames``' ``fold``) and every output,
the latency histogram and the evidence counts must be the same, row for row.

Which path a day takes is a cost rule (``rollup.FOLD_MAX_MULTI_GROUP_SHARE``), not a
correctness one: a day near the threshold must not change its figures when it crosses it.
The fold path itself still sends some messages the exact way (lines of several groups, lines
on both sides of the deadline, orphan lines): the days have those too."""

import pytest

from spark import audit, metrics, rollup
from spark.schema import CONSUMER_LOG_SCHEMA, PRODUCER_LOG_SCHEMA, STORE_EXPORT_SCHEMA, epoch_ms
from tests.helpers.spark import (
    BINDINGS,
    DAY,
    DAY_MS,
    LATER,
    at,
    consume,
    dead_letter,
    log_frame,
    publish,
)

# Four audits of small inline days (six rollups): slow, as every test needing the session
# (tests/spark/conftest.py); test_it_lets_the_day_choose_its_path_unless_told is quick.
pytestmark = pytest.mark.spark

GRACE_MS = 60 * 60_000
SLA_MS = 5000

# One group bound to order.*, a second to order.refunded only: most messages have one group's
# lines (the fold settles them), the refunds two (the exact path, inside the fold path).
# Each consumer process logs contiguous hours, so the day has no input gap.
EVERYDAY = {
    "bindings": [
        *BINDINGS,
        {"exchange": "orders", "routing_key": "order.refunded", "consumer_group": "audit"},
    ],
    "producers": [
        publish("ok1", at(10)),
        publish("ok2", at(10, 1)),
        publish("ok3", at(10, 2)),
        publish("retried", at(10, 5), outcome="timeout"),
        publish("retried", at(10, 5, 2), attempt=2),
        publish("redelivered", at(10, 6)),
        publish("reprocessed", at(10, 7)),
        publish("lost", at(11)),
        publish("late", at(11, 10)),  # deadline 13:00
        publish("straddle", at(11, 20)),  # one line before its deadline, one after
        publish("skewed", at(12, 0, 5)),
        publish("ok4", at(13, 5)),
        publish("refund", at(12, 30), key="order.refunded"),
        publish("refund-half", at(12, 31), key="order.refunded"),
        publish("dl-recovered", at(14)),
        publish("dl-waiting", at(14, 10)),
        publish("nacked", at(15), outcome="nack"),
        publish("returned", at(15, 1), outcome="returned"),
        publish("nobodys", at(15, 10), exchange="audit-trail", key="x"),
        publish("evening", at(23, 30), producer="p2"),
        publish("tomorrow", at(24, 10), producer="p2"),  # the next day's
    ],
    "consumers": [
        consume("ok1", at(10, 0, 1)),
        consume("ok2", at(10, 1) + 250),
        consume("ok3", at(10, 2, 7)),  # past the SLA
        consume("retried", at(10, 5, 3), consumer="c2"),
        consume("retried", at(10, 5, 4), consumer="c2"),
        consume("redelivered", at(10, 6, 1), outcome="requeue"),
        consume("redelivered", at(10, 6, 2), redelivered=True),
        consume("reprocessed", at(10, 7, 1)),
        consume("reprocessed", at(10, 8), consumer="c2"),
        consume("straddle", at(11, 20, 1), outcome="requeue"),
        consume("late", at(13, 0, 1)),
        consume("straddle", at(13, 30)),
        consume("skewed", at(12, 0, 2)),
        consume("ok4", at(13, 5, 1)),
        consume("refund", at(12, 30, 1)),
        consume("refund", at(12, 30, 2), group="audit", consumer="a1", queue="aq"),
        consume("refund-half", at(12, 31, 1)),
        consume("refund-half", at(12, 31, 2), group="audit", consumer="a1", outcome="reject"),
        consume("dl-recovered", at(14, 0, 1), outcome="reject"),
        consume("dl-recovered", at(14, 30)),  # the replay
        consume("ghost", at(16, 5), consumer="c3"),
        consume("ghost2", at(16, 6), consumer="c3"),
        consume("ghost2", at(16, 6), consumer="c3"),  # the same line twice
        consume("replayed-old", at(16, 7), consumer="c3"),  # the store knows it: no orphan
        consume("evening", at(24, 0, 1), consumer="c4"),
    ],
    "store": [
        dead_letter(7, "dl-recovered", at(14, 0, 2), replay_count=1),
        dead_letter(8, "dl-waiting", at(14, 10, 5), reason="expired"),
        dead_letter(9, "returned", at(15, 1, 1), kind="returned"),
        dead_letter(3, "replayed-old", at(9), replay_count=1),
    ],
}

# A silent day: billing wrote no line for 10:00's window (a missing log), p1 none at 14:00
# (an input gap), ledger consumed a key no binding names (observed: a second pass), billing
# one it is not bound to, a message first published the evening before; the audit runs at
# 21:00, so 20:00's window is still PROVISIONAL. Every other process logs contiguous hours.
SILENT = {
    "now": DAY.replace(hour=21),
    "producers": [
        publish("yesterday", at(-1, 59), outcome="timeout", producer="p0"),
        publish("yesterday", at(0, 0, 3), attempt=2, producer="p0"),
        publish("s1", at(10), producer="p3"),
        publish("s2", at(10, 30), producer="p3"),
        publish("a", at(13), producer="p1"),
        # p1 writes nothing at 14:00 ...
        publish("b", at(15), producer="p1"),
        publish("g1", at(14, 30), producer="p2"),  # never consumed
        publish("r1", at(15, 5), key="refund.created", producer="p1"),
        *[
            publish(f"pay{i}", at(16, i), exchange="payments", key="payment.settled", producer="p4")
            for i in range(4)
        ],
        publish("pending", at(20, 10), producer="p5"),
    ],
    "consumers": [
        consume("yesterday", at(0, 0, 4), consumer="c0"),
        consume("a", at(13, 0, 1)),
        consume("b", at(15, 0, 1), consumer="c2"),
        consume("r1", at(15, 5, 1), consumer="c2"),
        *[
            consume(f"pay{i}", at(16, i, 1), group="ledger", consumer="l1", queue="lq")
            for i in (0, 1, 3)
        ],
        consume("pay3", at(16, 3, 2), group="ledger", consumer="l1", queue="lq"),
    ],
}

DAYS = {"everyday": EVERYDAY, "silent": SILENT}

# What each day is for: a few exact totals (the same on both paths, as the test checks).
EXPECTED = {
    "everyday": {
        "distinct_published": 19,
        "expected_confirmed": 18,  # 16 for billing, 2 refunds for audit
        "delivered_unique": 13,
        "lost": 4,  # lost, late, straddle (billing); refund-half (audit)
        "unverified": 0,
        "dup_producer_retry": 1,
        "dup_broker_redelivery": 1,
        "dup_consumer_reprocessing": 1,
        "late_deliveries": 2,
        "clock_skew": 1,
        "dead_lettered": 2,
        "recovered": 1,
        "unclaimed": 1,
        "orphan_consumptions": 3,
        "input_gaps": 0,
        "missing_consumer_logs": 0,
    },
    "silent": {
        "distinct_published": 11,
        "lost": 1,  # pay2 (ledger, observed)
        "unverified": 3,  # s1, s2 (billing's missing log), g1 (p1's gap)
        "pending": 1,
        "missing_consumer_logs": 1,
        "input_gaps": 1,
        "unbound_consumption": 4,  # ledger x 3, billing's refund
        "dup_consumer_reprocessing": 1,
    },
}


# By itself the everyday day folds; the silent day's unbound ledger lines (a group no binding
# names may share a message with any other) are over the share: it joins.
CHOSEN = {"everyday": True, "silent": False}


def through(spark, day: dict, fold: bool) -> tuple[bool, dict, dict]:
    """The day's audit on the path ``fold`` says: the path the day would have taken by itself,
    the evidence counts, and every output's schema and rows (in an order of their own), the
    latency histogram's too."""
    now_ms = epoch_ms(day.get("now", LATER))
    facts, rolled, listed = audit.audit_rollup(
        log_frame(spark, PRODUCER_LOG_SCHEMA, day["producers"]),
        log_frame(spark, CONSUMER_LOG_SCHEMA, day["consumers"]),
        spark.createDataFrame(day.get("store", []), STORE_EXPORT_SCHEMA),
        day.get("bindings", BINDINGS),
        DAY_MS,
        GRACE_MS,
        now_ms,
        fold=fold,
    )
    outputs = audit.audit_outputs(facts, rolled, listed, DAY_MS, GRACE_MS, SLA_MS, now_ms)
    outputs["histogram"] = metrics.latency_histogram(rolled)
    written = {
        name: (frame.schema, sorted(frame.collect(), key=repr)) for name, frame in outputs.items()
    }
    return rollup.takes_fold(facts), listed, written


@pytest.mark.parametrize("name", DAYS)
def test_it_writes_every_output_the_same_on_the_fold_and_the_exact_path(spark, name):
    try:
        chosen, fold_listed, folded = through(spark, DAYS[name], fold=True)
        _, exact_listed, exact = through(spark, DAYS[name], fold=False)
    finally:
        spark.catalog.clearCache()
    assert chosen is CHOSEN[name]  # the path the day takes in the nightly audit
    assert set(folded) == {*audit.OUTPUTS, "histogram"} - {"manifest"}
    assert fold_listed == exact_listed
    for output in sorted(folded):
        assert folded[output] == exact[output], output
    totals = folded["totals"][1][0].asDict()
    assert {k: totals[k] for k in EXPECTED[name]} == EXPECTED[name]


def test_it_lets_the_day_choose_its_path_unless_told():
    class Facts:  # the two fields ``takes_fold`` reads
        producer_lines = 10
        multi_group_lines = 3  # over FOLD_MAX_MULTI_GROUP_SHARE of them

    assert rollup.FOLD_MAX_MULTI_GROUP_SHARE == 0.2
    assert [rollup.takes_fold(Facts, fold) for fold in (None, True, False)] == [False, True, False]
    Facts.multi_group_lines = 2
    assert rollup.takes_fold(Facts) is True
