"""Nightly audit results: runs (with revisions), windows, evidence ids, input gaps; and the
bindings history the audit reads to know who was expected to receive what, and when."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.models.store import Message

# The audit's metric names, as the Spark job writes them (spark/metrics.py). recovery/ may not
# import spark/ (separate layers: spark-submit runs without Django), so this is the Django side's
# one copy, and tests/audit/test_metric_names.py holds it equal to the job's.
COUNT_METRICS = (
    "publish_attempts",
    "distinct_published",
    "producer_retries",
    "confirmed",
    "nacked",
    "returned",
    "unconfirmed",
    "expected_confirmed",
    "delivered_unique",
    "dead_lettered",
    "dead_lettered_rejected",
    "dead_lettered_expired",
    "dead_lettered_maxlen",
    "dead_lettered_delivery_limit",
    "recovered",
    "lost",
    "unverified",
    "pending",
    "dup_msgs",
    "dup_deliveries",
    "dup_producer_retry",
    "dup_broker_redelivery",
    "dup_consumer_reprocessing",
    "late_deliveries",
    "orphan_consumptions",
    "clock_skew",
    "malformed_lines",
    "input_gaps",
    "unclaimed",
    "unbound_consumption",
    "missing_consumer_logs",
    # What spans cannot prove (spark/spans.py; the definitions: spark/transforms.py):
    "sent",
    "expected_sent",
    "lost_confirmation_unknown",
    "received_unknown",
    # Expected pairs not received but dead-lettered for their group and in the store.
    "recoverable",
)
LATENCY_METRICS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")
RATIO_METRICS = ("loss_ppm", "within_sla_share")
METRICS = (*COUNT_METRICS, "loss_ppm", *LATENCY_METRICS, "within_sla_share")
# Known only once a window is FINAL: null in PROVISIONAL windows.
FINAL_ONLY = ("lost", "unverified", "loss_ppm", "lost_confirmation_unknown")
# The key columns of the job's windows output; every other column is a metric.
WINDOW_KEYS = ("window_start", "window_end", "status", "exchange", "consumer_group")
# What the audit could not decide: a run or window counting any of these is never presented as
# a plain success.
WARNING_METRICS = (
    "unclaimed",
    "unbound_consumption",
    "missing_consumer_logs",
    "unverified",
    "input_gaps",
    "malformed_lines",
    "orphan_consumptions",
    "lost_confirmation_unknown",
    "received_unknown",
)


def metric_warnings(metrics: dict) -> list[dict]:
    """``[{code, count}]`` of the ``WARNING_METRICS`` a totals or window dict counts."""
    return [
        {"code": m, "count": metrics[m]}
        for m in WARNING_METRICS
        if isinstance(metrics.get(m), int) and metrics[m] > 0
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
    # One number per metric (docs/design.md "Audit metrics"), named exactly as there.
    totals = models.JSONField(default=dict, blank=True)
    # [{code, count}]: what the run could not decide (its warning metrics, and where its
    # expectations came from: no bindings, a snapshot instead of the history, a history gap).
    warnings = models.JSONField(default=list, blank=True)
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

    def narrowed_to(self, windows_q):
        """This run as a team member sees it (never saved): its totals, manifest, config and
        error cover every team's exchanges and groups and are left out; its warnings are
        those of the windows ``windows_q`` selects, summed, so ``outcome`` still never calls
        a run with warnings in the team's windows a plain success."""
        counts: dict[str, int] = {}
        for metrics in self.windows.filter(windows_q).values_list("metrics", flat=True):
            for warning in metric_warnings(metrics):
                counts[warning["code"]] = counts.get(warning["code"], 0) + warning["count"]
        self.warnings = [{"code": code, "count": n} for code, n in counts.items()]
        self.totals, self.manifest, self.config, self.error = {}, {}, {}, ""
        return self

    def recoverable_evidence(self, evidence_q=None):
        """This run's ``recoverable`` evidence (expected, never received, dead-lettered for the
        group and in Lazarus), within ``evidence_q`` (a team's ``Scope.audit_q()``) if given."""
        evidence = self.evidence.filter(kind="recoverable", store_id__isnull=False)
        return evidence if evidence_q is None else evidence.filter(evidence_q)

    def recoverable_ids(self, evidence_q=None):
        """The store ids of ``recoverable_evidence`` whose message is still in the store (not
        removed by retention), oldest first: what "replay the recoverable" selects; the job
        itself skips those already replayed or discarded."""
        ids = self.recoverable_evidence(evidence_q).values_list("store_id", flat=True)
        return list(
            Message.objects.filter(pk__in=ids.distinct())
            .order_by("pk")
            .values_list("pk", flat=True)
        )

    @property
    def outcome(self) -> str:
        """What the console and the API show: a succeeded run with warnings is not a success."""
        if self.status == self.State.SUCCEEDED and self.warnings:
            return "succeeded_with_warnings"
        return self.status


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

    @property
    def warnings(self) -> list[dict]:
        return metric_warnings(self.metrics)


