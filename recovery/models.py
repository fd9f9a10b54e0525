"""The recovery store (DESIGN.md "The recovery store").

One ``Message`` row per collected message, exactly once (``fingerprint`` is unique), plus the trail
of what operators did with it. Business rules live here as model methods; views and API call them.
"""

import datetime
import hashlib
import secrets
import uuid

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone

from recovery import headers as header_codec


class Kind(models.TextChoices):
    DEAD_LETTER = "dead_letter"
    UNROUTABLE = "unroutable"
    RETURNED = "returned"
    NACKED = "nacked"
    UNCONFIRMED = "unconfirmed"


class Reason(models.TextChoices):
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"
    NO_ROUTE = "no_route"
    NACK = "nack"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


class Status(models.TextChoices):
    PENDING = "pending"
    REPLAYING = "replaying"
    REPLAYED = "replayed"
    DISCARDED = "discarded"
    POISONED = "poisoned"


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


ROLE_ORDER = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]


def role_of(user):
    """The strongest role a user holds (superusers are admins); None when the user has none."""
    if not user or not user.is_authenticated:
        return None
    if user.is_superuser:
        return Role.ADMIN
    names = set(user.groups.values_list("name", flat=True))
    for role in reversed(ROLE_ORDER):
        if role.value in names:
            return role
    return None


def has_role(user, minimum):
    role = role_of(user)
    return role is not None and ROLE_ORDER.index(role) >= ROLE_ORDER.index(Role(minimum))


def set_role(user, role):
    role = Role(role)
    groups = [Group.objects.get_or_create(name=r.value)[0] for r in ROLE_ORDER]
    user.groups.remove(*groups)
    user.groups.add(next(g for g in groups if g.name == role.value))


def default_target_of(kind, source_queue, source_exchange, routing_keys):
    """Message.default_target for raw column values (bulk replay reads rows, not models)."""
    if kind == Kind.DEAD_LETTER and source_queue:
        return "", source_queue
    return source_exchange, (routing_keys[0] if routing_keys else "")


class Message(models.Model):
    kind = models.CharField(max_length=16, choices=Kind.choices)
    vhost = models.CharField(max_length=255, default="/")
    source_queue = models.CharField(max_length=255, blank=True, default="")
    source_exchange = models.CharField(max_length=255, blank=True, default="")
    routing_keys = models.JSONField(default=list)
    reason = models.CharField(max_length=16, choices=Reason.choices, default=Reason.UNKNOWN)
    death_count = models.IntegerField(default=0)
    first_death_at = models.DateTimeField(null=True, blank=True)
    last_death_at = models.DateTimeField(null=True, blank=True)
    message_id = models.CharField(max_length=255, blank=True, default="")
    correlation_id = models.CharField(max_length=255, blank=True, default="")
    # All AMQP basic properties except headers, JSON-encoded with recovery.headers.
    properties = models.JSONField(default=dict)
    headers = models.JSONField(default=dict)
    body = models.BinaryField()
    body_size = models.IntegerField()
    content_type = models.CharField(max_length=255, blank=True, default="")
    content_encoding = models.CharField(max_length=255, blank=True, default="")
    # Unique through Meta.constraints: unique=True would add a varchar_pattern_ops twin index
    # that nothing queries and every insert pays for.
    fingerprint = models.CharField(max_length=64)
    group_key = models.CharField(max_length=64)
    group_label = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_reason = models.TextField(blank=True, default="")
    replay_count = models.IntegerField(default=0)
    # A replayed message that died again points at the record it was replayed from.
    origin = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="returns"
    )
    collected_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    last_replayed_at = models.DateTimeField(null=True, blank=True)
    # Soft discard (recovery.replay.discard_message): restore puts back the status it had.
    # db_default because the collector inserts rows with raw SQL naming only its own columns.
    discarded_at = models.DateTimeField(null=True, blank=True)
    status_before_discard = models.CharField(max_length=16, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-collected_at", "-id"]
        # Every index here is paid by each collected row and, since status is indexed, by each
        # replay's status update (no HOT updates): keep only what a page or query uses.
        constraints = [models.UniqueConstraint(fields=["fingerprint"], name="msg_fingerprint")]
        indexes = [
            models.Index(fields=["-collected_at", "-id"], name="msg_newest"),
            models.Index(fields=["kind", "-collected_at", "-id"], name="msg_kind_newest"),
            models.Index(fields=["status", "-collected_at", "-id"], name="msg_status_newest"),
            models.Index(fields=["source_queue", "-collected_at", "-id"], name="msg_queue_newest"),
            models.Index(fields=["reason", "-collected_at", "-id"], name="msg_reason_newest"),
            models.Index(fields=["source_exchange", "-collected_at"], name="msg_exchange_newest"),
            models.Index(fields=["message_id"], name="msg_message_id"),
            models.Index(fields=["correlation_id"], name="msg_correlation_id"),
            # Failure-group pages: first/last seen and the newest messages of one group.
            models.Index(fields=["group_key", "-collected_at", "-id"], name="msg_group_newest"),
            # The trigram search index over ids, headers and body text is an expression index
            # created in migration 0004 (recovery.filters.SEARCH_DOCUMENT_SQL).
        ]

    def __str__(self):
        return f"{self.kind} {self.message_id or self.pk} from {self.source_queue}"

    @property
    def wire_headers(self):
        return header_codec.headers_from_json(self.headers)

    @property
    def x_death(self):
        return [header_codec.plain(entry) for entry in self.headers.get("x-death", [])]

    @property
    def body_bytes(self):
        return bytes(self.body)

    @property
    def is_replayable(self):
        return self.status in (Status.PENDING, Status.POISONED, Status.REPLAYED)

    def default_target(self):
        """(exchange, routing_key) of the default replay target, per DESIGN.md.

        A dead letter goes back to the queue it died in through the default exchange, so a fanout
        is never re-fanned to queues that already consumed it. Unroutable and returned messages go
        back to their original exchange and routing key.
        """
        return default_target_of(
            self.kind, self.source_queue, self.source_exchange, self.routing_keys
        )


class ReplayAttempt(models.Model):
    class Outcome(models.TextChoices):
        CONFIRMED = "confirmed"
        RETURNED = "returned"
        NACKED = "nacked"
        FAILED = "failed"

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="attempts")
    job = models.ForeignKey(
        "ReplayJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="attempts"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    exchange = models.CharField(max_length=255, blank=True, default="")
    routing_key = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    detail = models.TextField(blank=True, default="")
    edited = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]


