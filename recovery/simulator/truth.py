"""The ground truth of a simulation: what was done to each message, totals in the audit's terms.

The totals follow the definitions at the top of ``spark/transforms.py`` (the audit's contract), but
are computed from what the simulator planned and observed (``observe.py``), not from the log files
the audit reads — so an audit that disagrees has found a bug on one side or the other:

* ``distinct_published``/``publish_attempts``/``producer_retries``/``confirmed``/``nacked``/
  ``returned``/``unconfirmed``: per planned message, from its publish attempts. A message is
  confirmed if any attempt was acked, else returned, nacked, unconfirmed in that order.
* pairs: (message, consumer group) for every group the bindings route it to, plus every group
  that handled it. ``delivered_unique`` counts pairs with an ``ack`` or ``duplicate_skipped``;
  ``dead_lettered`` pairs whose group's queue dead-lettered a copy (reason of the first copy).
* ``lost``: expected pairs of confirmed messages neither consumed, dead-lettered, unroutable
  (the alternate exchange had it) nor handed to Lazarus by the publisher. Should be 0.
* duplicates: extra deliveries of a pair (deliveries - 1), attributed as the audit does:
  redelivered-flagged first, then up to (attempts - 1) to producer retries, the rest to
  consumer reprocessing. There are no replays in a simulation.
"""

import collections

from recovery.simulator.demo import expected_groups

CONSUMED = ("ack", "duplicate_skipped")
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
GIVE_UP_STATES = ("returned", "nacked", "unconfirmed")

# The audit metrics (recovery/models/audit.py COUNT_METRICS) the simulator knows the truth of.
AUDITED_NAMES = (
    "distinct_published",
    "publish_attempts",
    "producer_retries",
    "confirmed",
    "nacked",
    "returned",
    "unconfirmed",
    "expected_confirmed",
    "delivered_unique",
    "dead_lettered",
    *(f"dead_lettered_{reason}" for reason in REASONS),
    "recovered",
    "lost",
    "dup_msgs",
    "dup_deliveries",
    "dup_producer_retry",
    "dup_broker_redelivery",
    "dup_consumer_reprocessing",
    "orphan_consumptions",
    "malformed_lines",
)
TOTAL_NAMES = (
    *AUDITED_NAMES,
    # Not audit metrics: what the simulator did and what the broker should now hold.
    "unroutable",
    "consumer_crashes",
    "connections_closed",
    "producer_lines",
    "consumer_lines",
    "dead_letter_copies",
    "unrouted_copies",
    "handed_to_lazarus",
)


def publish_state(outcomes):
    if "ack" in outcomes:
        return "confirmed"
    if "returned" in outcomes:
        return "returned"
    if "nack" in outcomes:
        return "nacked"
    return "unconfirmed"


def _duplicates(deliveries, attempts):
    extra = max(len(deliveries) - 1, 0)
    flagged = sum(1 for _, redelivered in deliveries if redelivered)
    broker = min(flagged, extra)
    unflagged = extra - broker
    retry = min(unflagged, max(attempts - 1, 0))
    return {
        "broker_redelivery": broker,
        "producer_retry": retry,
        "consumer_reprocessing": unflagged - retry,
    }


def _dead_letters(entry, totals, dead, queue_group):
    """The message's dead-letter copies into ``entry``/``totals``; {group: the reason of its
    first death}."""
    entry["dead_letters"] = [{"queue": q, "reason": r} for q, r in dead]
    reasons = {r for _, r in dead}
    entry.update(
        rejected="rejected" in reasons,
        expired="expired" in reasons,
        overflowed="maxlen" in reasons,
        delivery_limit="delivery_limit" in reasons,
    )
    totals["dead_letter_copies"] += len(dead)
    first_death = {}
    for queue, reason in dead:
        first_death.setdefault(queue_group.get(queue, queue), reason)
    return first_death


