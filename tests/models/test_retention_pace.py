"""Retention yields the machine (RETENTION_DUTY) and stops at its budget
(RETENTION_BUDGET_SECONDS), the next run going on. Real database; the clock is a fake one that
moves one second per reading and by each pause, so the pacing is checked exactly."""

import datetime

import pytest
from django.utils import timezone

from recovery.models import Activity, Message, Status
from recovery.retention import run as retention_module
from recovery.retention.run import apply_retention
from tests.helpers.replay import dead_letter_row, store

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """Each reading takes a second; a pause moves the clock by its length."""

    def __init__(self):
        self.now = 0.0
        self.pauses = []

    def monotonic(self):
        self.now += 1.0
        return self.now

    def sleep(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(retention_module, "time", fake)
    return fake


def expired(count):
    messages = store([dead_letter_row("pace.old") for _ in range(count)])
    Message.objects.filter(pk__in=[m.pk for m in messages]).update(
        status=Status.REPLAYED, updated_at=timezone.now() - datetime.timedelta(days=31)
    )


def test_it_pauses_after_each_batch_to_work_its_duty_of_the_time(clock):
    expired(6)
    result = apply_retention(days=30, batch=2, duty=0.25, budget_seconds=3600)
    assert result["messages"] == 6 and result["more"] is False
    # Each batch took one second on this clock; a quarter duty pauses three times as long.
    assert clock.pauses == [3.0, 3.0, 3.0]


def test_at_full_duty_it_never_pauses(clock):
    expired(4)
    assert apply_retention(days=30, batch=2, duty=1, budget_seconds=3600)["messages"] == 4
    assert clock.pauses == []


def test_a_run_stops_at_its_budget_and_the_next_one_goes_on(clock):
    expired(6)
    # A batch costs 3 readings and a 3-second pause: 6 seconds. Two fit in 12.
    first = apply_retention(days=30, batch=2, duty=0.25, budget_seconds=12)
    assert (first["messages"], first["more"]) == (4, True)
    assert Message.objects.count() == 2
    assert Activity.objects.get(action="retention").detail["more"] is True

    second = apply_retention(days=30, batch=2, duty=0.25, budget_seconds=12)
    assert (second["messages"], second["more"]) == (2, False)
    assert Message.objects.count() == 0


def test_it_deletes_the_oldest_changes_first_batch_after_batch(clock):
    """Batches follow msg_expirable's order (last change, then id), each after the last one's
    key: a run cut short by its budget has deleted the oldest expired messages."""
    messages = store([dead_letter_row("pace.order") for _ in range(5)])
    now = timezone.now()
    ages = [35, 31, 40, 33, 38]  # days since each one's last change
    for message, days in zip(messages, ages, strict=True):
        Message.objects.filter(pk=message.pk).update(
            status=Status.DISCARDED, updated_at=now - datetime.timedelta(days=days)
        )
    # One batch of 2 fits in the budget (3 readings and a 3-second pause), the second does not.
    result = apply_retention(days=30, now=now, batch=2, duty=0.25, budget_seconds=6)
    assert (result["messages"], result["more"]) == (2, True)
    left = set(Message.objects.values_list("pk", flat=True))
    assert left == {messages[i].pk for i in (0, 1, 3)}  # the 40- and 38-day-old ones went
    apply_retention(days=30, now=now, batch=2, duty=0.25, budget_seconds=3600)
    assert not Message.objects.exists()


def test_the_pick_reads_the_expirable_index(clock):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SET enable_seqscan = off")
        cur.execute(
            "EXPLAIN SELECT id FROM recovery_message WHERE status IN ('replayed', 'discarded') "
            "AND updated_at < now() ORDER BY updated_at, id LIMIT 500"
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    assert "msg_expirable" in plan
