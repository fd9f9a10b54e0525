"""groups: failure groups (messages that failed the same way) and stats (counts, collector lag)."""

from django.db.models import Count, Max, Min, Q
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from recovery.api.messages import FILTER_PARAMETERS, filtered_messages
from recovery.api.pagination import StrictCursorPagination
from recovery.collector_health import collector_health
from recovery.models import Kind, Message, Status


class GroupSerializer(serializers.Serializer):
    key = serializers.CharField(source="group_key", help_text="Filter messages with `group=`.")
    label = serializers.CharField(help_text="queue · reason · exception type · message")
    queue = serializers.CharField(help_text="Queue the messages died in ('' if unroutable).")
    exchange = serializers.CharField()
    reason = serializers.CharField()
    kind = serializers.CharField()
    count = serializers.IntegerField(help_text="Messages in the group matching the filters.")
    pending = serializers.IntegerField(help_text="Of which still pending.")
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()


class RecentlySeenCursorPagination(StrictCursorPagination):
    ordering = ("-last_seen", "group_key")


@extend_schema(
    parameters=FILTER_PARAMETERS,
    summary="Failure groups, most recently seen first",
    description="Messages grouped by failure group (queue, reason, exception). The message "
    "filters narrow what is counted, e.g. `status=pending` for what is left to recover.",
)
class GroupList(generics.ListAPIView):
    serializer_class = GroupSerializer
    pagination_class = RecentlySeenCursorPagination

    def get_queryset(self):
        # The key hashes queue, reason and exception, so MAX() of each is the group's value.
        return (
            filtered_messages(self.request.query_params)
            .order_by()
            .values("group_key")
            .annotate(
                label=Max("group_label"),
                queue=Max("source_queue"),
                exchange=Max("source_exchange"),
                reason=Max("reason"),
                kind=Max("kind"),
                count=Count("id"),
                pending=Count("id", filter=Q(status=Status.PENDING)),
                first_seen=Min("collected_at"),
                last_seen=Max("collected_at"),
            )
        )


class QueueCountSerializer(serializers.Serializer):
    queue = serializers.CharField()
    count = serializers.IntegerField()
    pending = serializers.IntegerField()


class CollectorThreadSerializer(serializers.Serializer):
    worker = serializers.CharField()
    vhost = serializers.CharField()
    queue = serializers.CharField()
    collected = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    quarantined = serializers.IntegerField()
    errors = serializers.IntegerField()
    last_error = serializers.CharField()
    seen = serializers.DateTimeField()


class BrokerStatusSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(required=False)


class CollectorStatusSerializer(serializers.Serializer):
    broker = BrokerStatusSerializer()
    running = serializers.BooleanField(help_text="A collector thread reported in the last 30 s.")
    lag = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField(allow_null=True)),
        help_text="{vhost: {recovery queue: messages waiting to be collected}}; null if the "
        "queue does not exist (not wired).",
    )
    threads = CollectorThreadSerializer(many=True)


class StatsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    by_kind = serializers.DictField(child=serializers.IntegerField())
    by_status = serializers.DictField(child=serializers.IntegerField())
    by_queue = QueueCountSerializer(many=True, help_text="The 50 queues with most messages.")
    oldest_pending_at = serializers.DateTimeField(allow_null=True)
    collector = CollectorStatusSerializer()


TOP_QUEUES = 50


@extend_schema(
    parameters=FILTER_PARAMETERS,
    responses=StatsSerializer,
    summary="Counts by kind, status and queue, and the collector's lag",
)
@api_view(["GET"])
def stats(request):
    messages = filtered_messages(request.query_params, Message.objects.order_by())
    by_kind = dict.fromkeys(Kind.values, 0)
    by_kind.update(messages.values_list("kind").annotate(n=Count("id")))
    by_status = dict.fromkeys(Status.values, 0)
    by_status.update(messages.values_list("status").annotate(n=Count("id")))
    by_queue = (
        messages.values("source_queue")
        .annotate(count=Count("id"), pending=Count("id", filter=Q(status=Status.PENDING)))
        .order_by("-count", "source_queue")[:TOP_QUEUES]
    )
    oldest = messages.filter(status=Status.PENDING).aggregate(at=Min("collected_at"))["at"]
    data = {
        "total": sum(by_status.values()),
        "by_kind": by_kind,
        "by_status": by_status,
        "by_queue": [
            {"queue": row["source_queue"], "count": row["count"], "pending": row["pending"]}
            for row in by_queue
        ],
        "oldest_pending_at": oldest,
        "collector": collector_health(),
    }
    return Response(StatsSerializer(data).data)