class ReplayJob(models.Model):
    """A bulk replay: a selection snapshot, a target, a rate, and its progress.

    The engine is ``recovery.replay.runner.JobRunner`` (run by the Celery task
    ``recovery.tasks.run_replay_job``); jobs are made by ``recovery.jobs.create_job``. One runner
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

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
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

    # Target (DESIGN.md "Replay semantics"): none of these = each message's default target.
    target_queue = models.CharField(max_length=255, blank=True, null=True)
    delay_seconds = models.IntegerField(null=True, blank=True)
    via = models.CharField(max_length=8, default="console", db_default="console")
    # Statuses a message may have to be sent by this job, fixed at creation (recovery.jobs).
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

    def cancel(self, user, via="console"):
        """Stop the job for good. Messages not yet sent stay as they are (pending).

        Raises recovery.replay.JobStateError if it already ended. A running job stops within a
        second: what is in flight is confirmed and recorded first. Logged as ``job_cancel``.
        """
        from recovery.jobs import cancel_job

        return cancel_job(self, user, via)

    def resume(self, user, via="console"):
        """Continue a paused job (canary or circuit breaker pause, or a manual pause).

        Resuming after a canary pause counts as the operator accepting the canary; after a
        breaker pause the breaker counts afresh from now. Raises JobStateError unless paused.
        Logged as ``job_resume``.
        """
        from recovery.jobs import resume_job

        return resume_job(self, user, via)


class ReplayJobItem(models.Model):
    """One message of a job: the job's snapshot of its selection and each message's outcome."""

    class State(models.TextChoices):
        PENDING = "pending"  # not sent yet
        CLAIMED = "claimed"  # held by the job's runner (being sent); no one else may touch it
        CONFIRMED = "confirmed"
        RETURNED = "returned"
        NACKED = "nacked"
        FAILED = "failed"
        SKIPPED = "skipped"  # changed since the snapshot (discarded, replayed elsewhere ...)

    job = models.ForeignKey(ReplayJob, on_delete=models.CASCADE, related_name="items")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="job_items")
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
        indexes = [
            models.Index(fields=["job", "state", "id"], name="job_item_claim"),
            # "Is this message held by a job right now?" (one-click replay, discard, other jobs)
            models.Index(
                fields=["message"],
                name="job_item_held",
                condition=models.Q(state="claimed"),
            ),
        ]


class MessageEdit(models.Model):
    """An edited version of a message that was replayed (recovery.replay.edit_and_replay).

    The stored message is never changed; this keeps what was sent instead, and who edited it.
    """

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="edits")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Tagged JSON (recovery.headers), like Message.headers; null = the original headers.
    headers = models.JSONField(null=True, blank=True)
    body = models.BinaryField(null=True, blank=True)  # null = the original body
    exchange = models.CharField(max_length=255, blank=True, null=True)
    routing_key = models.CharField(max_length=255, blank=True, null=True)
    attempt = models.OneToOneField(
        ReplayAttempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="edit"
    )
    via = models.CharField(max_length=8, default="console")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]


class Activity(models.Model):
    """Who did what: every replay, edit, discard, job and role change."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    action = models.CharField(max_length=32)
    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="activity"
    )
    job = models.ForeignKey(ReplayJob, null=True, blank=True, on_delete=models.SET_NULL)
    detail = models.JSONField(default=dict, blank=True)
    via = models.CharField(max_length=8, default="console")  # console | api | system
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "activity"
        # The activity page filters by action (one row per replayed message: millions).
        indexes = [models.Index(fields=["action", "-created_at"], name="activity_action_newest")]


