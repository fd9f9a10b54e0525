"""replay-jobs: bulk replay by filter, ids or failure group — create, preview, list, watch, cancel,
resume. The engine (``recovery.replay.jobs``, ``recovery.replay.runner``) does the work; this module
validates the request, calls it and describes it.
"""

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.errors import problem_response
from recovery.api.idempotency import idempotent
from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import (
    MessageFilterParams,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerChoiceField,
    StrictIntegerField,
    validated,
)
from recovery.api.permissions import requires
from recovery.api.schema import IDEMPOTENCY_KEY
from recovery.errors import StateError
from recovery.models import ReplayJob, Role, scope_of, team_scoped
from recovery.replay import jobs
from recovery.replay import options as job_options
from recovery.replay.safety import job_breaker

# Named for SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"].
ReplayJobState = ReplayJob.State


def option_field(option, **kwargs):
    """The request field of a numeric job option (recovery.replay.options): its limits, its
    schema, its help."""
    field_class = StrictIntegerField if option.whole else StrictFloatField
    if option.help_text:
        kwargs["help_text"] = option.help_text
    if option.above_minimum:
        # Validators cannot tell drf-spectacular that the minimum is exclusive: say it.
        schema = {
            "type": "integer" if option.whole else "number",
            **({} if option.whole else {"format": "double"}),
            "minimum": option.minimum,
            "exclusiveMinimum": True,
            "maximum": option.maximum,
        }
        field_class = extend_schema_field(schema)(type(field_class.__name__, (field_class,), {}))
        return field_class(
            required=False,
            max_value=option.maximum,
            validators=option.validators()[:1],
            **kwargs,
        )
    return field_class(required=False, min_value=option.minimum, max_value=option.maximum, **kwargs)


class JobRequestSerializer(serializers.Serializer):
    """Which messages (at least one of filters, message_ids, group_key), where, how fast/safely."""

    filters = MessageFilterParams(
        required=False, help_text="The message filters, as for GET /messages."
    )
    message_ids = serializers.ListField(
        child=StrictIntegerField(
            min_value=job_options.MIN_MESSAGE_ID, max_value=job_options.MAX_MESSAGE_ID
        ),
        required=False,
        min_length=1,
        max_length=job_options.MAX_MESSAGE_IDS,
    )
    group_key = StrictCharField(required=False, max_length=64, help_text="A failure group.")
    target_queue = StrictCharField(
        required=False, max_length=255, help_text="Publish to this queue (default exchange)."
    )
    target_exchange = StrictCharField(required=False, allow_blank=True, max_length=255)
    target_routing_key = StrictCharField(required=False, allow_blank=True, max_length=255)
    delay_seconds = StrictIntegerChoiceField(
        choices=settings.REPLAY_DELAYS,
        required=False,
        help_text="Delayed retry through a TTL queue (one of the setting REPLAY_DELAYS).",
    )
    rate = option_field(job_options.RATE)
    include_poisoned = StrictBooleanField(required=False, default=False)
    canary_size = option_field(job_options.CANARY_SIZE, default=0)
    canary_pause_seconds = option_field(job_options.CANARY_PAUSE_SECONDS, default=0)
    canary_max_failure_pct = option_field(job_options.CANARY_MAX_FAILURE_PCT)
    breaker_threshold_pct = option_field(job_options.BREAKER_THRESHOLD_PCT)

    def validate_message_ids(self, value):
        return job_options.parse_message_ids(value)  # without repeats, as the engine keeps them

    def engine_arguments(self):
        """Keyword arguments of recovery.replay.jobs.create_job / dry_run."""
        data = dict(self.validated_data)
        if "filters" in data:
            data["filters"] = {
                name: value.isoformat() if hasattr(value, "isoformat") else value
                for name, value in data["filters"].items()
            }
        return data


class ProgressSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=ReplayJob.State.choices)
    reason = serializers.CharField()
    total = serializers.IntegerField(help_text="Messages the job covers.")
    sent = serializers.IntegerField(help_text="Published, including those awaiting a confirm.")
    confirmed = serializers.IntegerField()
    returned = serializers.IntegerField(help_text="Nothing was bound; left pending.")
    failed = serializers.IntegerField()
    skipped = serializers.IntegerField(help_text="Changed since the job was made; not sent.")
    in_flight = serializers.IntegerField()
    remaining = serializers.IntegerField()
    dead_again = serializers.IntegerField(help_text="Replayed, then dead-lettered again.")
    percent = serializers.FloatField()


