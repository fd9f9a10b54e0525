"""Retention: replayed and discarded messages older than RETENTION_DAYS leave the store.

It deletes store-wide (every vhost, every queue, whoever replayed them), so it lives with the
store, not with the replay engine; Celery beat runs it (``recovery.models.tasks``).

"Older" counts from the message's last change (``updated_at``: when it was replayed or
discarded), so a message replayed today is kept RETENTION_DAYS from today whatever its age.
Pending and poisoned messages are never deleted: nobody has dealt with them yet. A message a job
holds right now is left for the next run. The per-message rows of jobs that ended before the
cutoff go too (the jobs keep their counts). The activity log keeps its rows (their message link
becomes empty; the message id stays in their detail). Each deleted message leaves a ``deleted``
row in the message history (recovery.models.history), in the transaction that deletes it, beside
the rows its replays, discards and restores left there: what was done with it outlives it, for
HISTORY_DAYS, after which this task deletes the history too.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.models.access import Activity
from recovery.models.history import HistoryAction, MessageHistory
from recovery.models.replay import ReplayJobItem
from recovery.models.store import Message, Status

log = logging.getLogger(__name__)

# Rows deleted per transaction: short transactions keep the collector and the console moving.
BATCH = 2000


def apply_retention(days=None, now=None, batch=BATCH):
    """Delete what retention allows; returns {"messages": n, "job_items": n, "history": n,
    "cutoff": time} (history: message history rows past HISTORY_DAYS)."""
    days = settings.RETENTION_DAYS if days is None else days
    cutoff = (now or timezone.now()) - timedelta(days=days)
    expired = (
        Message.objects.filter(
            status__in=(Status.REPLAYED, Status.DISCARDED), updated_at__lt=cutoff
        )
        .exclude(job_items__state=ReplayJobItem.State.CLAIMED)
        .order_by()
    )
    deleted = 0
    while True:
        ids = list(expired.values_list("pk", flat=True)[:batch])
        if not ids:
            break
        with transaction.atomic():
            # Re-checked under the lock: a message restored or replayed meanwhile stays.
            ids = list(
                expired.filter(pk__in=ids)
                .order_by("pk")  # rows are locked in id order, as job claims lock them
                .select_for_update(of=("self",))
                .values_list("pk", flat=True)
            )
            # What was done with them stays (recovery.models.history): a 'deleted' row each.
            MessageHistory.record_messages(
                ids, HistoryAction.DELETED, via="system", detail=f"retention ({days} days)"
            )
            _total, per_model = Message.objects.filter(pk__in=ids).delete()
        deleted += per_model.get(Message._meta.label, 0)
    # The per-message rows of jobs that ended before the cutoff (the job keeps its counts).
    items = 0
    old_items = ReplayJobItem.objects.filter(job__finished_at__lt=cutoff).order_by()
    while ids := list(old_items.values_list("pk", flat=True)[:batch]):
        items += ReplayJobItem.objects.filter(pk__in=ids).delete()[0]
    history = MessageHistory.expire(now=now)
    if deleted or items or history:
        log.info("retention: deleted %s messages changed before %s", deleted, cutoff)
        Activity.objects.create(
            action="retention",
            via="system",
            detail={
                "messages": deleted,
                "job_items": items,
                "history": history,
                "cutoff": cutoff.isoformat(),
            },
        )
    return {
        "messages": deleted,
        "job_items": items,
        "history": history,
        "cutoff": cutoff.isoformat(),
    }
