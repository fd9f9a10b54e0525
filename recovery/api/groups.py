"""groups: failure groups (messages that failed the same way) and stats (counts, collector lag)."""

import datetime

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from recovery.api.messages import FILTER_PARAMETERS
from recovery.api.pagination import RowsCursorPagination
from recovery.api.params import MessageFilterParams, validated
from recovery.collector.health import collector_health, without_error_text
from recovery.masking.policy import privacy_of
from recovery.models import Message, Status, scope_of, team_scoped
from recovery.models.masking import MaskingRules
from recovery.search.details import group_details
from recovery.search.filters import apply_filters
from recovery.search.groups import (
    attach_labels,
    count_by,
    kept_groups,
    kept_times_answer,
    message_groups,
    rollup_groups,
)


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


@extend_schema(
    parameters=FILTER_PARAMETERS,
    responses=StatsSerializer,
    summary="Counts by kind, status and queue, and the collector's lag",
)
@team_scoped
@api_view(["GET"])
def stats(request):
    filters = validated(MessageFilterParams, request.query_params)
    scope = scope_of(request)
    by_kind, by_status, by_queue = count_by(filters, scope)
    oldest = (
        apply_filters(scope.messages(Message.objects.filter(status=Status.PENDING)), filters, scope)
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
        "collector": collector_health()
        if scope.is_global
        else without_error_text(collector_health()),
    }
    return Response(StatsSerializer(data).data)


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def masked_labels(page, scope):
    """A page's labels as the caller may see them (docs/security.md, "Private data"): a label is
    made from exception headers, so it is masked as the newest message's headers are; a group
    without a message left in the caller's scope gets every rule's regular expressions."""
    rules = MaskingRules.load()
    if not rules or not page:
        return page
    keys = [group["group_key"] for group in page]
    details = group_details(keys, scope.where_sql(), privacy_of(scope, rules))
    for group in page:
        detail = details.get(group["group_key"])
        group["label"] = (
            detail["label"] if detail else rules.team_masker(None).free_text(group["label"])
        )
    return page


def _recently_seen_first(group):
    """Sort key: most recently seen first, then by key (integers and strings: a cursor)."""
    last_seen = group["last_seen"]
    micros = (last_seen - EPOCH) // datetime.timedelta(microseconds=1)
    return (-micros, group["group_key"])


def _edge_row(sort_key):
    """(last_seen, group key) of the row a ``_recently_seen_first`` sort key names."""
    micros, group_key = sort_key
    try:
        return EPOCH + datetime.timedelta(microseconds=-micros), group_key
    except OverflowError as exc:  # a forged cursor: no row can be there
        raise NotFound(RowsCursorPagination.invalid_cursor_message) from exc


@extend_schema(
    parameters=FILTER_PARAMETERS,
    summary="Failure groups, most recently seen first",
    description="Messages grouped by failure group (queue, reason, exception). The message "
    "filters narrow what is counted, e.g. `status=pending` for what is left to recover.",
)
class GroupList(generics.ListAPIView):
    serializer_class = GroupSerializer
    pagination_class = RowsCursorPagination
    team_scoped = True

    def list(self, request, *args, **kwargs):
        filters = validated(MessageFilterParams, request.query_params)
        scope = scope_of(request)
        if kept_times_answer(filters):
            page = self.paginator.paginate_keyset(
                lambda edge, reverse, limit: kept_groups(
                    filters, _edge_row(edge) if edge else None, reverse, limit, scope
                ),
                _recently_seen_first,
                (0, ""),
                request,
            )
        else:
            groups = rollup_groups(filters, scope)
            if groups is None:
                groups = message_groups(filters, scope)
            page = self.paginator.paginate_rows(groups, _recently_seen_first, request)
        page = masked_labels(attach_labels(page), scope)
        return self.paginator.get_paginated_response(self.get_serializer(page, many=True).data)
