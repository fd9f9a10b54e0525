"""groups: failure groups (messages that failed the same way) and stats (counts, collector lag)."""

import datetime

from django.core.exceptions import FullResultSet
from django.db import connection
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import Coalesce
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from recovery.api.messages import FILTER_PARAMETERS
from recovery.api.pagination import RowsCursorPagination
from recovery.api.params import MessageFilterParams, validated
from recovery.collector.health import collector_health
from recovery.models import Kind, Message, MessageCount, Status
from recovery.search.filters import apply_filters, narrow_search


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


# A group's newest (or oldest) message matching the filters, first looked for in the hour the
# rollup says it is in, then (the rollup's hour is only a bound: a message deleted since) in
# the whole group. UNION ALL under LIMIT 1 runs the second probe only if the first finds none.
_PROBE = """
    (SELECT collected_at, group_label FROM recovery_message
     WHERE group_key = g.group_key AND collected_at >= g.{hour}
           AND collected_at < g.{hour} + interval '1 hour' AND ({where})
     ORDER BY collected_at {order}, id {order} LIMIT 1)
    UNION ALL
    (SELECT collected_at, group_label FROM recovery_message
     WHERE group_key = g.group_key AND ({where})
     ORDER BY collected_at {order}, id {order} LIMIT 1)
    LIMIT 1
"""

ROLLUP_GROUPS_SQL = f"""
WITH by_hour AS ({{by_hour}}), g AS (
    SELECT group_key, sum(total) AS count, sum(pending) AS pending, min(hour) AS first_hour,
           max(hour) AS last_hour, max(any_queue) AS queue, max(any_exchange) AS exchange,
           max(any_reason) AS reason, max(any_kind) AS kind
    FROM by_hour GROUP BY group_key
)
SELECT g.group_key, newest.group_label, g.queue, g.exchange, g.reason, g.kind, g.count,
       g.pending, oldest.collected_at, newest.collected_at
FROM g
CROSS JOIN LATERAL ({_PROBE.format(hour="last_hour", order="DESC", where="{where}")}) newest
CROSS JOIN LATERAL ({_PROBE.format(hour="first_hour", order="ASC", where="{where}")}) oldest
"""
GROUP_FIELDS = (
    "group_key",
    "label",
    "queue",
    "exchange",
    "reason",
    "kind",
    "count",
    "pending",
    "first_seen",
    "last_seen",
)


def rollup_groups(filters):
    """Every group's row for these filters, from the rollup (counts, and the hours its newest
    and oldest matching messages are in) and two index probes per group (their exact times, and
    the label); None when only the messages can answer (``rollup_rows``).

    A GROUP BY over the messages reads all of them on every page (0.75-0.9 s at a million);
    this reads the rollup and a few rows per group (p95 79 ms through the API, bench/ui.py), in
    one statement, so the counts and the probes see the same snapshot.
    """
    rollup = rollup_rows(filters)
    if rollup is None:
        return None
    by_hour = (
        rollup.values("group_key", "hour")
        .annotate(
            total=Sum("n"),
            pending=Sum("n", filter=Q(status=Status.PENDING), default=0),
            any_queue=Max("source_queue"),
            any_exchange=Max("source_exchange"),
            any_reason=Max("reason"),
            any_kind=Max("kind"),
        )
        .filter(total__gt=0)
    )
    by_hour_sql, by_hour_params = by_hour.query.sql_with_params()
    matching = apply_filters(Message.objects.all(), filters).query
    try:
        where_sql, where_params = matching.get_compiler(connection=connection).compile(
            matching.where
        )
    except FullResultSet:  # no filter
        where_sql, where_params = "true", ()
    sql = ROLLUP_GROUPS_SQL.format(by_hour=by_hour_sql, where=where_sql)
    with connection.cursor() as cur:
        cur.execute(sql, [*by_hour_params, *(list(where_params) * 4)])
        return [dict(zip(GROUP_FIELDS, row, strict=True)) for row in cur.fetchall()]


def message_groups(filters):
    """Every group's row, aggregated over the matching messages (a search, or since/until
    inside an hour: what the rollup cannot answer exactly)."""
    # The key hashes queue, reason and exception, so MAX() of each is the group's value.
    return list(
        narrow_search(apply_filters(Message.objects.all(), filters), filters)
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


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _recently_seen_first(group):
    """Sort key: most recently seen first, then by key (integers and strings: a cursor)."""
    last_seen = group["last_seen"]
    micros = (last_seen - EPOCH) // datetime.timedelta(microseconds=1)
    return (-micros, group["group_key"])


@extend_schema(
    parameters=FILTER_PARAMETERS,
    summary="Failure groups, most recently seen first",
    description="Messages grouped by failure group (queue, reason, exception). The message "
    "filters narrow what is counted, e.g. `status=pending` for what is left to recover.",
)
class GroupList(generics.ListAPIView):
    serializer_class = GroupSerializer
    pagination_class = RowsCursorPagination

    def list(self, request, *args, **kwargs):
        filters = validated(MessageFilterParams, request.query_params)
        groups = rollup_groups(filters)
        if groups is None:
            groups = message_groups(filters)
        page = self.paginator.paginate_rows(groups, _recently_seen_first, request)
        return self.paginator.get_paginated_response(self.get_serializer(page, many=True).data)
