"""The alert rule's state machine and the outbox's attempt bookkeeping, one model method at a
time, on real rows: no check runs and nothing is sent (recovery/alerts/ drives them)."""

import datetime

import pytest
from django.conf import settings

from recovery.alerts.checks import Check
from recovery.errors import ManagementError
from recovery.models import AlertRule, AlertTransition, Notification, NotificationChannel

pytestmark = pytest.mark.django_db

T0 = datetime.datetime(2024, 3, 1, 12, 0, tzinfo=datetime.UTC)


def later(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def channel(name="hook", **fields):
    return NotificationChannel.objects.create(
        name=name, kind="webhook", target="http://127.0.0.1:9/hook", **fields
    )


def rule(kind="open_messages", channels=(), **fields):
    made = AlertRule.objects.create(name=kind, kind=kind, state_since=T0, **fields)
    made.channels.set(channels)
    return made


def step(rule, now, check):
    """What the engine does with one rule and its check, minus the loop."""
    event = rule.decide(now, check)
    rule.apply_outcome(now, check, event)
    return event


def test_it_fires_once_after_holding_its_condition_and_resolves_once():
    hook = channel()
    watched = rule(channels=[hook], for_seconds=60)
    firing = Check(firing=True, value=3, summary="3 open", items=["q"])
    assert step(watched, T0, firing) is None
    assert (watched.state, watched.condition_since) == ("ok", T0)
    assert step(watched, later(59), firing) is None
    assert step(watched, later(60), firing) == "firing"
    assert step(watched, later(90), firing) is None  # still firing: said once
    assert step(watched, later(120), Check(firing=False, value=0)) == "resolved"

    watched.refresh_from_db()
    assert (watched.state, watched.state_since, watched.condition_since) == ("ok", later(120), None)
    assert [(t.state, t.at) for t in watched.transitions.order_by("at")] == [
        ("firing", later(60)),
        ("ok", later(120)),
    ]
    sent = Notification.objects.filter(rule=watched).order_by("created_at", "id")
    assert [(n.event, n.channel_id, n.next_attempt_at) for n in sent] == [
        ("firing", hook.pk, later(60)),
        ("resolved", hook.pk, later(120)),
    ]
    assert sent[0].payload["rule"]["id"] == watched.pk
    assert (sent[0].payload["value"], sent[0].payload["items"]) == (3, ["q"])


def test_it_reminds_at_its_interval_counted_from_the_last_notification():
    loud = rule(channels=[channel()], remind_every=datetime.timedelta(minutes=5))
    firing = Check(firing=True, value=1)
    events = [step(loud, later(m * 60), firing) for m in (0, 4, 5, 9, 10)]
    assert events == ["firing", None, "reminder", None, "reminder"]
    loud.refresh_from_db()
    assert loud.last_notified_at == later(600)


def test_it_updates_a_firing_new_failure_group_rule_when_a_group_is_new():
    groups = rule("new_failure_group", channels=[channel()])
    assert step(groups, T0, Check(firing=True, value=1, items=["g1"])) == "firing"
    assert step(groups, later(30), Check(firing=True, value=1, items=["g1"])) is None
    assert step(groups, later(60), Check(firing=True, value=2, items=["g1", "g2"])) == "updated"
    assert Notification.objects.filter(rule=groups, event="updated").count() == 1


def test_it_keeps_a_muted_rules_state_and_history_but_notifies_nobody():
    quiet = rule(
        channels=[channel()],
        muted_until=later(3600),
        remind_every=datetime.timedelta(minutes=1),
    )
    # The transitions are still events (the history is kept); the reminder is dropped.
    assert step(quiet, T0, Check(firing=True, value=1)) == "firing"
    assert step(quiet, later(120), Check(firing=True, value=1)) is None
    assert step(quiet, later(180), Check(firing=False, value=0)) == "resolved"
    quiet.refresh_from_db()
    assert [t.state for t in quiet.transitions.order_by("at")] == ["firing", "ok"]
    assert not Notification.objects.filter(rule=quiet).exists()
    assert quiet.last_notified_at is None


def test_it_queues_nothing_for_a_disabled_channel():
    watched = rule(channels=[channel("on"), channel("off", enabled=False)])
    step(watched, T0, Check(firing=True, value=1))
    assert [n.channel.name for n in Notification.objects.filter(rule=watched)] == ["on"]


def test_it_records_a_check_that_could_not_look_and_keeps_its_state():
    blind = rule(state="firing", last_value=5, last_items=["q"])
    assert step(blind, T0, ManagementError("management API unreachable")) is None
    blind.refresh_from_db()
    assert blind.state == "firing" and (blind.last_value, blind.last_items) == (5, ["q"])
    assert blind.last_error == "ManagementError: management API unreachable"
    assert blind.last_evaluated_at == T0
    assert [(t.state, t.summary) for t in AlertTransition.objects.filter(rule=blind)] == [
        ("error", blind.last_error)
    ]
    assert step(blind, later(30), Check(firing=True, value=5, items=["q"])) is None
    blind.refresh_from_db()
    assert blind.last_error == "" and blind.state == "firing"


def test_it_says_whether_deciding_changed_anything_worth_saving():
    quiet = rule(params={"threshold": 10})
    nothing = Check(firing=False, value=0, summary="0 open")
    quiet.decide(T0, nothing)  # the first look sets value and summary
    before = quiet.evaluated_state()
    assert quiet.decide(later(30), nothing) is None
    assert quiet.evaluated_state() == before
    quiet.decide(later(60), Check(firing=False, value=1, summary="1 open"))
    assert quiet.evaluated_state() != before


def notification(hook, **fields):
    return Notification.objects.create(
        channel=hook, event="test", payload={"event": "test"}, next_attempt_at=T0, **fields
    )


def test_it_backs_off_after_each_failed_attempt_and_counts_the_channels_failures():
    hook = channel(last_success_at=T0)
    queued = notification(hook)
    for attempt, wait in enumerate((30, 60, 120), start=1):
        queued.record_failed(later(attempt), f"HTTP 503 #{attempt}")
        queued.refresh_from_db()
        assert (queued.status, queued.attempts) == ("pending", attempt)
        assert queued.next_attempt_at == later(attempt + wait)
    assert queued.last_error == "HTTP 503 #3"
    assert [(a["ok"], a["error"]) for a in queued.attempt_log] == [
        (False, "HTTP 503 #1"),
        (False, "HTTP 503 #2"),
        (False, "HTTP 503 #3"),
    ]
    hook.refresh_from_db()
    assert hook.failing and hook.consecutive_failures == 3
    assert (hook.last_error, hook.last_success_at) == ("HTTP 503 #3", T0)


def test_it_is_delivered_and_ends_the_channels_run_of_failures():
    hook = channel(consecutive_failures=5, last_error="HTTP 503")
    queued = notification(hook, attempts=1, last_error="HTTP 503")
    queued.record_delivered(later(60), "HTTP 200")
    queued.refresh_from_db()
    assert (queued.status, queued.delivered_at, queued.last_error) == (
        "delivered",
        later(60),
        "",
    )
    assert queued.attempts == 2
    assert queued.attempt_log == [
        {"at": later(60).isoformat(), "ok": True, "result": "HTTP 200", "error": ""}
    ]
    hook.refresh_from_db()
    assert (hook.consecutive_failures, hook.last_success_at) == (0, later(60))
    assert hook.last_error == "HTTP 503"  # the last failure stays readable


def test_it_gives_up_after_the_last_attempt():
    queued = notification(channel(), attempts=settings.ALERTS_MAX_ATTEMPTS - 1)
    queued.record_failed(T0, "refused")
    queued.refresh_from_db()
    assert (queued.status, queued.attempts) == ("failed", settings.ALERTS_MAX_ATTEMPTS)
    assert queued.next_attempt_at == T0  # not rescheduled: nothing will try it again


def test_it_keeps_only_the_newest_attempts_and_caps_the_error():
    queued = notification(channel())
    for n in range(Notification.ATTEMPTS_KEPT + 5):
        queued.attempts = 0  # never given up here: only the log's length is under test
        queued.record_failed(later(n), f"error {n} " + "x" * 2000)
    queued.refresh_from_db()
    assert len(queued.attempt_log) == Notification.ATTEMPTS_KEPT
    assert queued.attempt_log[-1]["error"].startswith(f"error {Notification.ATTEMPTS_KEPT + 4} ")
    assert len(queued.last_error) == 1000 and len(queued.channel.last_error) == 1000


def test_it_reminds_again_once_its_mute_has_ended():
    snoozed = rule(
        channels=[channel()],
        muted_until=later(600),
        remind_every=datetime.timedelta(minutes=5),
    )
    firing = Check(firing=True, value=1)
    events = [step(snoozed, later(m * 60), firing) for m in (0, 5, 10, 11)]
    # Muted at 0 and 5 (nothing queued, so nothing was last said); unmuted at 10: reminded.
    assert events == ["firing", None, "reminder", None]
    assert [n.event for n in Notification.objects.filter(rule=snoozed)] == ["reminder"]