class BreakerSerializer(serializers.Serializer):
    """The circuit breaker as it stands (recovery.replay.safety.breaker_state)."""

    phase = serializers.ChoiceField(
        choices=["off", "judging", "watching", "tripped"],
        help_text="judging: fewer than min_sample replays since the start or the last resume "
        "(it trips then only once the verdict is certain: trips_early_at came back); watching: "
        "the share is judged at every check; tripped: the share reached the threshold.",
    )
    threshold_pct = serializers.FloatField(allow_null=True, help_text="null: the breaker is off.")
    min_sample = serializers.IntegerField(help_text="Replays it waits for before judging.")
    replayed = serializers.IntegerField(help_text="Confirmed since the start or last resume.")
    came_back = serializers.IntegerField(help_text="Of those, dead-lettered again.")
    share_pct = serializers.FloatField(allow_null=True, help_text="null: nothing replayed yet.")
    trips_early_at = serializers.IntegerField(
        allow_null=True,
        help_text="This many came back before min_sample replays pauses the job (the share "
        "of the sample can no longer stay below the threshold); null: the breaker is off.",
    )
    reason = serializers.CharField(allow_null=True, help_text="Why it trips, once it does.")
    summary = serializers.CharField(
        help_text='In words: "circuit breaker: judging after 20 replays; …".'
    )


class ReplayJobSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.get_username", allow_null=True)
    message_count = serializers.SerializerMethodField()
    target = serializers.SerializerMethodField()
    progress = ProgressSerializer()
    breaker = serializers.SerializerMethodField()

    class Meta:
        model = ReplayJob
        fields = [
            "id",
            "state",
            "state_reason",
            "progress",
            "created_by",
            "via",
            "created_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "filters",
            "message_count",
            "group_key",
            "target",
            "target_exchange",
            "target_routing_key",
            "target_queue",
            "delay_seconds",
            "rate",
            "include_poisoned",
            "canary_size",
            "canary_pause_seconds",
            "canary_max_failure_pct",
            "canary_passed_at",
            "breaker_threshold_pct",
            "breaker",
        ]
        read_only_fields = fields

    @extend_schema_field(BreakerSerializer)
    def get_breaker(self, job):
        return BreakerSerializer(job_breaker(job, settings.REPLAY_BREAKER_MIN_SAMPLE)).data

    def get_message_count(self, job) -> int:
        """How many ids the job was given (0 when it selects by filter or group)."""
        return len(job.message_ids or [])

    def get_target(self, job) -> str:
        return jobs.describe_target(job)


class DiedAgainSerializer(serializers.Serializer):
    count = serializers.IntegerField(
        help_text="Of the job's confirmed replays, how many were dead-lettered again and "
        "collected; counted as long as copies arrive, after the job ended too (unlike "
        "`progress.dead_again`, the breaker's count while it runs)."
    )
    copies = serializers.ListField(
        child=serializers.IntegerField(), help_text="Ids of the newest 20 new copies."
    )


class ReplayJobDetailSerializer(ReplayJobSerializer):
    message_ids = serializers.ListField(child=serializers.IntegerField(), read_only=True)
    died_again = serializers.SerializerMethodField()

    class Meta(ReplayJobSerializer.Meta):
        fields = [*ReplayJobSerializer.Meta.fields, "message_ids", "died_again"]
        read_only_fields = fields

    @extend_schema_field(DiedAgainSerializer)
    def get_died_again(self, job):
        # Only the copies the caller may see: a copy may die in another team's queue.
        count, copies = job.died_again(scope=self.context.get("scope"))
        return {"count": count, "copies": [copy.pk for copy in copies]}


class JobFilterParams(serializers.Serializer):
    state = serializers.ChoiceField(choices=ReplayJob.State.choices, required=False)


class NewestJobCursorPagination(StrictCursorPagination):
    ordering = ("-created_at", "-id")


