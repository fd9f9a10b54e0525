"""Who was expected to receive what (issue #16): bindings that change during the day, groups the
logs show consuming keys no binding names, and what the audit cannot decide, counted.

Definitions: "expected group", "unclaimed", "unbound_consumption" and "missing_consumer_logs" in
the docstring of spark/transforms.py.
"""

from datetime import datetime

import pytest
from pyspark.sql import functions as F

from spark.evidence import expected_by_segments
from spark.expectations import SPAN_END, SPAN_START, segments
from spark.metrics import warnings
from tests.helpers.spark import DAY, at, consume, publish

pytestmark = pytest.mark.spark  # slow where a test needs the session (conftest.py)


def window_start(hour: int) -> datetime:
    return DAY.replace(hour=hour, tzinfo=None)


def lost_rows(out) -> list[tuple]:
    return sorted(
        (r.message_id, r.consumer_group, r.verdict, r.expected_by) for r in out["lost"].collect()
    )


def test_segments_split_the_day_where_the_set_of_groups_changes():
    assert segments([("a", SPAN_START, SPAN_END), ("b", 100, 200)]) == [
        (SPAN_START, 100, frozenset({"a"})),
        (100, 200, frozenset({"a", "b"})),
        (200, SPAN_END, frozenset({"a"})),
    ]
    # Adjacent spans of one group merge; time nobody is expected leaves no segment.
    assert segments([("a", 0, 10), ("a", 10, 20)]) == [(0, 20, frozenset({"a"}))]
    assert segments([("a", 0, 10), ("b", 20, 30)]) == [
        (0, 10, frozenset({"a"})),
        (20, 30, frozenset({"b"})),
    ]


def test_a_lost_pairs_source_is_the_strongest_over_its_window_in_disjoint_segments():
    start = int(DAY.timestamp() * 1000)
    hour = 3_600_000
    provenance = [
        # bound from 10:30 (the 10:00 window overlaps it) to the end of the day ...
        ("orders", "rk", "billing", start + 10 * hour + 1_800_000, SPAN_END, "bound"),
        # ... observed from 08:00 to 12:00: observed only 08:00-10:00, then bound
        ("orders", "rk", "billing", start + 8 * hour, start + 12 * hour, "observed"),
        # configured all day wins every window
        ("orders", "rk", "ledger", SPAN_START, SPAN_END, "configured"),
        ("orders", "rk", "ledger", start + 3 * hour, start + 4 * hour, "observed"),
    ]
    assert expected_by_segments(provenance, start) == [
        ("orders", "rk", "billing", start + 8 * hour, start + 10 * hour, "observed"),
        ("orders", "rk", "billing", start + 10 * hour, start + 24 * hour, "bound"),
        ("orders", "rk", "ledger", start, start + 24 * hour, "configured"),
    ]
    # A span that ends where a window starts does not reach into it.
    assert expected_by_segments(
        [("x", "k", "g", SPAN_START, start + 2 * hour, "bound")], start
    ) == [("x", "k", "g", start, start + 2 * hour, "bound")]


def test_a_binding_counts_from_when_it_was_first_seen_to_when_it_was_last_seen(audit):
    """ "late" was bound at noon: the morning's messages are not its loss. "gone" was unbound at
    14:00: the message of 13:40 it never got is lost, the one of 14:20 is not expected."""
    bindings = [
        {"exchange": "orders", "routing_key": "#", "consumer_group": "billing"},
        {"exchange": "orders", "routing_key": "#", "consumer_group": "late", "from_ms": at(12)},
        {"exchange": "orders", "routing_key": "#", "consumer_group": "gone", "until_ms": at(14)},
    ]
    producers = [
        publish("morning", at(10)),
        publish("h11", at(11)),
        publish("noon-1", at(12)),
        publish("noon-2", at(12, 30)),
        publish("after-1", at(13, 10)),
        publish("after-2", at(13, 40)),
        publish("evening", at(14, 20)),
    ]
    # Every group logs each hour it is consuming (a silent hour between two would be a gap).
    late = ["noon-1", "after-1", "after-2", "evening"]  # noon-2 never reaches late
    gone = ["morning", "h11", "noon-1", "noon-2", "after-1"]  # after-2 never reaches gone
    consumers = [consume(p["message_id"], p["ts"] + 1000) for p in producers]  # billing: all
    consumers += [
        consume(p["message_id"], p["ts"] + 2000, group=group)
        for group, ids in (("late", late), ("gone", gone))
        for p in producers
        if p["message_id"] in ids
    ]
    totals, out = audit(producers=producers, consumers=consumers, bindings=bindings)
    assert lost_rows(out) == [
        ("after-2", "gone", "lost", "bound"),
        ("noon-2", "late", "lost", "bound"),
    ]
    # billing x 7, late x 5 (12:00 to 14:20), gone x 6 (10:00 to 13:40)
    assert (totals["expected_confirmed"], totals["lost"], totals["unclaimed"]) == (18, 2, 0)
    assert (totals["unbound_consumption"], totals["missing_consumer_logs"]) == (0, 0)
    # late wrote no line at 10:00, but was not expected then; gone not at 14:00, likewise.
    assert out["input_gaps"].count() == 0


