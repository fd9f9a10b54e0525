"""Replays: attempts, bulk jobs and their items, edited versions."""

import logging
import uuid
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import models, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from recovery.access.models import Activity
from recovery.errors import StateError
from recovery.models.store import Message

log = logging.getLogger(__name__)

# The Celery task that runs a job (recovery.replay.tasks). Sent by name: the task module imports
# the runner, which imports these models.
RUN_JOB_TASK = "recovery.replay.tasks.run_replay_job"

# The log tables (ReplayAttempt, Activity) keep their references without database foreign keys:
# a bulk replay writes one row of each per message, and PostgreSQL checks every foreign key of
# every row with a query of its own that also locks the referenced row (message, job and user:
# more than the rows cost to write). Django still applies on_delete when a message, job or user
# is deleted through it (it always did that itself), and nothing else deletes them.
LOG_REFERENCE = {"db_constraint": False}


class ReplayAttempt(models.Model):
    class Outcome(models.TextChoices):
        CONFIRMED = "confirmed"
        RETURNED = "returned"
        NACKED = "nacked"
        FAILED = "failed"

    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="attempts", **LOG_REFERENCE
    )
    job = models.ForeignKey(
        "ReplayJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="attempts",
        **LOG_REFERENCE,
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        **LOG_REFERENCE,
    )
    exchange = models.CharField(max_length=255, blank=True, default="")
    routing_key = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    detail = models.TextField(blank=True, default="")
    edited = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]


def mark_died_again(message, attempts):
    """Set ``died_again_copy_id`` on each of ``message``'s attempts (newest first, as
    ``message.attempts`` orders them): the copy collected after that confirmed replay was
    dead-lettered again, or None.

    Each confirmed replay moved the message's replay_count up by one (one.record_outcome,
    job_store.RECORD_SQL) and sent the new count as x-recovery-replay-count, which the collector
    keeps as the copy's replay_count: the newest confirmed attempt sent the message's
    replay_count, the confirmed one before it one less, and so on.
    """
    attempts = list(attempts)
    # By id: of two copies of one replay (rare: one per dead-lettering queue) the newest wins.
    copies = dict(message.returns.order_by("id").values_list("replay_count", "id"))
    sent = message.replay_count
    for attempt in attempts:
        attempt.died_again_copy_id = None
        if attempt.outcome == ReplayAttempt.Outcome.CONFIRMED:
            attempt.died_again_copy_id = copies.get(sent)
            sent -= 1
    return attempts


