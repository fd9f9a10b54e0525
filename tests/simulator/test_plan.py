"""The seeded plan and the truth arithmetic: pure logic, no broker."""

import pytest

from recovery.simulator.demo import DemoTopology, expected_groups, topic_matches
from recovery.simulator.plan import FAULTS, Rates, drop_points, make_plan
from recovery.simulator.truth import build_truth

TOPOLOGY = DemoTopology()


def plan(seed, count=400, rates=None):
    rates = rates or Rates(**dict.fromkeys(FAULTS, 0.1))
    return make_plan(seed, 1, count, rates, TOPOLOGY, "run", producers=2)


def test_it_plans_the_same_messages_for_the_same_seed():
    assert plan("s1") == plan("s1")
    assert plan("s1") != plan("s2")
    assert drop_points("s1", 1, 400, 3) == drop_points("s1", 1, 400, 3)


def test_every_fault_is_planned_and_routed_where_it_happens():
    messages = plan("s1")
    bindings = TOPOLOGY.bindings()
    by_fault = {}
    for message in messages:
        by_fault.setdefault(message.fault, []).append(message)
    assert set(by_fault) == {"none", *FAULTS}
    for message in by_fault["unroutable"]:
        assert expected_groups(bindings, message.exchange, message.routing_key) == []
    assert {m.routing_key for m in by_fault["ttl"]} == {"slow"}
    assert {m.expiration_ms is None for m in by_fault["ttl"]} == {True, False}
    for message in by_fault["reject"] + by_fault["crash"]:
        groups = expected_groups(bindings, message.exchange, message.routing_key)
        assert message.target_group in groups
        assert message.fault_for(message.target_group) == message.fault
    # The overflow messages are one contiguous burst, so the capped queue really overflows.
    indices = [m.index for m in by_fault["overflow"]]
    assert indices == list(range(indices[0], indices[0] + len(indices)))


def test_fanout_and_topic_messages_reach_two_groups():
    bindings = TOPOLOGY.bindings()
    assert expected_groups(bindings, "demo.fanout", "event.eu") == ["demo.billing", "demo.shipping"]
    assert expected_groups(bindings, "demo.topic", "orders.eu.created") == [
        "demo.order-history",
        "demo.orders",
    ]
    assert expected_groups(bindings, "demo.topic", "orders.eu.shipped") == ["demo.order-history"]


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("orders.#", "orders", True),
        ("orders.#", "orders.a.b", True),
        ("orders.*.created", "orders.eu.created", True),
        ("orders.*.created", "orders.created", False),
        ("#", "", True),
        ("payment", "payments", False),
        ("#.created", "a.b.created", True),
    ],
)
def test_topic_matching(pattern, key, matches):
    assert topic_matches(pattern, key) is matches


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="between 0 and 1"):
        Rates(reject=1.5)
    with pytest.raises(ValueError, match="more than 1"):
        Rates(**dict.fromkeys(FAULTS, 0.2))


def test_truth_counts_pairs_and_duplicates_as_the_audit_defines_them():
    m = {x.fault: x for x in plan("s3", count=200)}
    crash, reject, nack, ttl = m["crash"], m["reject"], m["nack"], m["ttl"]
    ok = next(x for x in plan("s3", count=200) if x.exchange == "demo.fanout" and x.fault == "none")
    seen = {
        "attempts": {
            ok.message_id: [(1, "error"), (2, "ack")],  # a retry after a dropped connection
            crash.message_id: [(1, "ack")],
            reject.message_id: [(1, "ack")],
            nack.message_id: [(1, "nack"), (2, "nack"), (3, "nack")],
            ttl.message_id: [(1, "ack")],
        },
        "deliveries": {
            (ok.message_id, "demo.billing"): [("ack", False), ("duplicate_skipped", False)],
            (ok.message_id, "demo.shipping"): [],  # never consumed, never dead-lettered: lost
            (crash.message_id, crash.target_group): [("ack", False), ("ack", True)],
            (reject.message_id, reject.target_group): [("reject", False)],
        },
        "dead_letters": {
            reject.message_id: [(reject.target_group, "rejected")],
            ttl.message_id: [("demo.expiring", "expired")],
        },
        "unrouted": {},
        "crashes": {(crash.message_id, crash.target_group): True},
        "drops": [3],
    }
    truth = build_truth([ok, crash, reject, nack, ttl], seen, TOPOLOGY.bindings())
    totals = truth["totals"]
    assert totals["distinct_published"] == 5
    assert totals["publish_attempts"] == 8
    assert totals["producer_retries"] == 3
    assert (totals["confirmed"], totals["nacked"]) == (4, 1)
    assert totals["dup_msgs"] == 2
    assert totals["dup_producer_retry"] == 1
    assert totals["dup_broker_redelivery"] == 1
    assert totals["dead_lettered"] == 2
    assert totals["dead_lettered_rejected"] == totals["dead_lettered_expired"] == 1
    assert totals["delivered_unique"] == 2
    assert totals["lost"] == 1
    assert truth["messages"][ok.message_id]["lost"] == ["demo.shipping"]
    assert truth["messages"][reject.message_id]["rejected"] is True
    assert truth["messages"][ttl.message_id]["expired"] is True
    assert truth["messages"][ttl.message_id]["overflowed"] is False
    assert truth["messages"][crash.message_id]["duplicated_by_crash"] == [crash.target_group]
    assert totals["connections_closed"] == 3
    assert totals["consumer_crashes"] == 1
    # The fanout pair that was lost still counts as expected; the crash pair was delivered.
    other_groups = len(expected_groups(TOPOLOGY.bindings(), crash.exchange, crash.routing_key))
    reject_groups = len(expected_groups(TOPOLOGY.bindings(), reject.exchange, reject.routing_key))
    assert totals["expected_confirmed"] == 2 + other_groups + reject_groups + 1


def test_a_late_binding_expects_only_the_messages_first_published_after_it():
    topology = DemoTopology(late_binding=True)
    assert "demo.latecomer" not in {b["queue"] for b in topology.bindings()}
    bindings = topology.bindings() + [{**b, "from_ms": 5000} for b in topology.bindings(late=True)]
    assert "demo.latecomer" not in expected_groups(bindings, "demo.fanout", "event.eu", 4999)
    assert "demo.latecomer" in expected_groups(bindings, "demo.fanout", "event.eu", 5000)