class ReplayJobs(generics.ListAPIView):
    serializer_class = ReplayJobSerializer
    pagination_class = NewestJobCursorPagination
    team_scoped = True

    def get_queryset(self):
        params = validated(JobFilterParams, self.request.query_params)
        in_scope = scope_of(self.request).jobs(ReplayJob.objects.select_related("created_by"))
        return in_scope.filter(**params)

    @extend_schema(summary="Replay jobs, newest first", parameters=[JobFilterParams])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Start a bulk replay job",
        parameters=[IDEMPOTENCY_KEY],
        request=JobRequestSerializer,
        responses={201: ReplayJobDetailSerializer, 409: None, 422: None},
        description="Select messages by `filters`, `message_ids` and/or `group_key` (at least "
        "one; only `pending` ones, plus `poisoned` with `include_poisoned`, plus `replayed` "
        "when named by id or by `status=replayed`). Only messages collected before the job was "
        "made are in it. The job starts at once on a worker; watch it with GET "
        "/replay-jobs/{id} (`progress`). 400 names the field, `non_field_errors` when nothing "
        "is selected or nothing matches. Send an Idempotency-Key: a retry then never starts a "
        "second job.",
    )
    def post(self, request, *args, **kwargs):
        return create(request)


@idempotent
def create(request):
    body = JobRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    job = jobs.create_job(
        request.user, via="api", scope=scope_of(request), **body.engine_arguments()
    )
    job = ReplayJob.objects.select_related("created_by").get(pk=job.pk)
    return Response(
        ReplayJobDetailSerializer(job, context={"scope": scope_of(request)}).data,
        status=status.HTTP_201_CREATED,
        headers={"Location": f"/api/v1/replay-jobs/{job.pk}"},
    )


class TargetCountSerializer(serializers.Serializer):
    vhost = serializers.CharField()
    exchange = serializers.CharField(help_text="Where the messages arrive ('' = default).")
    routing_key = serializers.CharField()
    via = serializers.CharField(help_text="Delay exchange they wait in first ('' = none).")
    count = serializers.IntegerField()


class DryRunSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    targets = TargetCountSerializer(many=True)


@extend_schema(
    summary="Preview a job: how many messages would go where (sends nothing)",
    request=JobRequestSerializer,
    responses=DryRunSerializer,
)
@team_scoped
@api_view(["POST"])
@permission_classes([requires(Role.VIEWER)])  # the console previews for viewers too
def dry_run(request):
    body = JobRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    targets = jobs.dry_run(scope_of(request), **body.engine_arguments())
    return Response(
        DryRunSerializer({"total": sum(t["count"] for t in targets), "targets": targets}).data
    )


@extend_schema(summary="One job with its progress", responses=ReplayJobDetailSerializer)
@team_scoped
@api_view(["GET"])
def replay_job(request, pk):
    jobs_in_scope = scope_of(request).jobs(ReplayJob.objects.select_related("created_by"))
    job = get_object_or_404(jobs_in_scope, pk=pk)
    return Response(ReplayJobDetailSerializer(job, context={"scope": scope_of(request)}).data)


@extend_schema(
    summary="Cancel a job for good",
    request=None,
    responses={200: ReplayJobDetailSerializer, 409: None},
    description="Messages not sent yet stay as they are. What is in flight is confirmed and "
    "recorded first. 409 if the job already ended.",
)
@team_scoped
@api_view(["POST"])
def cancel(request, pk):
    return _transition(request, pk, "cancel")


@extend_schema(
    summary="Resume a paused job (canary or circuit-breaker pause)",
    parameters=[IDEMPOTENCY_KEY],
    request=None,
    responses={200: ReplayJobDetailSerializer, 409: None, 422: None},
    description="After a canary pause, resuming accepts the canary; after a breaker pause the "
    "breaker counts afresh. 409 unless the job is paused.",
)
@team_scoped
@api_view(["POST"])
@idempotent
def resume(request, pk):
    return _transition(request, pk, "resume")


def _transition(request, pk, method):
    job = get_object_or_404(scope_of(request).jobs(ReplayJob.objects.all(), Role.OPERATOR), pk=pk)
    try:
        if method == "resume":  # looks at the creator's rights again
            jobs.resume_job(job, request.user, via="api", team=scope_of(request).acting_team)
        else:
            getattr(job, method)(request.user, via="api", team=scope_of(request).acting_team)
    except StateError as exc:
        return problem_response(409, exc, "conflict", request)
    job = ReplayJob.objects.select_related("created_by").get(pk=pk)
    return Response(ReplayJobDetailSerializer(job, context={"scope": scope_of(request)}).data)