def hash_token(raw):
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """An API token. Only its SHA-256 is stored; the key is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=8)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @classmethod
    def issue(cls, user, name=""):
        raw = "lz_" + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=raw[:8], digest=hash_token(raw))
        return token, raw

    @classmethod
    def authenticate(cls, raw):
        token = (
            cls.objects.select_related("user")
            .filter(digest=hash_token(raw), revoked_at__isnull=True, user__is_active=True)
            .first()
        )
        if token is not None:
            cls.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token

    def revoke(self):
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])


class CollectorHeartbeat(models.Model):
    """One row per running collector thread, upserted every few seconds (healthz, console)."""

    worker = models.CharField(max_length=255)
    vhost = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    collected = models.BigIntegerField(default=0)
    duplicates = models.BigIntegerField(default=0)
    quarantined = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Messages stored per second between the last two heartbeats.
    rate = models.FloatField(default=0.0)
    last_collected_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker", "vhost", "queue"], name="heartbeat_unique")
        ]


class AuditRun(models.Model):
    """One run of the nightly audit for one day. Re-running a day makes a new revision."""

    class State(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    date = models.DateField(db_index=True)
    revision = models.IntegerField(default=1)
    status = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    # PROVISIONAL while any window is provisional, FINAL once all are (see AuditWindow.status).
    finality = models.CharField(max_length=16, default="PROVISIONAL")
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Input files, rows and bytes; the settings (config) and code version the run used.
    manifest = models.JSONField(default=dict, blank=True)
    config = models.JSONField(default=dict, blank=True)
    code_version = models.CharField(max_length=64, blank=True, default="")
    # One number per metric (DESIGN.md "Audit metrics"), named exactly as there.
    totals = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-date", "-revision"]
        constraints = [
            models.UniqueConstraint(fields=["date", "revision"], name="audit_run_revision")
        ]

    def __str__(self):
        return f"audit {self.date} r{self.revision} ({self.status})"


class AuditWindow(models.Model):
    """Metrics of one hour × exchange × consumer group of a run."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="windows")
    window_start = models.DateTimeField()
    exchange = models.CharField(max_length=255, blank=True, default="")
    consumer_group = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16)  # PROVISIONAL | FINAL
    in_gap = models.BooleanField(default=False)
    metrics = models.JSONField(default=dict)

    class Meta:
        ordering = ["window_start", "exchange", "consumer_group"]
        indexes = [models.Index(fields=["run", "window_start"], name="audit_window_run_start")]


class AuditEvidence(models.Model):
    """The ids behind the numbers: lost, duplicated, orphaned, unverified messages."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="evidence")
    kind = models.CharField(max_length=32)  # lost | duplicate | orphan | unverified | pending
    window_start = models.DateTimeField(null=True, blank=True)
    exchange = models.CharField(max_length=255, blank=True, default="")
    consumer_group = models.CharField(max_length=255, blank=True, default="")
    message_id = models.CharField(max_length=255)
    cause = models.CharField(max_length=64, blank=True, default="")
    count = models.IntegerField(default=1)
    # The store row with this message_id, when there is one (a plain id: retention may delete it).
    store_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["window_start", "kind", "message_id"]
        indexes = [
            models.Index(fields=["run", "kind", "window_start"], name="audit_evidence_kind"),
            models.Index(fields=["message_id"], name="audit_evidence_message"),
        ]


class AuditInputGap(models.Model):
    """An hour with no log file from a process that was logging the hour before."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="input_gaps")
    hour = models.DateTimeField()
    side = models.CharField(max_length=16)  # producer | consumer
    process = models.CharField(max_length=255)
    consumer_group = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["hour", "side", "process"]


