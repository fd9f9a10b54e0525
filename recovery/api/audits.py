"""audits: nightly reconciliation runs, their windows and the evidence behind the numbers.

Metric names are DESIGN.md's, exactly as the Spark job writes them (spark/metrics.py ``METRICS``;
tests/api/test_audits.py checks the two lists agree). The API does not import pyspark.
"""

from django.db.models import Count
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.pagination import CursorPagination

from recovery.models import AuditEvidence, AuditInputGap, AuditRun, AuditWindow

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
)
LATENCY_METRICS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")
RATIO_METRICS = ("loss_ppm", "within_sla_share")
FINAL_ONLY = ("lost", "unverified", "loss_ppm")
FINALITY = ("PROVISIONAL", "FINAL")
# Named for SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] (several models have a "status").
AuditRunState = AuditRun.State
METRICS = (*COUNT_METRICS, "loss_ppm", *LATENCY_METRICS, "within_sla_share")


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
    "description": 'One number per audit metric (DESIGN.md "Audit metrics"); see '
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


@extend_schema_field(TOTALS_SCHEMA)
class TotalsField(serializers.JSONField):
    pass


class AuditWindowSerializer(serializers.ModelSerializer):
    status = serializers.ChoiceField(choices=FINALITY)
    metrics = MetricsField()

    class Meta:
        model = AuditWindow
        fields = ["window_start", "exchange", "consumer_group", "status", "in_gap", "metrics"]
        read_only_fields = fields


class AuditInputGapSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditInputGap
        fields = ["hour", "side", "process", "consumer_group"]
        read_only_fields = fields


class AuditRunSerializer(serializers.ModelSerializer):
    finality = serializers.ChoiceField(choices=FINALITY)
    totals = TotalsField()

    class Meta:
        model = AuditRun
        fields = [
            "id",
            "date",
            "revision",
            "status",
            "finality",
            "error",
            "started_at",
            "finished_at",
            "code_version",
            "totals",
        ]
        read_only_fields = fields


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
        """{kind: rows} of the run's evidence (lost, unverified, duplicate, orphan)."""
        return dict(run.evidence.order_by().values_list("kind").annotate(n=Count("id")))


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
            "message",
        ]
        read_only_fields = fields

    def get_message(self, evidence) -> str | None:
        """API path of the store row, when the message reached the store."""
        return f"/api/v1/messages/{evidence.store_id}" if evidence.store_id else None


class AuditRunCursorPagination(CursorPagination):
    ordering = ("-started_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500


class EvidenceCursorPagination(CursorPagination):
    ordering = ("id",)
    page_size_query_param = "page_size"
    max_page_size = 1000


class AuditFilterSerializer(serializers.Serializer):
    date = serializers.DateField(required=False)
    status = serializers.ChoiceField(choices=AuditRun.State.choices, required=False)
    latest = serializers.BooleanField(required=False, default=False)


@extend_schema(
    summary="Audit runs, newest first",
    parameters=[
        OpenApiParameter("date", str, description="the audited UTC day, YYYY-MM-DD"),
        OpenApiParameter("status", str, enum=AuditRun.State.values),
        OpenApiParameter(
            "latest", bool, description="only the newest revision of each day (`true`)"
        ),
    ],
)
class AuditRunList(generics.ListAPIView):
    serializer_class = AuditRunSerializer
    pagination_class = AuditRunCursorPagination

    def get_queryset(self):
        params = AuditFilterSerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        runs = AuditRun.objects.all()
        if "date" in params.validated_data:
            runs = runs.filter(date=params.validated_data["date"])
        if "status" in params.validated_data:
            runs = runs.filter(status=params.validated_data["status"])
        if params.validated_data["latest"]:
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
    queryset = AuditRun.objects.prefetch_related("windows", "input_gaps")


class EvidenceFilterSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=["lost", "unverified", "duplicate", "orphan", "pending"], required=False
    )
    exchange = serializers.CharField(required=False, allow_blank=True)
    consumer_group = serializers.CharField(required=False, allow_blank=True)
    message_id = serializers.CharField(required=False)
    window_start = serializers.DateTimeField(required=False)


@extend_schema(
    summary="The message ids behind a run's numbers",
    parameters=[
        OpenApiParameter(
            "kind", str, enum=["lost", "unverified", "duplicate", "orphan", "pending"]
        ),
        OpenApiParameter("exchange", str),
        OpenApiParameter("consumer_group", str),
        OpenApiParameter("message_id", str),
        OpenApiParameter("window_start", str, description="ISO 8601 hour of the window"),
    ],
)
class AuditEvidenceList(generics.ListAPIView):
    serializer_class = AuditEvidenceSerializer
    pagination_class = EvidenceCursorPagination

    def get_queryset(self):
        run = get_object_or_404(AuditRun, pk=self.kwargs["pk"])
        params = EvidenceFilterSerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        return run.evidence.filter(**params.validated_data)
