"""groups: failure groups (messages that failed the same way) and stats (counts, collector lag)."""

import datetime

from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import Coalesce
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from recovery.api.messages import FILTER_PARAMETERS, filtered_messages
from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import MessageFilterParams, validated
from recovery.collector_health import collector_health
from recovery.filters import apply_filters
from recovery.models import Kind, Message, MessageCount, Status


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
# Filters the trigger-kept rollup (MessageCount) can answer, and its column for each.
ROLLUP_COLUMNS = {
    "kind": "kind",
    "queue": "source_queue",
    "exchange": "source_exchange",
    "reason": "reason",
    "status": "status",
    "vhost": "vhost",
    "group": "group_key",
}


def _on_the_hour(moment):
    utc = moment.astimezone(datetime.UTC)
    return utc == utc.replace(minute=0, second=0, microsecond=0)


def rollup_rows(filters):
    """MessageCount rows for these filters, or None when only the messages can answer exactly
    (a search, or since/until inside an hour). The rollup makes stats constant-time in the
    size of the store; it is exact because triggers keep it in the writers' transactions."""
    if filters.get("q") or not all(
        _on_the_hour(filters[name]) for name in ("since", "until") if filters.get(name)
    ):
        return None
    rows = MessageCount.objects.order_by()
    if filters.get("since"):
        rows = rows.filter(hour__gte=filters["since"])
    if filters.get("until"):
        rows = rows.filter(hour__lt=filters["until"])
    for name, column in ROLLUP_COLUMNS.items():
        if filters.get(name):
            rows = rows.filter(**{column: filters[name]})
    return rows


def count_by(filters):
    """(by kind, by status, top queues) from the rollup, or from the messages when it cannot."""
    rows = rollup_rows(filters)
    if rows is not None:
        aggregate, column = Sum, "n"
    else:
        rows, aggregate, column = apply_filters(Message.objects.order_by(), filters), Count, "id"
    total = aggregate(column)
    pending = Coalesce(aggregate(column, filter=Q(status=Status.PENDING)), 0)
    queue = "source_queue"
    by_kind = dict.fromkeys(Kind.values, 0)
    by_kind.update((k, n) for k, n in rows.values_list("kind").annotate(n=total) if n)
    by_status = dict.fromkeys(Status.values, 0)
    by_status.update((k, n) for k, n in rows.values_list("status").annotate(n=total) if n)
    by_queue = (
        rows.values(queue)
        .annotate(count=total, pending=pending)
        .filter(count__gt=0)
        .order_by("-count", queue)[:TOP_QUEUES]
    )
    queues = [{"queue": r[queue], "count": r["count"], "pending": r["pending"]} for r in by_queue]
    return by_kind, by_status, queues


@extend_schema(
    parameters=FILTER_PARAMETERS,
    responses=StatsSerializer,
    summary="Counts by kind, status and queue, and the collector's lag",
)
@api_view(["GET"])
def stats(request):
    filters = validated(MessageFilterParams, request.query_params)
    by_kind, by_status, by_queue = count_by(filters)
    oldest = (
        apply_filters(Message.objects.filter(status=Status.PENDING), filters)
        .order_by("collected_at")
        .values_list("collected_at", flat=True)
        .first()
    )
    data = {
        "total": sum(by_status.values()),
        "by_kind": by_kind,
        "by_status": by_status,
        "by_queue": by_queue,
        "oldest_pending_at": oldest,
        "collector": collector_health(),
    }
    return Response(StatsSerializer(data).data)
