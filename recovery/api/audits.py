"""audits: nightly reconciliation runs, their windows and the evidence behind the numbers.

Metric names are those of docs/design.md "Audit metrics", exactly as the Spark job writes them
(spark/metrics.py ``METRICS``, told the Django side once in recovery/models/audit.py). The API
does not import pyspark.
"""

from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from recovery.api.errors import problem_response
from recovery.api.idempotency import idempotent
from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import IsoDateField, Rfc3339DateTimeField, StrictBooleanField, validated
from recovery.api.permissions import requires
from recovery.api.replay_jobs import ReplayJobDetailSerializer
from recovery.api.schema import IDEMPOTENCY_KEY
from recovery.models import (
    AuditEvidence,
    AuditInputGap,
    AuditRun,
    AuditWindow,
    ReplayJob,
    Role,
    scope_of,
    team_scoped,
)
from recovery.models.audit import (
    EVIDENCE_KINDS,
    FINAL_ONLY,
    LATENCY_METRICS,
    METRICS,
    RATIO_METRICS,
)
from recovery.replay import jobs

FINALITY = ("PROVISIONAL", "FINAL")
AUDIT_OUTCOMES = ("running", "succeeded", "succeeded_with_warnings", "failed")
# Named for SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] (several models have a "status").
AuditRunState = AuditRun.State


def _metric_schema(name):
    kind = "number" if name in RATIO_METRICS else "integer"
    schema = {"type": kind, "nullable": True}
    if name in FINAL_ONLY:
        schema["description"] = "null until the window is FINAL"
    elif name in LATENCY_METRICS:
        schema["description"] = "null when nothing was consumed"
    return schema


METRICS_SCHEMA = {
    "type": "object",
    "description": 'One number per audit metric (docs/design.md "Audit metrics"); see '
    "spark/transforms.py for each definition. Unknown keys may be added in later versions.",
    "properties": {name: _metric_schema(name) for name in METRICS},
    "additionalProperties": True,
}
TOTALS_SCHEMA = {
    **METRICS_SCHEMA,
    "properties": {
        "status": {"type": "string", "enum": list(FINALITY)},
        **METRICS_SCHEMA["properties"],
    },
    "description": "Every metric over the whole run, each message counted once; `lost` and "
    "`loss_ppm` cover the FINAL windows. Empty while the run is running.",
}


@extend_schema_field(METRICS_SCHEMA)
class MetricsField(serializers.JSONField):
    pass


class WarningSerializer(serializers.Serializer):
    code = serializers.CharField(
        help_text="unclaimed | unbound_consumption | missing_consumer_logs | unverified | "
        "input_gaps | malformed_lines | orphan_consumptions (the metric of that name); for a "
        "run also no_bindings | bindings_snapshot_only | bindings_history_gap (docs/audit.md)"
    )
    count = serializers.IntegerField()


@extend_schema_field(TOTALS_SCHEMA)
class TotalsField(serializers.JSONField):
    pass


class AuditWindowSerializer(serializers.ModelSerializer):
    status = serializers.ChoiceField(choices=FINALITY)
    metrics = MetricsField()
    warnings = WarningSerializer(
        many=True, read_only=True, help_text="What the audit could not decide in this window."
    )

    class Meta:
        model = AuditWindow
        fields = [
            "window_start",
            "exchange",
            "consumer_group",
            "status",
            "in_gap",
            "metrics",
            "warnings",
        ]
        read_only_fields = fields


class AuditInputGapSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditInputGap
        fields = ["hour", "side", "process", "consumer_group"]
        read_only_fields = fields


class AuditRunSerializer(serializers.ModelSerializer):
    finality = serializers.ChoiceField(choices=FINALITY)
    totals = TotalsField()
    warnings = WarningSerializer(
        many=True,
        read_only=True,
        help_text="What the run could not decide; empty only when it could decide everything.",
    )
    outcome = serializers.ChoiceField(
        choices=AUDIT_OUTCOMES,
        read_only=True,
        help_text="status, except that a succeeded run with warnings is "
        "succeeded_with_warnings: never present it as a plain success.",
    )

    class Meta:
        model = AuditRun
        fields = [
            "id",
            "date",
            "revision",
            "status",
            "outcome",
            "warnings",
            "finality",
            "error",
            "started_at",
            "finished_at",
            "code_version",
            "totals",
        ]
        read_only_fields = fields

    def _scope(self):
        request = self.context.get("request")
        return scope_of(request) if request is not None else None

    def to_representation(self, run):
        scope = self._scope()
        if scope is not None and not scope.is_global:
            run = run.narrowed_to(scope.audit_q())  # docs/security.md, "Teams"
        return super().to_representation(run)


class AuditRunDetailSerializer(AuditRunSerializer):
    windows = AuditWindowSerializer(many=True, read_only=True)
    input_gaps = AuditInputGapSerializer(many=True, read_only=True)
    manifest = serializers.JSONField(read_only=True, help_text="Input files, rows and bytes.")
    config = serializers.JSONField(read_only=True, help_text="Settings the run used.")
    evidence_counts = serializers.SerializerMethodField()

    class Meta(AuditRunSerializer.Meta):
        fields = [
            *AuditRunSerializer.Meta.fields,
            "manifest",
            "config",
            "windows",
            "input_gaps",
            "evidence_counts",
        ]
        read_only_fields = fields

    def get_evidence_counts(self, run) -> dict[str, int]:
        """{kind: rows} of the run's evidence (lost, unverified, duplicate, orphan, unclaimed)."""
        scope = self._scope()
        evidence = run.evidence.order_by()
        if scope is not None:
            evidence = evidence.filter(scope.audit_q())
        return dict(evidence.values_list("kind").annotate(n=Count("id")))