class ReplayJob(models.Model):
    """A bulk replay: a selection snapshot, a target, a rate, and its progress.

    The engine is ``recovery.replay.runner.JobRunner`` (run by the Celery task
    ``recovery.replay.tasks.run_replay_job``); jobs are made by ``recovery.replay.jobs.create_job``.
    One runner
    holds a job at a time (``runner`` + ``heartbeat_at`` form its lease); the messages it covers are
    ``ReplayJobItem`` rows, claimed in batches with ``FOR UPDATE SKIP LOCKED``.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused"
        CANCELLED = "cancelled"
        DONE = "done"
        FAILED = "failed"

    # The states a job can still be cancelled from.
    ACTIVE = (State.QUEUED, State.RUNNING, State.PAUSED)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # The team a team caller made it for: its runs re-check that team's scope (with the
    # creator's current role in it); null for a job made by a global caller.
    team = models.ForeignKey(
        "recovery.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    filters = models.JSONField(default=dict, blank=True)
    message_ids = models.JSONField(default=list, blank=True)
    group_key = models.CharField(max_length=64, blank=True, default="")
    target_exchange = models.CharField(max_length=255, blank=True, null=True)
    target_routing_key = models.CharField(max_length=255, blank=True, null=True)
    rate = models.FloatField(null=True, blank=True)
    include_poisoned = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    state_reason = models.TextField(blank=True, default="")
    total = models.IntegerField(default=0)
    sent = models.IntegerField(default=0)
    confirmed = models.IntegerField(default=0)
    returned = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    # Target (docs/design.md "Replay semantics"): none of these = each message's default target.
    target_queue = models.CharField(max_length=255, blank=True, null=True)
    delay_seconds = models.IntegerField(null=True, blank=True)
    via = models.CharField(max_length=8, default="console", db_default="console")
    # Statuses a message may have to be sent by this job, fixed at creation (recovery.replay.jobs).
    allowed_statuses = models.JSONField(default=list, blank=True, db_default=[])
    # Canary: the first canary_size messages, then a pause, then continue only if fewer than
    # canary_max_failure_pct % of them came back dead-lettered.
    canary_size = models.IntegerField(default=0, db_default=0)
    canary_pause_seconds = models.FloatField(default=0, db_default=0)
    canary_max_failure_pct = models.FloatField(null=True, blank=True)
    canary_sent_at = models.DateTimeField(null=True, blank=True)
    canary_passed_at = models.DateTimeField(null=True, blank=True)
    # Circuit breaker: pause when this share (%) of the replayed messages dies again. Counted
    # from the base values, which a resume moves up to "now".
    breaker_threshold_pct = models.FloatField(null=True, blank=True)
    breaker_base_confirmed = models.IntegerField(default=0, db_default=0)
    breaker_base_dead = models.IntegerField(default=0, db_default=0)
    # Progress beyond the foundation counters.
    skipped = models.IntegerField(default=0, db_default=0)
    dead_again = models.IntegerField(default=0, db_default=0)
    in_flight = models.IntegerField(default=0, db_default=0)
    # The runner's lease: who runs it, renewed through heartbeat_at; the task message carries
    # the token so a worker attached to another database never runs a job with the same id.
    runner = models.CharField(max_length=128, blank=True, default="", db_default="")
    token = models.UUIDField(default=uuid.uuid4, editable=False)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    populated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "heartbeat_at"], name="job_state_heartbeat")]

    def __str__(self):
        return f"replay job #{self.pk} ({self.state})"

    @property
    def is_active(self):
        """True while the job still sends on its own (queued or running); paused needs a resume."""
        return self.state in (self.State.QUEUED, self.State.RUNNING)

    @property
    def progress(self):
        """Counts for progress bars: total, sent, confirmed, returned, failed, skipped, in_flight,
        remaining, dead_again (replayed then dead-lettered again), percent (0-100), state, reason.
        ``sent`` includes messages still waiting for the broker's confirm."""
        finished = self.confirmed + self.returned + self.failed + self.skipped
        live = self.in_flight if self.state == self.State.RUNNING else 0
        return {
            "state": self.state,
            "reason": self.state_reason,
            "total": self.total,
            "sent": self.sent + live,
            "confirmed": self.confirmed,
            "returned": self.returned,
            "failed": self.failed,
            "skipped": self.skipped,
            "in_flight": live,
            "remaining": max(self.total - finished, 0),
            "dead_again": self.dead_again,
            "percent": round(100.0 * finished / self.total, 1) if self.total else 0.0,
        }

    def eta_seconds(self, now=None):
        """Seconds until the last message is sent, or None when unknown: at the job's rate if it
        has one, else at the pace it has kept since it started (after a canary pause, that pace
        is slower than the next messages will go: an upper bound)."""
        now = now or timezone.now()
        left = self.progress["remaining"]
        if not left or self.state != self.State.RUNNING or self.started_at is None:
            return None
        if self.rate:
            return left / self.rate
        done = self.total - left
        elapsed = (now - self.started_at).total_seconds()
        return left * elapsed / done if done and elapsed > 0 else None

    def canary_wait_left(self, now=None):
        """Seconds left in the canary's pause (its messages sent, not yet judged), else None."""
        if not self.canary_size or self.canary_sent_at is None or self.canary_passed_at:
            return None
        if self.state != self.State.RUNNING:
            return None
        now = now or timezone.now()
        left = self.canary_pause_seconds - (now - self.canary_sent_at).total_seconds()
        return max(left, 0.0)

    @property
    def group_label(self):
        """The failure group's label for a job by group (the key is a hash nobody reads)."""
        if not self.group_key:
            return ""
        if not hasattr(self, "_group_label"):
            self._group_label = (
                Message.objects.filter(group_key=self.group_key)
                .values_list("group_label", flat=True)
                .first()
                or ""
            )
        return self._group_label

    def died_again_copies(self, scope=None):
        """The copies collected after this job's confirmed replays were dead-lettered again;
        with ``scope`` (the caller's Scope), only those it may see: a copy may die in another
        team's queue, and its id is that team's.

        Exact, and as current as the collector: a copy points at its message (``origin``) and
        carries the replay count this job sent (the item's snapshot + 1), so a copy of another
        replay of the same message is not counted. Unlike ``dead_again`` (the runner's count for
        the breaker, written only while the job runs) it keeps counting after the job ended.
        Read from the copies collected since the job started, as the breaker reads them.
        """
        if self.started_at is None:
            return Message.objects.none()
        sent_by_this_job = ReplayJobItem.objects.filter(
            job_id=self.pk,
            message_id=OuterRef("origin_id"),
            state=ReplayJobItem.State.CONFIRMED,
            snapshot_replay_count=OuterRef("replay_count") - 1,
        )
        copies = Message.objects.filter(origin__isnull=False, collected_at__gte=self.started_at)
        if scope is not None:
            copies = scope.messages(copies)
        return copies.filter(Exists(sent_by_this_job))

    def died_again(self, newest=20, scope=None):
        """(how many of its replayed messages died again, the newest ``newest`` copies); with
        ``scope``, of the copies it may see."""
        copies = self.died_again_copies(scope)
        count = copies.order_by().values("origin_id").distinct().count()
        shown = list(copies.only("id", "origin_id").order_by("-id")[:newest]) if count else []
        return count, shown

    def mark_died_again(self, attempts, scope=None):
        """Set ``died_again_copy_id`` on each of this job's ``attempts`` (one query); with
        ``scope``, only to copies it may see."""
        attempts = list(attempts)
        confirmed = ReplayAttempt.Outcome.CONFIRMED
        ids = [a.message_id for a in attempts if a.outcome == confirmed]
        copies = (
            dict(
                self.died_again_copies(scope)
                .filter(origin_id__in=ids)
                .order_by("id")
                .values_list("origin_id", "id")
            )
            if ids
            else {}
        )
        for attempt in attempts:
            attempt.died_again_copy_id = (
                copies.get(attempt.message_id) if attempt.outcome == confirmed else None
            )
        return attempts

    def cancel(self, user, via="console", team=None):
        """Stop the job for good. Messages not yet sent stay as they are (pending).

        Raises StateError if it already ended. A running job stops within a second: what is in
        flight is confirmed and recorded first. Logged as ``job_cancelled``.
        """
        now = timezone.now()
        with transaction.atomic():
            updated = ReplayJob.objects.filter(pk=self.pk, state__in=self.ACTIVE).update(
                state=ReplayJob.State.CANCELLED,
                state_reason=f"cancelled by {_name(user)}",
                finished_at=now,
            )
            if not updated:
                state = ReplayJob.objects.filter(pk=self.pk).values_list("state", flat=True).first()
                raise StateError(
                    f"job #{self.pk} is {state}; "
                    "only queued, running or paused jobs can be cancelled"
                )
            Activity.record(user, "job_cancelled", via=via, job=self.pk, team=team)
        ReplayJob.release_orphaned_claims(self.pk)
        self.refresh_from_db()
        return self

    def resume(self, user, via="console", team=None):
        """Continue a paused job (canary or circuit breaker pause, or a manual pause).

        Resuming after a canary pause counts as the operator accepting the canary; after a
        breaker pause the breaker counts afresh from now. Raises StateError unless paused.
        Logged as ``job_resumed``.
        """
        with transaction.atomic():
            locked = ReplayJob.objects.select_for_update().get(pk=self.pk)
            if locked.state != ReplayJob.State.PAUSED:
                raise StateError(
                    f"job #{self.pk} is {locked.state}; only a paused job can be resumed"
                )
            accepted_canary = locked.canary_size > 0 and locked.canary_passed_at is None
            locked.state = ReplayJob.State.QUEUED
            locked.state_reason = f"resumed by {_name(user)}"
            # The breaker judges what happens from now on, not the deaths that tripped it.
            locked.breaker_base_confirmed = locked.confirmed
            locked.breaker_base_dead = locked.dead_again
            if accepted_canary:
                locked.canary_passed_at = timezone.now()
            locked.save(
                update_fields=[
                    "state",
                    "state_reason",
                    "breaker_base_confirmed",
                    "breaker_base_dead",
                    "canary_passed_at",
                ]
            )
            Activity.record(
                user,
                "job_resumed",
                detail={"accepted_canary": accepted_canary},
                via=via,
                job=locked,
                team=team,
            )
            transaction.on_commit(locked.enqueue)
        self.refresh_from_db()
        return self

    def enqueue(self, countdown=None, paced=False):
        """Send the job's Celery task (after ``countdown`` seconds: a slow rate's wait; ``paced``:
        its next message is due when it starts). A broker failure here is logged, not raised:
        the job stays queued and ``resume_stalled_jobs`` sends it again."""
        # When the task is due, so the stall sweep does not take a countdown for a lost task.
        due = timezone.now() + timedelta(seconds=countdown or 0)
        ReplayJob.objects.filter(pk=self.pk).update(enqueued_at=due)
        try:
            current_app.send_task(
                RUN_JOB_TASK,
                (self.pk, str(self.token)),
                kwargs={"paced": True} if paced else None,
                countdown=countdown,
                queue=settings.REPLAY_TASK_QUEUE or None,
                retry=False,
            )
        except Exception:
            log.exception(
                "replay job %s: could not enqueue its task; the stall sweep will", self.pk
            )
            return False
        return True

    @staticmethod
    def release_orphaned_claims(job_id=None):
        """Items claimed by a runner that is gone (ended job, or a stale lease) go back to
        pending, so the messages are not held forever. Returns how many."""
        stale = timezone.now() - timedelta(seconds=settings.REPLAY_LEASE_SECONDS)
        jobs = ReplayJob.objects.filter(
            Q(runner="") | Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=stale)
        )
        if job_id is not None:
            jobs = jobs.filter(pk=job_id)
        return ReplayJobItem.objects.filter(
            job__in=jobs.exclude(state=ReplayJob.State.RUNNING), state=ReplayJobItem.State.CLAIMED
        ).update(state=ReplayJobItem.State.PENDING, claimed_by="", claimed_at=None)


