"""Retention: replayed and discarded messages older than RETENTION_DAYS leave the store.

It deletes store-wide (every vhost, every queue, whoever replayed them), so it is the store's own
process, not the replay engine's; Celery beat runs it (``recovery.retention.tasks``).

"Older" counts from the message's last change (``updated_at``: when it was replayed or
discarded), so a message replayed today is kept RETENTION_DAYS from today whatever its age.
Pending and poisoned messages are never deleted: nobody has dealt with them yet. A message a job
holds right now is left for the next run. The per-message rows of jobs that ended before the
cutoff go too (the jobs keep their counts). The activity log keeps its rows (their message link
becomes empty; the message id stays in their detail). Each deleted message leaves a ``deleted``
row in the message history (recovery.models.history), in the transaction that deletes it, beside
the rows its replays, discards and restores left there: what was done with it outlives it, for
HISTORY_DAYS, after which this task deletes the history too.

With RETENTION_ARCHIVE_DIR set, each batch is first written to the archive
(recovery.retention.archive) and fsynced, before its rows are locked; a message changed since it
was written stays. A batch that cannot be written stops the run: nothing more is deleted, the
activity row says why, and the ``retention_archive`` alert kind fires until a run archives.

It yields the machine: after each batch it pauses so that it works at most RETENTION_DUTY of
the time (a quarter by default: about 1,000 deletes/s where full speed was 4,000 on the test
machine), and a run stops after RETENTION_BUDGET_SECONDS, leaving the rest to the next hourly
run (``more`` in its result), so runs never overlap.
"""

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recovery.access.models import Activity
from recovery.models.history import HistoryAction, MessageHistory
from recovery.models.replay import ReplayJobItem
from recovery.models.store import Message, Status
from recovery.retention import archive

log = logging.getLogger(__name__)

# Rows deleted per transaction: each holds its rows locked until it commits, so it is kept
# short (bench/retention.py: batches of 2,000 held them up to 3.3 s on a loaded machine while a
# collector drained a flood; 500 keep a batch well under a second).
BATCH = 500


class ArchiveFailed(Exception):
    """The batch could not be archived (RETENTION_ARCHIVE_DIR): it was not deleted."""


def apply_retention(days=None, now=None, batch=BATCH, duty=None, budget_seconds=None):
    """Delete what retention allows; returns {"messages": n, "archived": n, "job_items": n,
    "history": n, "cutoff": time, "more": bool} (history: message history rows past
    HISTORY_DAYS; more: the run's budget ended with expired messages left), and
    "archive_error" when the archive could not be written: retention stopped there, an
    activity row says so and the ``retention_archive`` alert kind fires.

    ``duty`` (RETENTION_DUTY): the share of the time it works, pausing the rest;
    ``budget_seconds`` (RETENTION_BUDGET_SECONDS): how long a run goes on."""
    days = settings.RETENTION_DAYS if days is None else days
    now = now or timezone.now()
    cutoff = now - timedelta(days=days)
    pace = _Pace(
        settings.RETENTION_DUTY if duty is None else duty,
        settings.RETENTION_BUDGET_SECONDS if budget_seconds is None else budget_seconds,
    )
    result = {"messages": 0, "archived": 0, "job_items": 0, "history": 0, "more": False}
    try:
        result["more"] = _delete_expired_messages(cutoff, days, batch, now, result, pace)
    except ArchiveFailed as exc:
        log.exception("retention stopped: %s", exc)
        result["archive_error"] = str(exc)
    else:
        # The per-message rows of jobs that ended before the cutoff (the job keeps its counts).
        old_items = ReplayJobItem.objects.filter(job__finished_at__lt=cutoff).order_by()
        while ids := list(old_items.values_list("pk", flat=True)[:batch]):
            result["job_items"] += ReplayJobItem.objects.filter(pk__in=ids).delete()[0]
        result["history"] = MessageHistory.expire(now=now)
    result["cutoff"] = cutoff.isoformat()
    # Said when something happened, and when the run before could not archive: the activity
    # log (and the alert reading it) then says it works again.
    if any(result[k] for k in ("messages", "job_items", "history")) or (
        "archive_error" in result or last_archive_failure() is not None
    ):
        log.info("retention: deleted %s messages changed before %s", result["messages"], cutoff)
        Activity.record(None, "retention", detail=result, via="system")
    return result


class _Pace:
    """Works ``duty`` of the time: after a batch that took t seconds, pauses t * (1 - duty) /
    duty. ``over``: the run's budget is spent (pauses included)."""

    def __init__(self, duty, budget_seconds):
        self.duty = duty
        self.deadline = time.monotonic() + budget_seconds

    def batch_done(self, started):
        if self.duty < 1:
            time.sleep((time.monotonic() - started) * (1 - self.duty) / self.duty)

    @property
    def over(self):
        return time.monotonic() >= self.deadline


def _delete_expired_messages(cutoff, days, batch, now, result, pace):
    """Deletes in batches until none is left (False) or the budget is spent (True)."""
    archive_dir = settings.RETENTION_ARCHIVE_DIR
    expired = Message.objects.filter(
        status__in=(Status.REPLAYED, Status.DISCARDED), updated_at__lt=cutoff
    ).exclude(job_items__state=ReplayJobItem.State.CLAIMED)
    # Oldest change first, by msg_expirable, each batch picked after the last one's key: never
    # walking again over what the batches before deleted (or kept: a claimed message, one
    # changed meanwhile) in this run.
    after = Q()
    while True:
        if pace.over:
            return expired.filter(after).exists()
        started = time.monotonic()
        picked = list(
            expired.filter(after)
            .order_by("updated_at", "pk")
            .values_list("pk", "updated_at")[:batch]
        )
        if not picked:
            return False
        last_pk, last_at = picked[-1]
        after = Q(updated_at__gt=last_at) | Q(updated_at=last_at, pk__gt=last_pk)
        ids = [pk for pk, _at in picked]
        archived = None
        if archive_dir:
            # On disk (fsynced) before the rows are locked: a failure deletes nothing.
            try:
                archived = archive.archive_messages(archive_dir, ids, now.date())
            except OSError as exc:
                raise ArchiveFailed(f"cannot archive to {archive_dir}: {exc}") from exc
            result["archived"] += len(archived)
        with transaction.atomic():
            # Re-checked under the lock: a message restored or replayed meanwhile stays, and
            # one changed since it was archived (every change sets updated_at) stays too.
            locked = (
                expired.filter(pk__in=ids)
                .order_by("pk")  # rows are locked in id order, as job claims lock them
                .select_for_update(of=("self",))
                .values_list("pk", "updated_at")
            )
            ids = [pk for pk, at in locked if archived is None or archived.get(pk) == at]
            # What was done with them stays (recovery.models.history): a 'deleted' row each.
            MessageHistory.record_messages(
                ids, HistoryAction.DELETED, via="system", detail=f"retention ({days} days)"
            )
            # Only the ids: Django's delete loads the rows it deletes, and a batch of big
            # bodies would otherwise be read into memory just to be thrown away.
            _total, per_model = Message.objects.filter(pk__in=ids).only("pk").delete()
        result["messages"] += per_model.get(Message._meta.label, 0)
        pace.batch_done(started)


def last_archive_failure():
    """The newest retention activity row if that run could not archive, else None (one probe
    of the activity_action_newest index)."""
    last = (
        Activity.objects.filter(action="retention").order_by("-created_at").only("detail").first()
    )
    return last if last is not None and "archive_error" in last.detail else None