class AuditEvidenceSerializer(serializers.ModelSerializer):
    message = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvidence
        fields = [
            "id",
            "kind",
            "window_start",
            "exchange",
            "consumer_group",
            "message_id",
            "cause",
            "count",
            "store_id",
            "producer_source",
            "consumer_source",
            "message",
        ]
        read_only_fields = fields

    def get_message(self, evidence) -> str | None:
        """API path of the store row, when the message reached the store."""
        return f"/api/v1/messages/{evidence.store_id}" if evidence.store_id else None


class AuditRunCursorPagination(StrictCursorPagination):
    ordering = ("-started_at", "-id")


class EvidenceCursorPagination(StrictCursorPagination):
    ordering = ("id",)
    max_page_size = 1000


class AuditFilterParams(serializers.Serializer):
    date = IsoDateField(required=False, help_text="the audited UTC day")
    status = serializers.ChoiceField(choices=AuditRun.State.choices, required=False)
    latest = StrictBooleanField(
        required=False, help_text="true: only the newest revision of each day"
    )


@extend_schema(summary="Audit runs, newest first", parameters=[AuditFilterParams])
class AuditRunList(generics.ListAPIView):
    serializer_class = AuditRunSerializer
    pagination_class = AuditRunCursorPagination
    team_scoped = True

    def get_queryset(self):
        params = validated(AuditFilterParams, self.request.query_params)
        runs = AuditRun.objects.all()
        if "date" in params:
            runs = runs.filter(date=params["date"])
        if "status" in params:
            runs = runs.filter(status=params["status"])
        if params.get("latest"):
            newest = AuditRun.objects.order_by("date", "-revision").distinct("date")
            runs = runs.filter(pk__in=newest.values("pk"))
        return runs


@extend_schema(
    summary="One audit run: status, totals, every window, input gaps",
    description="Windows are hour × exchange × consumer group. A window is PROVISIONAL until "
    "its end + grace has passed, then FINAL; re-running a day makes a new revision.",
)
class AuditRunDetail(generics.RetrieveAPIView):
    serializer_class = AuditRunDetailSerializer
    team_scoped = True

    def get_queryset(self):
        scope = scope_of(self.request)
        return AuditRun.objects.prefetch_related(
            Prefetch("windows", AuditWindow.objects.filter(scope.audit_q())),
            Prefetch("input_gaps", AuditInputGap.objects.filter(scope.audit_q(False))),
        )


class EvidenceFilterParams(serializers.Serializer):
    kind = serializers.ChoiceField(choices=list(EVIDENCE_KINDS), required=False)
    exchange = serializers.CharField(required=False, allow_blank=True, max_length=255)
    consumer_group = serializers.CharField(required=False, allow_blank=True, max_length=255)
    message_id = serializers.CharField(required=False, allow_blank=True, max_length=255)
    window_start = Rfc3339DateTimeField(required=False, help_text="the window's hour")


@extend_schema(summary="The message ids behind a run's numbers", parameters=[EvidenceFilterParams])
class AuditEvidenceList(generics.ListAPIView):
    serializer_class = AuditEvidenceSerializer
    pagination_class = EvidenceCursorPagination
    team_scoped = True

    def get_queryset(self):
        run = get_object_or_404(AuditRun, pk=self.kwargs["pk"])
        evidence = run.evidence.filter(scope_of(self.request).audit_q())
        return evidence.filter(**validated(EvidenceFilterParams, self.request.query_params))


@extend_schema(
    summary="Replay the recoverable lost of an audit as one job",
    parameters=[IDEMPOTENCY_KEY],
    request=None,
    responses={201: ReplayJobDetailSerializer, 404: None, 422: None},
    description="One bulk replay job (the job defaults: canary, breaker, each message's own "
    "target) of the run's `recoverable` evidence: expected pairs never received by their group, "
    "dead-lettered and held by Lazarus, whose message is still in the store. A team token "
    "covers its team's windows only. 404 when the run found nothing recoverable the caller may "
    "see; 422 when none of it is left in the store (retention removed it).",
)
@team_scoped
@api_view(["POST"])
@permission_classes([requires(Role.OPERATOR)])
@idempotent
def replay_recoverable(request, pk):
    scope = scope_of(request)
    run = get_object_or_404(AuditRun, pk=pk)
    try:
        job, _ = jobs.replay_recoverable(run, request.user, scope, via="api")
    except jobs.NothingRecoverable:
        raise NotFound("This audit found nothing recoverable in your scope.") from None
    except jobs.RecoverableGone:
        return problem_response(
            422,
            "No recoverable message of this audit is in the store.",
            "nothing_recoverable",
            request,
        )
    job = ReplayJob.objects.select_related("created_by").get(pk=job.pk)
    return Response(
        ReplayJobDetailSerializer(job, context={"scope": scope}).data,
        status=status.HTTP_201_CREATED,
        headers={"Location": f"/api/v1/replay-jobs/{job.pk}"},
    )
