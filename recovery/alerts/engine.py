"""Evaluate the enabled rules (a beat task every ALERTS_EVALUATE_SECONDS) and queue their
notifications in the outbox. Evaluation never sends anything itself (recovery/alerts/deliver.py).
This module is the loop; each rule's state machine is on the model (``AlertRule.decide`` and
``AlertRule.apply_outcome``).

Per rule: one notification when it starts firing (after ``for_seconds`` of its condition), one
when it resolves, a reminder every ``remind_every`` while it fires, an ``updated`` one when a
firing new_failure_group rule finds more groups — never one per evaluation. A muted rule keeps
its state and history and notifies nobody. A check that cannot look (the broker's management
API down, a bug in the check) makes the rule ``unknown``, with the error on the rule and in its
history once, and one ``unknown`` notification once it has lasted ``AlertRule.unknown_after``:
an unknown is never taken for ok, nor for "still firing" (docs/alerts.md "Unknown").
"""

import logging
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, transaction
from django.utils import timezone

from recovery.alerts.checks import run_check
from recovery.broker.management import CachedReads
from recovery.models import AlertRule

log = logging.getLogger(__name__)


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
    (one rule that cannot be saved leaves the others' work); every rule but those gets
    last_evaluated_at in one UPDATE. A rule that could not be saved is left out of the result."""
    now = now or timezone.now()
    management = management or CachedReads()
    checks = check_all(list(AlertRule.objects.filter(enabled=True)), now, management)
    events = {}
    with transaction.atomic():
        # Locked, and read again: two beat ticks (or a manual run) never notify the same
        # transition twice; the second decides on the state the first saved.
        rules = AlertRule.objects.select_for_update(skip_locked=True).filter(pk__in=list(checks))
        for rule in rules.order_by("pk"):
            check = checks[rule.pk]
            before = rule.evaluated_state()
            event = events[rule.pk] = rule.decide(now, check)
            if event is None and rule.evaluated_state() == before:
                continue
            try:
                with transaction.atomic():
                    rule.apply_outcome(now, check, event)
            except DatabaseError:
                log.exception("alert rule %s: its evaluation could not be saved", rule.pk)
                # Not stamped as evaluated: its row still holds the state before (maybe "ok"),
                # which a fresh timestamp would vouch for; unstamped, it goes stale and shows
                # unknown. Its event was not queued, so it is not returned either.
                del events[rule.pk]
                continue
            if isinstance(check, Exception):
                log.warning("alert rule %s could not be evaluated: %s", rule.pk, rule.last_error)
        # Every rule whose outcome stands (saved, or nothing to save), in one statement (the
        # "unknown" badge reads it).
        AlertRule.objects.filter(pk__in=list(events)).update(last_evaluated_at=now)
    return events