class IdempotencyKey(models.Model):
    """An API client's ``Idempotency-Key`` on a POST that sends messages (recovery.api).

    The first request with a key claims the row (``status_code`` null while it runs); its response
    is stored, and a retry with the same key, user and request gets that response back instead of
    publishing again. Rows expire after ``IDEMPOTENCY_TTL_HOURS``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    # SHA-256 of method, path and canonical JSON body: the same key on another request is an error.
    request_hash = models.CharField(max_length=64)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    status_code = models.IntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    # Headers the retry must get back too (Location of a created job).
    response_headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key")
        ]


class ApiRateWindow(models.Model):
    """Requests one API token made in one fixed window: the per-token rate limit's counter.

    A row in PostgreSQL (atomic upsert) rather than a per-process cache, so the limit holds
    across every web process and machine.
    """

    scope = models.CharField(max_length=64)  # "token:<id>" or "user:<id>" (session clients)
    window_start = models.DateTimeField()
    count = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "window_start"], name="rate_window_unique")
        ]


class MessageCount(models.Model):
    """Message counts per hour x vhost x kind x source x reason x status x failure group.

    Written only by statement-level triggers on ``recovery_message`` (migration 0004): every
    INSERT/UPDATE/DELETE appends its net change as delta rows, so writers never contend for a
    counter row. Readers sum the rows; ``compact()`` folds the deltas together now and then.
    The overview and failure-group pages read this instead of aggregating a million messages.
    ``hour`` is the UTC hour of collection; once compact() folded it, the UTC day (midnight).
    """

    hour = models.DateTimeField()
    vhost = models.CharField(max_length=255)
    kind = models.CharField(max_length=16)
    source_queue = models.CharField(max_length=255)
    source_exchange = models.CharField(max_length=255)
    reason = models.CharField(max_length=16)
    status = models.CharField(max_length=16)
    group_key = models.CharField(max_length=64)
    n = models.BigIntegerField()

    # Rows stay hourly from the UTC midnight before (now - HOURLY_FOR) on, which covers the
    # 24-hour chart; older ones are folded into days.
    HOURLY_FOR = datetime.timedelta(hours=24)
    KEY = (
        "hour",
        "vhost",
        "kind",
        "source_queue",
        "source_exchange",
        "reason",
        "status",
        "group_key",
    )

    class Meta:
        indexes = [
            models.Index(fields=["hour"], name="msgcount_hour"),
            models.Index(fields=["group_key"], name="msgcount_group"),
        ]

    @classmethod
    def compact(cls):
        """Fold delta rows with the same key into one row; returns the rows removed.

        Hours older than HOURLY_FOR (whole UTC days) are folded into their day first: ``hour``
        is then the day's midnight, which is all the 7-day chart needs, and a month of history
        costs a day's worth of rows per day instead of 24. Only keys with more than one row (or
        a zero sum) are rewritten. Rows another transaction commits meanwhile are not in this
        statement's snapshot and stay as they are, so the sums stay right. One compactor at a
        time (advisory lock); others return at once.
        """
        from django.db import connection, transaction

        key = ", ".join(cls.KEY)
        table = cls._meta.db_table
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('recovery_messagecount'))")
            if not cur.fetchone()[0]:
                return 0
            rest = ", ".join(cls.KEY[1:])
            cur.execute(
                f"""
                WITH old AS (
                    DELETE FROM {table}
                    WHERE hour < date_trunc('day', now() - %s * interval '1 hour', 'UTC')
                      AND hour <> date_trunc('day', hour, 'UTC')
                    RETURNING {key}, n
                ), days AS (
                    INSERT INTO {table} ({key}, n)
                    SELECT date_trunc('day', hour, 'UTC'), {rest}, sum(n) FROM old
                    GROUP BY date_trunc('day', hour, 'UTC'), {rest} HAVING sum(n) <> 0
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM old) - (SELECT count(*) FROM days)
                """,
                [cls.HOURLY_FOR.total_seconds() / 3600],
            )
            removed = cur.fetchone()[0]
            cur.execute(
                f"""
                WITH busy AS (
                    SELECT {key} FROM {table} GROUP BY {key} HAVING count(*) > 1 OR sum(n) = 0
                ), gone AS (
                    DELETE FROM {table} c USING busy b
                    WHERE {" AND ".join(f"c.{k} = b.{k}" for k in cls.KEY)}
                    RETURNING {", ".join(f"c.{k}" for k in cls.KEY)}, c.n
                ), folded AS (
                    INSERT INTO {table} ({key}, n)
                    SELECT {key}, sum(n) FROM gone GROUP BY {key} HAVING sum(n) <> 0
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM folded)
                """
            )
            return removed + cur.fetchone()[0]

    @classmethod
    def rebuild(cls):
        """Recount from the messages themselves (after a restore, or to check the triggers)."""
        from django.db import connection, transaction

        table = cls._meta.db_table
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            cur.execute(f"DELETE FROM {table}")
            cur.execute(REBUILD_COUNTS_SQL)


# The hour bucket is UTC whatever the session time zone of the writer (the collector's psycopg
# connection does not set one).
COUNT_KEY_SQL = (
    "date_trunc('hour', collected_at, 'UTC'), vhost, kind, source_queue, source_exchange, "
    "reason, status, group_key"
)
REBUILD_COUNTS_SQL = f"""
    INSERT INTO recovery_messagecount ({", ".join(MessageCount.KEY)}, n)
    SELECT {COUNT_KEY_SQL}, count(*) FROM recovery_message GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
"""
