"""Evaluate the enabled rules (a beat task every ALERTS_EVALUATE_SECONDS) and queue their
notifications in the outbox. Evaluation never sends anything itself (recovery/alerts/deliver.py).

Per rule: one notification when it starts firing (after ``for_seconds`` of its condition), one
when it resolves, a reminder every ``remind_every`` while it fires, an ``updated`` one when a
firing new_failure_group rule finds more groups — never one per evaluation. A muted rule keeps
its state and history and notifies nobody. A check that cannot look (the broker's management
API down) leaves the state as it was, records the error on the rule and in its history once,
and is shown: an unknown is never taken for ok.
"""

import datetime
import logging

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from recovery.alerts.checks import run_check
from recovery.broker.management import CachedReads
from recovery.models import AlertRule, AlertTransition, Notification

log = logging.getLogger(__name__)


def console_url(path=""):
    return settings.CONSOLE_BASE_URL.rstrip("/") + path


def payload(rule, event, now, check=None):
    """The documented notification body (docs/alerts.md)."""
    return {
        "event": event,
        "at": now.isoformat(),
        "rule": {
            "id": rule.pk,
            "name": rule.name,
            "kind": rule.kind,
            "scope": rule.scope,
            "state": rule.state,
            "since": rule.state_since.isoformat(),
            "url": console_url(f"/alerts/{rule.pk}/"),
        },
        "value": check.value if check else rule.last_value,
        "summary": check.summary if check else rule.last_summary,
        "items": check.items if check else rule.last_items,
    }


def queue_notifications(rule, event, now, check=None):
    channels = [c for c in rule.channels.all() if c.enabled]
    body = payload(rule, event, now, check)
    Notification.objects.bulk_create(
        Notification(rule=rule, channel=c, event=event, payload=body, next_attempt_at=now)
        for c in channels
    )
    rule.last_notified_at = now
    return len(channels)


# What an evaluation may change on a rule besides last_evaluated_at (which ``evaluate`` sets
# for the whole cycle in one statement): a rule none of these changed for is not saved.
STATE_FIELDS = (
    "state",
    "state_since",
    "condition_since",
    "last_value",
    "last_summary",
    "last_items",
    "last_error",
    "last_notified_at",
)


def _state(rule):
    return tuple(getattr(rule, name) for name in STATE_FIELDS)


def evaluate_rule(rule, now, management) -> str | None:
    """Evaluate one rule; returns the event notified (firing, resolved, reminder, updated).
    Saves the rule only when its state, value, summary, items or error changed."""
    before = _state(rule)
    try:
        check = run_check(rule, now, management)
    except Exception as exc:  # noqa: BLE001 - said on the rule, never taken for "ok"
        error = f"{type(exc).__name__}: {exc}"[:1000]
        if error != rule.last_error:
            AlertTransition.objects.create(rule=rule, at=now, state="error", summary=error)
        rule.last_error = error
        rule.last_evaluated_at = now
        if _state(rule) != before:
            rule.save(update_fields=["last_error", "last_evaluated_at"])
        log.warning("alert rule %s could not be evaluated: %s", rule.pk, error)
        return None
    event = None
    held = datetime.timedelta(seconds=rule.for_seconds)
    if check.firing:
        rule.condition_since = rule.condition_since or now
    else:
        rule.condition_since = None
    should_fire = check.firing and now - rule.condition_since >= held
    if should_fire and rule.state == AlertRule.State.OK:
        rule.state, rule.state_since, event = AlertRule.State.FIRING, now, "firing"
    elif not check.firing and rule.state == AlertRule.State.FIRING:
        rule.state, rule.state_since, event = AlertRule.State.OK, now, "resolved"
    elif rule.state == AlertRule.State.FIRING:
        if rule.kind == AlertRule.Kind.NEW_FAILURE_GROUP and set(check.items) - set(
            rule.last_items
        ):
            event = "updated"
        elif rule.remind_every and now - (rule.last_notified_at or rule.state_since) >= (
            rule.remind_every
        ):
            event = "reminder"
    if event in ("firing", "resolved"):
        AlertTransition.objects.create(
            rule=rule, at=now, state=rule.state, value=check.value, summary=check.summary
        )
    rule.last_value, rule.last_summary, rule.last_items = check.value, check.summary, check.items
    rule.last_error = ""
    rule.last_evaluated_at = now
    if event and not rule.muted(now):
        queue_notifications(rule, event, now, check)
    if _state(rule) != before:
        rule.save()
    return event


def evaluate(now=None, management=None) -> dict:
    """Evaluate every enabled rule; {rule id: event or None}.

    One transaction for the cycle (one commit, not one per rule: at 20 rules the commits cost
    more than the checks), a savepoint per rule so one rule's failure leaves the others' work;
    only rules whose state changed are saved, the rest get last_evaluated_at in one UPDATE.
    The management API's answers are shared by the cycle's rules (``CachedReads``)."""
    now = now or timezone.now()
    management = management or CachedReads()
    events = {}
    with transaction.atomic():
        # Locked: two beat ticks (or a manual run) never notify the same transition twice.
        rules = AlertRule.objects.select_for_update(skip_locked=True).filter(enabled=True)
        for rule in rules.order_by("pk"):
            try:
                with transaction.atomic():
                    events[rule.pk] = evaluate_rule(rule, now, management)
            except DatabaseError:
                log.exception("alert rule %s: its evaluation could not be saved", rule.pk)
        # Every rule looked at, saved or not, in one statement (the "unknown" badge reads it).
        AlertRule.objects.filter(pk__in=list(events)).update(last_evaluated_at=now)
    return events
