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
from concurrent.futures import ThreadPoolExecutor

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


def decide(rule, now, check) -> str | None:
    """Apply one rule's check (a Check, or the exception its check raised) to the rule in
    memory; returns the event to notify (firing, resolved, reminder, updated) or None."""
    if isinstance(check, Exception):
        rule.last_error = f"{type(check).__name__}: {check}"[:1000]
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
    rule.last_value, rule.last_summary, rule.last_items = check.value, check.summary, check.items
    rule.last_error = ""
    if rule.muted(now) and event not in ("firing", "resolved"):
        # Muted: the state still changes (and is returned), but nothing is said, so there is
        # nothing to remind of or update.
        event = None
    return event


def persist(rule, now, check, event):
    """Write what ``decide`` changed: the transition, the notifications, the rule."""
    rule.last_evaluated_at = now
    if isinstance(check, Exception):
        AlertTransition.objects.create(rule=rule, at=now, state="error", summary=rule.last_error)
        rule.save(update_fields=["last_error", "last_evaluated_at"])
        log.warning("alert rule %s could not be evaluated: %s", rule.pk, rule.last_error)
        return
    if event in ("firing", "resolved"):
        AlertTransition.objects.create(
            rule=rule, at=now, state=rule.state, value=check.value, summary=check.summary
        )
    if event and not rule.muted(now):
        queue_notifications(rule, event, now, check)
    rule.save()


# The kinds whose check reads the broker's management API and never the database: a cycle runs
# them on a thread of their own beside the database checks (their HTTP round trips overlap the
# queries instead of adding to them). Their answers are shared (``CachedReads``).
BROKER_ONLY = frozenset(
    {"broker_alarm", "queue_without_consumers", "collector_lag", "uncovered_queues"}
)


def _check(rule, now, management):
    try:
        return run_check(rule, now, management)
    except Exception as exc:  # noqa: BLE001 - said on the rule, never taken for "ok"
        return exc


def check_all(rules, now, management) -> dict:
    """{rule id: Check, or the exception its check raised}; reads only."""
    broker = [r for r in rules if r.kind in BROKER_ONLY]
    with ThreadPoolExecutor(max_workers=1) as pool:
        on_broker = pool.submit(lambda: {r.pk: _check(r, now, management) for r in broker})
        checks = {r.pk: _check(r, now, management) for r in rules if r.kind not in BROKER_ONLY}
        checks.update(on_broker.result())
    return checks


def evaluate(now=None, management=None) -> dict:
    """Evaluate every enabled rule; {rule id: event or None}.

    The checks only read, outside any transaction. Then one transaction (one commit, not one per
    rule: at 20 rules the commits cost more than the checks) locks the rules, decides, and writes
    only the rules whose state, value, summary, items or error changed, each under a savepoint
    (one rule that cannot be saved leaves the others' work); every rule gets last_evaluated_at
    in one UPDATE."""
    now = now or timezone.now()
    management = management or CachedReads()
    checks = check_all(list(AlertRule.objects.filter(enabled=True)), now, management)
    events = {}
    with transaction.atomic():
        # Locked, and read again: two beat ticks (or a manual run) never notify the same
        # transition twice; the second decides on the state the first saved.
        rules = AlertRule.objects.select_for_update(skip_locked=True).filter(pk__in=list(checks))
        for rule in rules.order_by("pk"):
            before = _state(rule)
            event = events[rule.pk] = decide(rule, now, checks[rule.pk])
            if event is None and _state(rule) == before:
                continue
            try:
                with transaction.atomic():
                    persist(rule, now, checks[rule.pk], event)
            except DatabaseError:
                log.exception("alert rule %s: its evaluation could not be saved", rule.pk)
        # Every rule looked at, saved or not, in one statement (the "unknown" badge reads it).
        AlertRule.objects.filter(pk__in=list(events)).update(last_evaluated_at=now)
    return events