# What an evidence row can be (``AuditEvidence.kind``), in the order a reader filters by.
EVIDENCE_KINDS = (
    "lost",
    "recoverable",  # not received, dead-lettered for the group and in Lazarus: ``store_id``
    "lost_confirmation_unknown",  # a span's publish, never received: confirmation unknown
    "received_unknown",  # a failed consumer span: received, outcome unknown
    "duplicate",
    "orphan",
    "unverified",
    "unclaimed",
    "pending",
)


class AuditEvidence(models.Model):
    """The ids behind the numbers: lost, duplicated, orphaned, unverified messages."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="evidence")
    # lost | unverified | lost_confirmation_unknown | duplicate | orphan | unclaimed |
    # recoverable (dead-lettered, in Lazarus: store_id) | received_unknown (a failed span)
    kind = models.CharField(max_length=32)
    window_start = models.DateTimeField(null=True, blank=True)
    exchange = models.CharField(max_length=255, blank=True, default="")
    consumer_group = models.CharField(max_length=255, blank=True, default="")
    message_id = models.CharField(max_length=255)
    # duplicate: its cause; orphan: the consumer; lost/unverified: where the group's expectation
    # came from (configured | bound | observed); unclaimed: the routing key.
    cause = models.CharField(max_length=64, blank=True, default="")
    count = models.IntegerField(default=1)
    # The store row with this message_id, when there is one (a plain id: retention may delete it).
    store_id = models.BigIntegerField(null=True, blank=True)
    # What the audit read that day for the row's exchange and routing key (producer) and for
    # its group (consumer): log | span | log+span; empty on days that read no span.
    producer_source = models.CharField(max_length=16, blank=True, default="")
    consumer_source = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["window_start", "kind", "message_id"]
        indexes = [
            models.Index(fields=["run", "kind", "window_start"], name="audit_evidence_kind"),
            models.Index(fields=["message_id"], name="audit_evidence_message"),
        ]


class AuditInputGap(models.Model):
    """An hour with no log file from a process that was logging the hour before; or (process
    empty) a window in which no consumer of a group expected to receive its messages wrote a
    line (its log is missing)."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="input_gaps")
    hour = models.DateTimeField()
    # producer | consumer | trace (a trace_gap of the broker's trace: recovery/audit/trace.py)
    side = models.CharField(max_length=16)
    process = models.CharField(max_length=255)
    consumer_group = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["hour", "side", "process"]


class BindingPeriod(models.Model):
    """A binding of a watched vhost as the bindings history saw it (``recovery.audit.bindings``):
    from the poll that first saw it (null: it was there when the history began) to the last poll
    that saw it (null: it still is). Only changes are written."""

    vhost = models.CharField(max_length=255)
    exchange = models.CharField(max_length=255)
    # The topic pattern the audit matches ("#" for fanout and headers exchanges).
    routing_key = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)  # the consumer group (one queue per group)
    first_seen = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    gone_at = models.DateTimeField(null=True, blank=True)  # the poll that found it missing

    class Meta:
        ordering = ["vhost", "exchange", "routing_key", "queue", "first_seen"]
        indexes = [models.Index(fields=["vhost", "gone_at"], name="binding_period_open")]

    def __str__(self):
        return f"{self.vhost}:{self.exchange}/{self.routing_key} -> {self.queue}"


class BindingsCoverage(models.Model):
    """A stretch of time the bindings history covers for a vhost: polls with no pause longer
    than ``BINDINGS_STALE_POLLS`` intervals. Outside them the audit says it could not see."""

    vhost = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    polled_at = models.DateTimeField()

    class Meta:
        ordering = ["vhost", "started_at"]
        indexes = [models.Index(fields=["vhost", "polled_at"], name="bindings_coverage_last")]
