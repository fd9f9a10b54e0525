"""messages: list (filters, cursor pagination), detail, replay (target, edits), discard, restore."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from recovery.api.errors import problem_response
from recovery.api.idempotency import idempotent
from recovery.api.schema import IDEMPOTENCY_KEY
from recovery.api.serializers import (
    MessageDetailSerializer,
    MessageSerializer,
    ReplayAttemptSerializer,
    ReplayRequestSerializer,
)
from recovery.filters import MessageFilterForm
from recovery.models import Kind, Message, Reason, ReplayAttempt, Status
from recovery.replay import ReplayError, replay_message


def _enum(enum):
    return [choice.value for choice in enum]


FILTER_PARAMETERS = [
    OpenApiParameter("kind", str, enum=_enum(Kind), description="how it was lost"),
    OpenApiParameter("queue", str, description="queue the message died in"),
    OpenApiParameter("exchange", str, description="exchange it was published to"),
    OpenApiParameter("reason", str, enum=_enum(Reason)),
    OpenApiParameter("status", str, enum=_enum(Status)),
    OpenApiParameter("vhost", str, description="virtual host"),
    OpenApiParameter("group", str, description="failure-group key (see `groups`)"),
    OpenApiParameter("since", str, description="collected at or after (ISO 8601 date-time)"),
    OpenApiParameter("until", str, description="collected before (ISO 8601 date-time)"),
    OpenApiParameter("q", str, description="search: message_id, correlation_id, group key, …"),
]


def filter_form(params):
    """The shared MessageFilterForm, bound and validated (400 naming the field otherwise)."""
    form = MessageFilterForm(params)
    if not form.is_valid():
        raise ValidationError(form.errors)
    return form


def filtered_messages(params):
    return filter_form(params).apply(Message.objects.defer("body", "headers", "properties"))


@extend_schema(parameters=FILTER_PARAMETERS, summary="List collected messages, newest first")
class MessageList(generics.ListAPIView):
    serializer_class = MessageSerializer

    def get_queryset(self):
        return filtered_messages(self.request.query_params)


@extend_schema(summary="One message with its properties, headers and body")
class MessageDetail(generics.RetrieveAPIView):
    serializer_class = MessageDetailSerializer
    queryset = Message.objects.all()


@extend_schema(
    summary="Replay one message now",
    parameters=[IDEMPOTENCY_KEY],
    request=ReplayRequestSerializer,
    responses={200: ReplayAttemptSerializer, 409: None, 422: None, 503: None},
    description="Publish with publisher confirms and mandatory. Without a target it goes back "
    "to the queue it died in (dead letters) or to its original exchange and routing key. "
    "`headers` and `body_base64`/`body_text` edit what is sent (the stored original is kept). "
    "200 with outcome `confirmed` means the broker acked it; `returned` means nothing was "
    "bound, and the message stays pending with the reason. 409: not replayable in its status "
    "(or another replay holds it); 503: RabbitMQ unreachable, nothing was sent.",
)
@api_view(["POST"])
@idempotent
def replay(request, pk):
    message = get_object_or_404(Message, pk=pk)
    body = ReplayRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    exchange, routing_key = body.target()
    headers, new_body = body.edits()
    try:
        attempt = replay_message(
            message,
            user=request.user,
            exchange=exchange,
            routing_key=routing_key,
            via="api",
            headers=headers,
            body=new_body,
        )
    except ReplayError as exc:
        if "broker" in str(exc):
            return problem_response(503, exc, "broker_unavailable", request)
        return problem_response(409, exc, "not_replayable", request)
    attempt = ReplayAttempt.objects.select_related("message").get(pk=attempt.pk)
    return Response(ReplayAttemptSerializer(attempt).data)


class DiscardRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=1000, help_text="Why (kept in the activity)."
    )
