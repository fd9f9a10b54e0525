"""Retention yields the machine (RETENTION_DUTY) and stops at its budget
(RETENTION_BUDGET_SECONDS), the next run going on. Real database; the clock is a fake one that
moves one second per reading and by each pause, so the pacing is checked exactly."""

import datetime

import pytest
from django.utils import timezone

from recovery.models import Activity, Message, Status
from recovery.models import retention as retention_module
from recovery.models.retention import apply_retention
from tests.replay.conftest import dead_letter_row, store

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
