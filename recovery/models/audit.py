"""Nightly audit results: runs (with revisions), windows, evidence ids, input gaps."""

from django.conf import settings
from django.db import models
from django.utils import timezone


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
