"""messages: list (filters, cursor pagination), detail, replay (target, edits), discard, restore."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from recovery.api.errors import django_error_detail, problem_response
from recovery.api.idempotency import idempotent
from recovery.api.params import MessageFilterParams, StrictCharField, validated
from recovery.api.permissions import requires
from recovery.api.schema import IDEMPOTENCY_KEY
from recovery.api.serializers import (
    MessageDetailSerializer,
    MessageSerializer,
    ReplayAttemptSerializer,
    ReplayRequestSerializer,
)
from recovery.errors import BrokerUnavailable, ReplayError, StateError
from recovery.export import export_lines, prepare_export
from recovery.masking.policy import log_body_view, view_of, with_unmask
from recovery.models import (
    Message,
    Privilege,
    ReplayAttempt,
    Role,
    Unmask,
    attach_died_again,
    scope_of,
    team_scoped,
)
from recovery.models.decoders import decode_message, readable
from recovery.replay import (
    discard_matching,
    discard_message,
    edit_and_replay,
    replay_message,
    restore_matching,
    restore_message,
)
from recovery.replay.curation import BY_FILTER_BUDGET_S
from recovery.search.filters import apply_filters, narrow_search

FILTER_PARAMETERS = [MessageFilterParams]


def filtered_messages(query_params, queryset=None, scope=None):
    """Messages matching the shared filters (recovery.search.filters.apply_filters).

    A substring search is narrowed through the trigram index first (``narrow_search``), so a
    rare term pages as fast as a common one instead of walking the whole store newest-first.
    """
    if queryset is None:
        queryset = Message.objects.defer("body", "headers", "properties")
    if scope is not None:
        queryset = scope.messages(queryset)
    data = validated(MessageFilterParams, query_params)
    unsearched = apply_filters(queryset, {**data, "q": ""}, scope)
    return narrow_search(apply_filters(queryset, data, scope), data, unsearched)


@extend_schema(parameters=FILTER_PARAMETERS, summary="List collected messages, newest first")
class MessageList(generics.ListAPIView):
    serializer_class = MessageSerializer
    team_scoped = True

    def get_queryset(self):
        return filtered_messages(self.request.query_params, scope=scope_of(self.request))

    def paginate_queryset(self, queryset):
        # Whether each replayed message died again: one query for the page, not one per row.
        page = super().paginate_queryset(queryset)
        return None if page is None else attach_died_again(page)


@extend_schema(summary="One message with its properties, headers and body")
class MessageDetail(generics.RetrieveAPIView):
    serializer_class = MessageDetailSerializer
    team_scoped = True

    def get_queryset(self):
        return with_unmask(scope_of(self.request).messages(), self.request.user)

    def retrieve(self, request, *args, **kwargs):
        message = self.get_object()
        view = view_of(scope_of(request), request.user, message)
        context = {**self.get_serializer_context(), "view": view}
        data = self.get_serializer_class()(message, context=context).data
        if view.bodies:
            log_body_view(
                request.user,
                message.pk,
                "api",
                "api_detail",
                not view.masked,
                team=scope_of(request).acting_team,
            )
        return Response(data)


BODY_FIELDS = (
    "id",
    "body",
    "content_type",
    "content_encoding",
    "vhost",
    "source_queue",
    "source_exchange",
    "properties",
)


class BodyParams(serializers.Serializer):
    decoded = serializers.BooleanField(required=False, default=False)


class DecodedBodySerializer(serializers.Serializer):
    chain = serializers.ListField(
        child=serializers.CharField(),
        help_text='The steps undone, outermost first: ["gzip", "json"].',
    )
    label = serializers.CharField(help_text='The chain as shown in the console: "gzip → json".')
    value = serializers.JSONField(
        allow_null=True, help_text="The document, where the last step maps to JSON."
    )
    text = serializers.CharField(
        allow_null=True, help_text="The readable form (pretty JSON, text)."
    )
    error = serializers.CharField(
        allow_null=True, help_text="Why the chain stopped early (the raw bytes are the default)."
    )
    truncated = serializers.BooleanField(
        help_text="A layer inflated past BODY_DECODE_LIMIT and was cut (value is then null)."
    )


@extend_schema(
    summary="A message's body: the raw bytes, or decoded",
    parameters=[BodyParams],
    description="Raw bytes by default. `decoded=true`: the decoded form (content_encoding "
    "gzip/deflate/zstd/base64, then JSON or MessagePack) as JSON with its chain; a body that "
    "does not decode says why in `error`, and a layer that inflates past BODY_DECODE_LIMIT is "
    "cut (`truncated`).",
    responses={
        (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, "The raw bytes."),
        (200, "application/json"): DecodedBodySerializer,
    },
)
@team_scoped
@api_view(["GET"])
def body(request, pk):
    message = get_object_or_404(
        with_unmask(scope_of(request).messages(Message.objects.only(*BODY_FIELDS)), request.user),
        pk=pk,
    )
    params = validated(BodyParams, request.query_params)
    view = view_of(scope_of(request), request.user, message)
    if not view.bodies:
        raise PermissionDenied("metadata only: the caller may not read bodies")
    how = "api_body_decoded" if params["decoded"] else "api_body"
    log_body_view(
        request.user, message.pk, "api", how, not view.masked, team=scope_of(request).acting_team
    )
    if not params["decoded"]:
        stored = readable(message) if view.masked else None
        response = HttpResponse(
            view.masker.stored(message.body_bytes, stored),
            content_type="application/octet-stream",
        )
        response["Content-Disposition"] = f'attachment; filename="message-{message.pk}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response
    result = view.masker.decoded(decode_message(message))
    return Response(
        DecodedBodySerializer(
            {
                "chain": result.chain,
                "label": result.label,
                "value": result.value,
                "text": result.text,
                "error": result.error,
                "truncated": result.truncated,
            }
        ).data
    )


# The engine names target/edit fields as the console form does; the API request names them so.
ENGINE_FIELDS = {
    "target_exchange": "exchange",
    "target_routing_key": "routing_key",
    "target_queue": "queue",
    "headers_json": "headers",
    "body": "body_text",
}


def as_request_fields(exc):
    """A Django ValidationError from the engine -> DRF's, naming this request's fields."""
    return ValidationError(
        {ENGINE_FIELDS.get(k, k): v for k, v in django_error_detail(exc).items()}
    )


@extend_schema(
    summary="Replay one message now",
    parameters=[IDEMPOTENCY_KEY],
    request=ReplayRequestSerializer,
    responses={200: ReplayAttemptSerializer, 409: None, 422: None, 503: None},
    description="Publish with publisher confirms and mandatory. Without a target it goes back "
    "to the queue it died in (dead letters) or to its original exchange and routing key. "
    "`headers` and `body_base64`/`body_text` edit what is sent (the stored original is kept "
    "and the edit is recorded). `delay_seconds` sends it through a delay queue first. "
    "200 with outcome `confirmed` means the broker acked it; `returned` means nothing was "
    "bound, and the message stays pending with the reason. 409: not replayable in its status "
    "(replaying, discarded, held by a job); 503: RabbitMQ unreachable, nothing was sent. "
    "An edit of a message that masking rules change for the caller is a 403 until they "
    "unmask it (POST messages/{id}/unmask): what they read had masks in it.",
)
@team_scoped
@api_view(["POST"])
@idempotent
def replay(request, pk):
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    body = ReplayRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    exchange, routing_key, queue = body.target()
    headers, new_body = body.edits()
    if headers is not None or new_body is not None:
        view = view_of(scope_of(request), request.user, message)
        if view.masked or not view.bodies:
            raise PermissionDenied(
                "an edit needs the unmasked view of this message: unmask it first"
            )
    target = {
        "exchange": exchange,
        "routing_key": routing_key,
        "queue": queue,
        "delay_seconds": body.validated_data.get("delay_seconds"),
    }
    # The caller's scope (a team token's is narrower than its user's): the engine checks the
    # target against it (recovery.replay.one.check_caller_may_send).
    target["scope"] = scope_of(request)
    try:
        if headers is None and new_body is None:
            attempt = replay_message(message, user=request.user, via="api", **target)
        else:
            attempt = edit_and_replay(
                message, request.user, headers_json=headers, body=new_body, via="api", **target
            )
    except StateError as exc:
        return problem_response(409, exc, "conflict", request)
    except BrokerUnavailable as exc:
        return problem_response(503, exc, "broker_unavailable", request)
    except ReplayError as exc:
        return problem_response(409, exc, "conflict", request)
    except DjangoValidationError as exc:
        raise as_request_fields(exc) from None
    attempt = ReplayAttempt.objects.select_related("message").get(pk=attempt.pk)
    return Response(ReplayAttemptSerializer(attempt).data)


class DiscardRequestSerializer(serializers.Serializer):
    reason = StrictCharField(
        required=False, allow_blank=True, max_length=1000, help_text="Why (kept in the activity)."
    )


@extend_schema(
    summary="Discard a message (soft; restore undoes it)",
    request=DiscardRequestSerializer,
    responses={200: MessageSerializer, 409: None},
    description="A discarded message is never replayed, not even by a job that selected it "
    "earlier; retention deletes it after RETENTION_DAYS. 409 if it is replaying, already "
    "discarded or held by a running job.",
)
@team_scoped
@api_view(["POST"])
def discard(request, pk):
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    body = DiscardRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    try:
        message = discard_message(
            message,
            request.user,
            via="api",
            reason=body.validated_data.get("reason", ""),
            team=scope_of(request).acting_team,
        )
    except StateError as exc:
        return problem_response(409, exc, "conflict", request)
    return Response(MessageSerializer(message).data)


class ByFilterRequestSerializer(serializers.Serializer):
    filters = MessageFilterParams(
        help_text="The message filters, as for GET /messages; at least one."
    )


class DiscardMatchingRequestSerializer(ByFilterRequestSerializer):
    reason = StrictCharField(
        required=False, allow_blank=True, max_length=1000, help_text="Why (kept in the activity)."
    )


REMAINING_HELP = (
    "Still matching: beyond this call's time budget, or held by a running replay. Call again "
    "while it is above 0 and the last call changed some."
)


class DiscardMatchingSerializer(serializers.Serializer):
    discarded = serializers.IntegerField(help_text="Discarded by this call.")
    remaining = serializers.IntegerField(help_text=REMAINING_HELP)


class RestoreMatchingSerializer(serializers.Serializer):
    restored = serializers.IntegerField(help_text="Restored by this call.")
    remaining = serializers.IntegerField(help_text=REMAINING_HELP)


BY_FILTER_STEPS = (
    f"oldest first, for up to {BY_FILTER_BUDGET_S:g} s per call; `remaining` says how many are "
    "left. A message a running job or replay holds is skipped (it stays in `remaining`). Each "
    "one is an activity row, as for one message. 400 without a filter."
)


@extend_schema(
    operation_id="v1_messages_discard_by_filter",
    summary="Discard every message matching a filter (soft; each one restorable)",
    request=DiscardMatchingRequestSerializer,
    responses={200: DiscardMatchingSerializer},
    description="Pending, poisoned and replayed messages matching `filters` are discarded, "
    + BY_FILTER_STEPS,
)
@team_scoped
@api_view(["POST"])
def discard_by_filter(request):
    body = DiscardMatchingRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    # A ValidationError (no filter) becomes a 400 in recovery.api.errors.exception_handler.
    discarded, remaining = discard_matching(
        request.user,
        body.validated_data["filters"],
        via="api",
        reason=body.validated_data.get("reason", ""),
        scope=scope_of(request),
    )
    return Response({"discarded": discarded, "remaining": remaining})


@extend_schema(
    operation_id="v1_messages_restore_by_filter",
    summary="Restore every discarded message matching a filter (undo a discard by filter)",
    request=ByFilterRequestSerializer,
    responses={200: RestoreMatchingSerializer},
    description="Discarded messages matching `filters` get back the status they had, "
    + BY_FILTER_STEPS,
)
@team_scoped
@api_view(["POST"])
def restore_by_filter(request):
    body = ByFilterRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    restored, remaining = restore_matching(
        request.user, body.validated_data["filters"], via="api", scope=scope_of(request)
    )
    return Response({"restored": restored, "remaining": remaining})


@extend_schema(
    summary="Restore a discarded message to the status it had",
    request=None,
    responses={200: MessageSerializer, 409: None},
)
@team_scoped
@api_view(["POST"])
def restore(request, pk):
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    try:
        message = restore_message(
            message, request.user, via="api", team=scope_of(request).acting_team
        )
    except StateError as exc:
        return problem_response(409, exc, "conflict", request)
    return Response(MessageSerializer(message).data)


@extend_schema(
    summary="Export the messages a filter matches, as JSON Lines (masked)",
    parameters=FILTER_PARAMETERS,
    description="One JSON object per line: the message's fields, headers (masked) and "
    "`body_base64` (masked; null with `body_withheld` for a caller who sees metadata only). "
    "Needs the export privilege; logged (an `export` activity row and a `body_view` row per "
    "body). More than EXPORT_MAX_MESSAGES matches is a 400: narrow the filter.",
    responses={(200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.STR, "JSON Lines.")},
)
@team_scoped
@api_view(["GET"])
def export(request):
    data = validated(MessageFilterParams, request.query_params)
    try:
        ids, readable = prepare_export(scope_of(request), request.user, data, "api")
    except DjangoValidationError as exc:
        return problem_response(400, " ".join(exc.messages), "too_many", request)
    response = StreamingHttpResponse(
        export_lines(ids, readable), content_type="application/x-ndjson"
    )
    response["Content-Disposition"] = 'attachment; filename="lazarus-export.jsonl"'
    return response


class UnmaskRequestSerializer(serializers.Serializer):
    reason = StrictCharField(
        max_length=500, help_text="Why the unmasked content is needed (kept in the activity)."
    )


class UnmaskSerializer(serializers.Serializer):
    message = serializers.IntegerField()
    reason = serializers.CharField()
    expires_at = serializers.DateTimeField(
        help_text="Until then GET messages/{id} and its body answer this caller unmasked."
    )


@extend_schema(
    summary="Break-glass: read one message unmasked for a while, with a reason",
    request=UnmaskRequestSerializer,
    responses={200: UnmaskSerializer},
    description="Needs the unmask privilege. For UNMASK_SECONDS the message and its body "
    "answer this caller without masking; logged (an `unmask` activity row: who, which, why).",
)
@team_scoped
@api_view(["POST"])
@permission_classes([requires(Role.VIEWER)])  # a privilege, not a role, decides
def unmask(request, pk):
    message = get_object_or_404(scope_of(request).messages(), pk=pk)
    if not scope_of(request).may(Privilege.UNMASK, message):
        raise PermissionDenied("unmasking needs the unmask privilege")
    body = UnmaskRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    try:
        granted = Unmask.grant(
            request.user,
            message,
            body.validated_data["reason"],
            via="api",
            team=scope_of(request).acting_team,
        )
    except DjangoValidationError as exc:
        raise as_request_fields(exc) from None
    return Response(
        UnmaskSerializer(
            {"message": message.pk, "reason": granted.reason, "expires_at": granted.expires_at}
        ).data
    )
