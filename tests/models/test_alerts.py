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


@pytest.fixture(autouse=True)
def thirty_second_cycles(settings):
    """Unknown is notified after one evaluation period at least: the times below count on 30 s."""
    settings.ALERTS_EVALUATE_SECONDS = 30


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


def test_a_firing_rule_that_cannot_look_is_unknown_and_says_it_was_firing():
    hook = channel()
    blind = rule(channels=[hook], state="firing", last_known_state="firing", last_value=5)
    blind.condition_since = T0
    blind.last_items = ["q"]
    blind.save()
    error = ManagementError("management API unreachable")
    # Not "ok", and not "firing" either: nobody has looked. A blip pages nobody yet.
    assert step(blind, later(60), error) is None
    blind.refresh_from_db()
    assert (blind.state, blind.current_state, blind.last_known_state) == (
        "unknown",
        "unknown",
        "firing",
    )
    assert blind.state_since == later(60) and blind.condition_since == T0
    assert blind.unknown_reason == "cannot check: ManagementError: management API unreachable"
    assert (blind.last_value, blind.last_items) == (5, ["q"])  # the last known look, kept
    assert [(t.state, t.summary) for t in AlertTransition.objects.filter(rule=blind)] == [
        ("unknown", blind.last_error)
    ]
    # After one evaluation period still unknown: said once, as its own event.
    assert step(blind, later(90), error) == "unknown"
    assert step(blind, later(120), error) is None
    unknown = Notification.objects.get(rule=blind)
    assert unknown.event == "unknown" and unknown.payload["rule"]["state"] == "unknown"
    assert unknown.payload["summary"] == f"cannot check: {blind.last_error}"
    assert (unknown.payload["value"], unknown.payload["items"]) == (None, [])
    assert unknown.payload["last_known_state"] == "firing"

    # It looks again and the condition still holds: firing, said (the operator was told
    # "unknown", so is told how it ended), without waiting for for_seconds again.
    assert step(blind, later(150), Check(firing=True, value=6, items=["q"])) == "firing"
    blind.refresh_from_db()
    assert (blind.state, blind.last_error, blind.state_since) == ("firing", "", later(150))
    assert [t.state for t in blind.transitions.order_by("at", "id")] == ["unknown", "firing"]


def test_a_blip_inside_a_firing_period_ends_quietly_in_firing():
    loud = rule(channels=[channel()], state="firing", last_known_state="firing")
    loud.condition_since = T0
    loud.save()
    assert step(loud, later(30), ManagementError("timed out")) is None
    assert step(loud, later(45), Check(firing=True, value=1)) is None
    assert loud.state == "firing"
    assert not Notification.objects.filter(rule=loud).exists()


def test_an_ok_rule_told_unknown_is_told_when_it_is_ok_again():
    watched = rule(channels=[channel()])
    events = [step(watched, later(s), ManagementError("down")) for s in (0, 29, 30, 60)]
    assert events == [None, None, "unknown", None]
    assert step(watched, later(90), Check(firing=False, value=0)) == "resolved"
    assert watched.state == watched.last_known_state == "ok"
    # A short unknown nobody was told about ends quietly.
    assert step(watched, later(120), ManagementError("down")) is None
    assert step(watched, later(130), Check(firing=False, value=0)) is None
    sent = Notification.objects.filter(rule=watched).order_by("created_at", "id")
    assert [n.event for n in sent] == ["unknown", "resolved"]


def test_unknown_waits_for_the_rules_for_seconds_and_a_muted_rule_says_nothing():
    patient = rule(channels=[channel()], for_seconds=300)
    assert step(patient, T0, ManagementError("down")) is None
    assert step(patient, later(299), ManagementError("down")) is None
    assert step(patient, later(300), ManagementError("down")) == "unknown"

    quiet = rule(channels=[channel("q")], muted_until=later(3600))
    assert [step(quiet, later(s), ManagementError("down")) for s in (0, 60, 120)] == [None] * 3
    assert quiet.state == "unknown"
    assert not Notification.objects.filter(rule=quiet).exists()


def test_another_error_while_unknown_is_kept_in_the_history_once():
    blind = rule()
    step(blind, T0, ManagementError("refused"))
    blind.last_notified_at = T0  # told already
    assert step(blind, later(30), ManagementError("timed out")) is None
    assert step(blind, later(60), ManagementError("timed out")) is None
    assert [t.state for t in blind.transitions.order_by("at", "id")] == ["unknown", "error"]
    assert blind.last_error == "ManagementError: timed out"


def test_a_rule_not_evaluated_lately_is_unknown_whatever_its_state():
    stale = rule(state="firing", last_known_state="firing")
    assert (stale.current_state, stale.unknown_reason) == ("unknown", "never evaluated")
    stale.last_evaluated_at = datetime.datetime.now(datetime.UTC)
    assert (stale.current_state, stale.unknown_reason) == ("firing", "")


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


def test_it_counts_a_channels_failures_in_the_database_not_on_a_stale_copy():
    hook = channel()
    stale = NotificationChannel.objects.get(pk=hook.pk)  # what another pass holds
    hook.record_failure("HTTP 503 #1")
    stale.record_failure("HTTP 503 #2")
    assert stale.consecutive_failures == 2
    hook.refresh_from_db()
    assert (hook.consecutive_failures, hook.last_error) == (2, "HTTP 503 #2")
    stale.record_success(T0)
    hook.refresh_from_db()
    assert (hook.consecutive_failures, hook.last_success_at) == (0, T0)


def test_it_records_an_outcome_only_while_it_holds_the_claim():
    hook = channel()
    deleted = notification(hook)
    Notification.objects.filter(pk=deleted.pk).delete()  # its rule deleted during the send
    assert deleted.record_delivered(later(1), "HTTP 200") is False
    assert not Notification.objects.filter(pk=deleted.pk).exists()  # not inserted again

    held = notification(hook)
    assert held.claim(later(300))
    taken_over = Notification.objects.get(pk=held.pk)  # the claim ran out; another pass
    assert taken_over.claim(later(700))
    assert held.record_failed(later(2), "HTTP 503") is False
    held.refresh_from_db()
    assert (held.attempts, held.next_attempt_at, held.attempt_log) == (0, later(700), [])
    hook.refresh_from_db()
    assert hook.consecutive_failures == 0  # nobody's failure to count
