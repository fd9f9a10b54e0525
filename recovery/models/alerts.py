"""Alerts: rules that watch Lazarus and the broker, their state and history, and the durable
outbox of notifications to webhooks, Slack and email (recovery/alerts/)."""

import datetime
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


class AlertRule(models.Model):
    """One thing to watch (``kind`` + ``params``, optionally scoped) and its state.

    The state changes only through ``recovery.alerts.engine.evaluate``: ok -> firing notifies
    once, firing -> ok notifies once, a firing rule reminds every ``remind_every`` (none: never);
    a muted rule keeps its state and history but notifies nobody until ``muted_until``."""

    class Kind(models.TextChoices):
        NEW_FAILURE_GROUP = "new_failure_group", "a new failure group appears"
        OPEN_MESSAGES = "open_messages", "open messages above a threshold"
        OPEN_GROWTH = "open_growth", "messages collected faster than a rate"
        COLLECTOR_DOWN = "collector_down", "no collector heartbeat"
        COLLECTOR_LAG = "collector_lag", "messages waiting in the recovery queues"
        REPLAY_JOB = "replay_job", "a replay job paused (canary, breaker) or failed"
        AUDIT = "audit", "an audit with loss, with warnings, or not run"
        BROKER_ALARM = "broker_alarm", "a broker memory or disk alarm, or blocked publishers"
        QUEUE_WITHOUT_CONSUMERS = "queue_without_consumers", "a recovery queue nobody consumes"
        UNCOVERED_QUEUES = "uncovered_queues", "queues whose dead letters Lazarus cannot see"
        BROKER_TALLY = "broker_tally", "the broker lost or dead-lettered what Lazarus lacks"

    class State(models.TextChoices):
        OK = "ok"
        FIRING = "firing"

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    params = models.JSONField(default=dict, blank=True)
    # Scope (empty: everything). Which of them a kind reads: recovery.alerts.checks.
    vhost = models.CharField(max_length=255, blank=True, default="")
    queue = models.CharField(max_length=255, blank=True, default="")
    exchange = models.CharField(max_length=255, blank=True, default="")
    group_key = models.CharField(max_length=64, blank=True, default="")
    # The condition must hold this long before the rule fires (0: at once).
    for_seconds = models.IntegerField(default=0)
    remind_every = models.DurationField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    muted_until = models.DateTimeField(null=True, blank=True)
    channels = models.ManyToManyField("NotificationChannel", blank=True, related_name="rules")

    state = models.CharField(max_length=8, choices=State.choices, default=State.OK)
    state_since = models.DateTimeField(default=timezone.now)
    condition_since = models.DateTimeField(null=True, blank=True)  # true, not yet long enough
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    last_value = models.FloatField(null=True, blank=True)
    last_summary = models.TextField(blank=True, default="")
    last_items = models.JSONField(default=list, blank=True)
    # An evaluation that could not look (broker or database down): said, never taken as ok.
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return f"{self.name} ({self.kind}, {self.state})"

    @property
    def unchecked(self) -> str:
        """Why its state cannot be trusted now ("" when it can): never evaluated, or not for
        several evaluation periods (beat or its worker is not running)."""
        if self.last_evaluated_at is None:
            return "never evaluated"
        late = datetime.timedelta(seconds=4 * settings.ALERTS_EVALUATE_SECONDS)
        if timezone.now() - self.last_evaluated_at > late:
            return f"not evaluated since {self.last_evaluated_at:%Y-%m-%d %H:%M} UTC"
        return ""

    def muted(self, now=None) -> bool:
        return bool(self.muted_until and self.muted_until > (now or timezone.now()))

    @property
    def scope(self) -> dict:
        return {
            k: v
            for k, v in (
                ("vhost", self.vhost),
                ("queue", self.queue),
                ("exchange", self.exchange),
                ("group_key", self.group_key),
            )
            if v
        }


class AlertTransition(models.Model):
    """A rule's history: every change of state (and every error that kept it from looking)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="transitions")
    at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=16)  # firing | ok | error
    value = models.FloatField(null=True, blank=True)
    summary = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["rule", "-at"], name="alert_transition_rule")]


def new_secret():
    return secrets.token_hex(32)


class NotificationChannel(models.Model):
    """Where notifications go. ``target``: the URL (webhook, slack) or comma-separated email
    addresses. A webhook body is signed with ``secret`` (recovery/alerts/deliver.py)."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        SLACK = "slack"
        EMAIL = "email"

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.TextField()
    secret = models.CharField(max_length=128, default=new_secret, blank=True)
    enabled = models.BooleanField(default=True)
    consecutive_failures = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    # This many failed attempts in a row and the channel is shown as failing.
    FAILING_AFTER = 3

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return f"{self.name} ({self.kind})"

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= self.FAILING_AFTER


class Notification(models.Model):
    """The outbox: one notification to one channel, delivered with retries and backoff by
    ``recovery.alerts.deliver``; evaluation only inserts rows, so a slow or dead receiver never
    holds it up."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after ALERTS_MAX_ATTEMPTS

    rule = models.ForeignKey(
        AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="notifications"
    )
    event = models.CharField(max_length=16)  # firing | resolved | reminder | updated | test
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True, default="")
    # Every attempt: [{at, ok, status, error}], newest last (capped).
    attempt_log = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_due",
                condition=models.Q(status="pending"),
            )
        ]

    def backoff(self) -> datetime.timedelta:
        """30 s, 1 min, 2 min, ... capped at an hour."""
        return datetime.timedelta(seconds=min(30 * 2 ** max(self.attempts - 1, 0), 3600))