def _name(user):
    return user.get_username() if user is not None else "the system"


class ReplayJobItem(models.Model):
    """One message of a job: the job's snapshot of its selection and each message's outcome.

    Written twice per replayed message (claimed, then its outcome), so no index covers
    ``state``: the updates are HOT (heap-only: no index entry written, far cheaper for
    PostgreSQL than an entry in each index). Migration 0012 leaves three quarters of each page
    free for the new versions. Claims walk ``job_item_order`` from a cursor
    (recovery.replay.job_store); "is this message held?" reads the few items of one message
    through the message index.
    """

    class State(models.TextChoices):
        PENDING = "pending"  # not sent yet
        CLAIMED = "claimed"  # held by the job's runner (being sent); no one else may touch it
        CONFIRMED = "confirmed"
        RETURNED = "returned"
        NACKED = "nacked"
        FAILED = "failed"
        SKIPPED = "skipped"  # changed since the snapshot (discarded, replayed elsewhere ...)

    # No index of its own: job_item_unique and job_item_order lead with the job, and every item
    # insert (the snapshot) would pay for a third copy.
    # Neither reference is a database foreign key, for the reason the log tables' are not
    # (LOG_REFERENCE): a snapshot inserts one item per message, and the deferred checks at its
    # commit locked every message row and the job row once per item, which cost twice the
    # inserts (12 us per item). Django deletes a job's or a message's items itself (CASCADE).
    job = models.ForeignKey(
        ReplayJob,
        on_delete=models.CASCADE,
        related_name="items",
        db_index=False,
        db_constraint=False,
    )
    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="job_items", db_constraint=False
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    canary = models.BooleanField(default=False)
    # The message's replay_count when the job was made: a job never sends a message someone
    # replayed after that (it would be a double send).
    snapshot_replay_count = models.IntegerField(default=0)
    claimed_by = models.CharField(max_length=128, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "message"], name="job_item_unique"),
        ]
        indexes = [models.Index(fields=["job", "id"], name="job_item_order")]


class MessageEdit(models.Model):
    """An edited version of a message that was replayed (recovery.replay.edit_and_replay).

    The stored message is never changed; this keeps what was sent instead, and who edited it.
    """

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="edits")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Tagged JSON (recovery.client.headers), like Message.headers; null = the original headers.
    headers = models.JSONField(null=True, blank=True)
    body = models.BinaryField(null=True, blank=True)  # null = the original body
    exchange = models.CharField(max_length=255, blank=True, null=True)
    routing_key = models.CharField(max_length=255, blank=True, null=True)
    attempt = models.OneToOneField(
        ReplayAttempt,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="edit",
    )
    via = models.CharField(max_length=8, default="console")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
