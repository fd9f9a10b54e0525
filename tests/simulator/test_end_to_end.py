"""Issue 6 end to end: simulator -> real collector -> store -> Spark audit == the simulator's truth.

The simulator injects every fault (rejects, TTL, overflow, poison, unroutable, returns, nacks,
crashes, forced connection drops) and writes what it did; the collector drains the recovery queues
into the store; the audit reads only the two logs, the store and the bindings snapshot. Its
totals must equal the truth exactly.
"""

import datetime
import os

import pytest
from django.conf import settings

from recovery.audit.run import run_audit
from recovery.broker.topology import queue_depths
from recovery.models import Message
from recovery.models.audit import COUNT_METRICS
from recovery.simulator.truth import AUDITED_NAMES
from tests.helpers import wait_for
from tests.simulator.helpers import BUSY_FAULTS, simulate

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COUNT = os.environ.get("SIM_E2E_COUNT", "300")
# What the audit and the simulator must agree on: every metric the simulator knows the truth
# of, each an audit metric (names of docs/design.md "Audit metrics").
AGREED = AUDITED_NAMES
assert set(AGREED) <= set(COUNT_METRICS), set(AGREED) - set(COUNT_METRICS)


def collected(truth):
    """Message ids the collector must have stored: dead letters, unroutables, give-ups."""
    return {
        mid
        for mid, m in truth["messages"].items()
        if m.get("dead_letters") or m.get("unroutable") or m.get("handed_to_lazarus")
    }


@pytest.mark.django_db(transaction=True)
def test_the_audit_of_a_simulated_day_equals_the_simulators_truth(collector, tmp_path):
    truth, _, paths = simulate(
        tmp_path,
        "--count",
        COUNT,
        "--seed",
        "e2e",
        "--drops",
        "3",
        "--late-binding",
        *BUSY_FAULTS,
    )
    # A queue was bound to the fanout halfway: the audit holds it to the messages after that.
    late = [b for b in truth["bindings"] if b["queue"].endswith(".latecomer")]
    assert len(late) == 1 and late[0]["from_ms"]
    assert truth["rounds"][0]["complete"]
    expected_ids = collected(truth)
    wait_for(
        lambda: (
            set(
                Message.objects.filter(message_id__in=expected_ids).values_list(
                    "message_id", flat=True
                )
            )
            == expected_ids
        ),
        timeout=60,
        message="the collector to store every dead letter, unroutable and give-up",
    )
    wait_for(
        lambda: not any(queue_depths(settings.RECOVERY_VHOSTS[0]).values()),
        timeout=30,
        message="the recovery queues to be drained",
    )

    # Normally one UTC day; a run that straddles midnight is audited day by day and summed.
    days = sorted(
        datetime.date.fromisoformat(p.name.removeprefix("dt="))
        for p in (paths["logs"] / "producer").iterdir()
    )
    now = datetime.datetime.combine(days[-1], datetime.time(), datetime.UTC) + datetime.timedelta(
        days=3
    )
    audited = dict.fromkeys(AGREED, 0)
    for day in days:
        run = run_audit(
            day,
            producer_logs=str(paths["logs"] / "producer"),
            consumer_logs=str(paths["logs"] / "consumer"),
            now=now,
            master="local[1]",
            bindings=truth["bindings"],
        )
        assert run.status == "succeeded", run.error
        assert run.finality == "FINAL"
        for name in AGREED:
            audited[name] += run.totals[name] or 0

    wanted = {name: truth["totals"][name] for name in AGREED}
    assert audited == wanted
    assert audited["lost"] == 0
    # The run was not trivial: every kind of fault left its mark on both sides.
    for name in (
        "producer_retries",
        "dead_lettered_rejected",
        "dead_lettered_expired",
        "dead_lettered_maxlen",
        "dead_lettered_delivery_limit",
        "dup_msgs",
        "nacked",
        "returned",
    ):
        assert audited[name] > 0, name