def _group_truth(entry, totals, group, lines, first_death, lost_unless_consumed, expected):
    """One consumer group's deliveries of the message: consumed, rejected, dead-lettered, lost."""
    totals["consumer_lines"] += len(lines)
    outcomes = [outcome for outcome, _ in lines]
    entry["deliveries"][group] = len(lines)
    consumed = any(o in CONSUMED for o in outcomes)
    if consumed:
        entry["consumed_by"].append(group)
        totals["delivered_unique"] += 1
    if "reject" in outcomes:
        entry["rejected_by"].append(group)
    if group in first_death:
        reason = first_death[group]
        entry["dead_lettered"][group] = reason
        totals.update(dead_lettered=1, **{f"dead_lettered_{reason}": 1})
    if expected and entry["publish_state"] == "confirmed":
        totals["expected_confirmed"] += 1
    if lost_unless_consumed and not consumed:
        entry["lost"].append(group)
        totals["lost"] += 1


def _duplicated(entry, totals, group, dups, crashed):
    entry["duplicated"][group] = {k: v for k, v in dups.items() if v}
    totals.update(
        dup_msgs=1,
        dup_deliveries=sum(dups.values()),
        **{f"dup_{k}": v for k, v in dups.items()},
    )
    if crashed:
        entry["duplicated_by_crash"].append(group)


def message_truth(planned, seen, bindings, queue_group):
    """The truth of one planned message, and its contribution to the totals (a Counter)."""
    mid = planned.message_id
    attempts = seen["attempts"].get(mid, [])
    totals = collections.Counter()
    entry = {
        "index": planned.index,
        "fault": planned.fault,
        "target_group": planned.target_group,
        "exchange": planned.exchange,
        "routing_key": planned.routing_key,
        "producer": planned.producer,
        "attempts": len(attempts),
        "outcomes": [outcome for _, outcome in sorted(attempts)],
    }
    if not attempts:  # publish() was never called for it (an interrupted round)
        entry["published"] = False
        return entry, totals
    entry["published"] = True
    state = publish_state(entry["outcomes"])
    entry["publish_state"] = state
    totals.update(
        distinct_published=1,
        publish_attempts=len(attempts),
        producer_retries=len(attempts) - 1,
        producer_lines=len(attempts),
        **{state: 1},
    )
    expected = expected_groups(
        bindings, planned.exchange, planned.routing_key, seen.get("first_ts", {}).get(mid)
    )
    handled = sorted(g for (m, g) in seen["deliveries"] if m == mid)
    entry["expected_groups"] = expected
    first_death = _dead_letters(entry, totals, seen["dead_letters"].get(mid, []), queue_group)
    unrouted = seen["unrouted"].get(mid, 0)
    entry["unroutable"] = unrouted
    totals.update(unroutable=int(unrouted > 0), unrouted_copies=unrouted)
    if state in GIVE_UP_STATES:
        entry["handed_to_lazarus"] = state
        totals["handed_to_lazarus"] += 1
    producer_side_row = unrouted > 0 or state in GIVE_UP_STATES
    entry.update(
        consumed_by=[],
        rejected_by=[],
        dead_lettered={},
        deliveries={},
        duplicated={},
        duplicated_by_crash=[],
        lost=[],
    )
    for group in sorted(set(expected) | set(handled)):
        lines = seen["deliveries"].get((mid, group), [])
        lost = (
            group in expected
            and state == "confirmed"
            and group not in first_death
            and not producer_side_row
        )
        _group_truth(entry, totals, group, lines, first_death, lost, group in expected)
        dups = _duplicates(lines, len(attempts))
        if sum(dups.values()):
            _duplicated(entry, totals, group, dups, seen["crashes"].get((mid, group)))
    crashed = [g for (m, g), closed in seen["crashes"].items() if m == mid and closed]
    entry["crashed"] = sorted(crashed)
    totals["consumer_crashes"] += len(crashed)
    return entry, totals


def build_truth(plan, seen, bindings):
    """{"totals": {...}, "messages": {message_id: {...}}} for the planned messages."""
    queue_group = {b["queue"]: b["consumer_group"] for b in bindings if b.get("queue")}
    totals = collections.Counter()
    messages = {}
    for planned in plan:
        entry, counts = message_truth(planned, seen, bindings, queue_group)
        messages[planned.message_id] = entry
        totals.update(counts)
    totals["connections_closed"] = sum(seen["drops"])
    return {"totals": {name: totals.get(name, 0) for name in TOTAL_NAMES}, "messages": messages}


def add_totals(a, b):
    return {name: a.get(name, 0) + b.get(name, 0) for name in TOTAL_NAMES}
