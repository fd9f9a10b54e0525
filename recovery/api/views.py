from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from recovery.api.serializers import (
    MessageDetailSerializer,
    MessageSerializer,
    ReplayAttemptSerializer,
    ReplayRequestSerializer,
)
from recovery.filters import MessageFilterForm
from recovery.models import Message, ReplayAttempt
from recovery.replay import ReplayError, replay_message

FILTER_PARAMETERS = [
    OpenApiParameter(name, str, description=desc)
    for name, desc in [
        ("kind", "dead_letter | unroutable | returned | nacked | unconfirmed"),
        ("queue", "queue the message died in"),
        ("exchange", "exchange it was published to"),
        ("reason", "rejected | expired | maxlen | delivery_limit | no_route | nack | timeout"),
        ("status", "pending | replaying | replayed | discarded | poisoned"),
        ("vhost", "virtual host"),
        ("group", "failure-group key"),
        ("since", "collected at or after (ISO 8601)"),
        ("until", "collected before (ISO 8601)"),
        ("q", "message_id, correlation_id or group key"),
    ]
]


def filtered_messages(params):
    form = MessageFilterForm(params)
    if not form.is_valid():
        raise ValidationError(form.errors)
    return form.apply(Message.objects.defer("body", "headers", "properties"))


@extend_schema(parameters=FILTER_PARAMETERS)
class MessageList(generics.ListAPIView):
    serializer_class = MessageSerializer

    def get_queryset(self):
        return filtered_messages(self.request.query_params)


class MessageDetail(generics.RetrieveAPIView):
    serializer_class = MessageDetailSerializer
    queryset = Message.objects.all()


@extend_schema(
    request=ReplayRequestSerializer,
    responses={200: ReplayAttemptSerializer, 409: None, 503: None},
    description="Replay one message now, with publisher confirms and mandatory. Without a "
    "target it goes back to the queue it died in (dead letters) or its original exchange and "
    "routing key. 200 with outcome `confirmed` means the broker acked it; `returned` means "
    "nothing was bound and the message stays pending.",
)
@api_view(["POST"])
def replay(request, pk):
    message = get_object_or_404(Message, pk=pk)
    body = ReplayRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    exchange, routing_key = body.target()
    try:
        attempt = replay_message(
            message, user=request.user, exchange=exchange, routing_key=routing_key, via="api"
        )
    except ReplayError as exc:
        code = status.HTTP_503_SERVICE_UNAVAILABLE if "broker" in str(exc) else 409
        return Response({"detail": str(exc)}, status=code)
    attempt = ReplayAttempt.objects.select_related("message").get(pk=attempt.pk)
    return Response(ReplayAttemptSerializer(attempt).data)