def test_an_exchange_no_binding_knows_is_held_to_the_group_that_consumed_it(spark, audit):
    """No snapshot knows "payments"; "ledger" consumed all of it but 3: those 3 are lost, not a
    quiet zero, and the evidence says the expectation was observed."""
    producers = [
        publish(f"p{i}", at(10, i), exchange="payments", key="payment.settled") for i in range(40)
    ]
    missed = {"p5", "p17", "p33"}
    consumers = [
        consume(p["message_id"], p["ts"] + 500, group="ledger", queue="ledger-q")
        for p in producers
        if p["message_id"] not in missed
    ]
    totals, out = audit(producers=producers, consumers=consumers, bindings=[])
    assert lost_rows(out) == [(m, "ledger", "lost", "observed") for m in sorted(missed)]
    expected = {
        "distinct_published": 40,
        "confirmed": 40,
        "expected_confirmed": 40,
        "delivered_unique": 37,
        "lost": 3,
        "unclaimed": 0,
        "unbound_consumption": 37,
    }
    assert {k: totals[k] for k in expected} == expected
    assert totals["loss_ppm"] == 3 * 1e6 / 40
    observed = [tuple(r) for r in out["expectations"].collect()]
    assert observed == [
        ("payments", "payment.settled", "ledger", "observed", window_start(10), window_start(11))
    ]
    assert {w["code"]: w["count"] for w in warnings(totals)} == {"unbound_consumption": 37}


@pytest.mark.quick
def test_a_confirmed_message_no_group_was_expected_to_receive_is_unclaimed_with_its_id(audit):
    totals, out = audit(
        producers=[
            publish("bound", at(10)),
            publish("nobodys", at(10, 5), exchange="audit-trail", key="x"),
            publish("unconfirmed", at(10, 6), exchange="audit-trail", key="x", outcome="timeout"),
        ],
        consumers=[consume("bound", at(10, 0, 1))],
    )
    assert (totals["unclaimed"], totals["lost"], totals["expected_confirmed"]) == (1, 0, 1)
    assert [(r.message_id, r.exchange, r.routing_key) for r in out["unclaimed"].collect()] == [
        ("nobodys", "audit-trail", "x")
    ]
    row = (
        out["windows"]
        .where(F.col("exchange") == "audit-trail")
        .select("consumer_group", "unclaimed", "distinct_published")
        .collect()
    )
    assert [tuple(r) for r in row] == [(None, 1, 2)]
    assert {w["code"] for w in warnings(totals)} == {"unclaimed"}


@pytest.mark.quick
def test_a_bound_group_without_any_line_is_a_missing_log_and_its_messages_unverified(audit):
    totals, out = audit(
        producers=[publish("m1", at(10)), publish("m2", at(10, 30)), publish("m3", at(11))],
        consumers=[],
    )
    expected = {"lost": 0, "unverified": 3, "missing_consumer_logs": 2, "input_gaps": 0}
    assert {k: totals[k] for k in expected} == expected
    assert sorted(
        (r.window_start, r.source, r.process, r.consumer_group) for r in out["input_gaps"].collect()
    ) == [
        (window_start(10), "consumer", None, "billing"),
        (window_start(11), "consumer", None, "billing"),
    ]
    assert {(r.message_id, r.verdict) for r in out["lost"].collect()} == {
        ("m1", "unverified"),
        ("m2", "unverified"),
        ("m3", "unverified"),
    }
    codes = {w["code"]: w["count"] for w in warnings(totals)}
    assert codes == {"missing_consumer_logs": 2, "unverified": 3}


def test_a_group_with_a_line_before_its_deadline_is_not_missing(audit):
    # 10:00 window, grace 60: deadline 12:00, so a line anywhere in hours 10 to 12 shows billing
    # was logging; m1 is then lost, not unverified.
    totals, _ = audit(
        producers=[publish("m1", at(10)), publish("m2", at(10, 5))],
        consumers=[consume("m2", at(12, 10), outcome="requeue")],
    )
    assert (totals["lost"], totals["unverified"], totals["missing_consumer_logs"]) == (2, 0, 0)


def test_a_group_observed_only_in_the_afternoon_is_expected_only_then(audit):
    producers = [
        publish("morning", at(9), exchange="events", key="e"),
        publish("a1", at(14), exchange="events", key="e"),
        publish("a2", at(15, 30), exchange="events", key="e"),
        publish("a2b", at(15, 50), exchange="events", key="e"),
        publish("a3", at(16, 10), exchange="events", key="e"),
        publish("night", at(20), exchange="events", key="e"),
    ]
    consumers = [
        consume("a1", at(14, 0, 1), group="reports", queue="rq"),
        consume("a2b", at(15, 50, 1), group="reports", queue="rq"),
        consume("a3", at(16, 10, 1), group="reports", queue="rq"),
    ]
    totals, out = audit(producers=producers, consumers=consumers, bindings=[])
    assert lost_rows(out) == [("a2", "reports", "lost", "observed")]
    # The morning and night messages: nobody was expected to receive them.
    assert sorted(r.message_id for r in out["unclaimed"].collect()) == ["morning", "night"]
    assert (totals["unclaimed"], totals["expected_confirmed"]) == (2, 4)


def test_a_bound_group_consuming_a_key_it_is_not_bound_to_is_reported(audit):
    totals, out = audit(
        producers=[publish("o1", at(10)), publish("r1", at(10, 1), key="refund.created")],
        consumers=[consume("o1", at(10, 0, 1)), consume("r1", at(10, 1, 1))],
    )
    # billing is bound to order.* only: its refund.created consumption is reported and held
    # as an observed expectation for that key, so nothing is unclaimed.
    assert (totals["unbound_consumption"], totals["unclaimed"], totals["lost"]) == (1, 0, 0)
    sources = {(r.routing_key, r.source) for r in out["expectations"].collect()}
    assert sources == {("order.created", "bound"), ("refund.created", "observed")}
