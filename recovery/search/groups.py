"""Failure groups and counts over the counts rollup (``MessageCount``) and the messages: every
query the console's groups page and the API's groups and stats read, in one place beside the
filters they take (recovery/search/filters.py)."""

import datetime

from django.core.exceptions import FullResultSet
from django.db import connection
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from recovery.models import OPEN, Kind, Message, MessageCount, MessageTotal, Status
from recovery.search.filters import FILTER_COLUMNS, apply_filters, narrow_search

TOP_QUEUES = 50
# Filters the trigger-kept rollup (MessageCount) can answer: every equality filter, on the
# columns of the same names.
ROLLUP_COLUMNS = FILTER_COLUMNS


def _on_the_hour(moment):
    utc = moment.astimezone(datetime.UTC)
    return utc == utc.replace(minute=0, second=0, microsecond=0)


def _a_rollup_bound(moment, hourly_from):
    """Whether the rollup can cut at ``moment``: an hour while its hours are kept, a UTC
    midnight before (MessageCount.compact folds those hours into their day)."""
    utc = moment.astimezone(datetime.UTC)
    if utc >= hourly_from:
        return _on_the_hour(utc)
    return utc == utc.replace(hour=0, minute=0, second=0, microsecond=0)


def rollup_rows(filters, scope=None):
    """MessageCount rows for these filters, or None when only the messages can answer exactly
    (a search, or since/until inside an hour, or inside a day the compaction folded). The
    rollup makes stats constant-time in the size of the store; it is exact because triggers
    keep it in the writers' transactions."""
    # Compactions so far folded only hours before this (their horizon was no later than now's).
    hourly_from = (timezone.now() - MessageCount.HOURLY_FOR).astimezone(datetime.UTC)
    hourly_from = hourly_from.replace(hour=0, minute=0, second=0, microsecond=0)
    if filters.get("q") or not all(
        _a_rollup_bound(filters[name], hourly_from)
        for name in ("since", "until")
        if filters.get(name)
    ):
        return None
    rows = MessageCount.objects.order_by()
    if scope is not None:  # the rollup has the messages' vhost and source columns
        rows = rows.filter(scope.q())
    if filters.get("since"):
        rows = rows.filter(hour__gte=filters["since"])
    if filters.get("until"):
        rows = rows.filter(hour__lt=filters["until"])
    for name, column in ROLLUP_COLUMNS.items():
        if filters.get(name):
            rows = rows.filter(**{column: filters[name]})
    return rows


def count_by(filters, scope=None):
    """(by kind, by status, top queues) from the rollup, or from the messages when it cannot;
    ``scope``: a caller's Scope (a team counts its own)."""
    rows = rollup_rows(filters, scope)
    if rows is not None:
        aggregate, column = Sum, "n"
    else:
        messages = Message.objects.order_by()
        if scope is not None:
            messages = scope.messages(messages)
        rows, aggregate, column = apply_filters(messages, filters, scope), Count, "id"
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
    FROM by_hour GROUP BY group_key HAVING sum(total) > 0
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


def rollup_groups(filters, scope=None):
    """Every group's row for these filters, from the rollup (counts, and the hours its newest
    and oldest matching messages are in) and two index probes per group (their exact times, and
    the label); None when only the messages can answer (``rollup_rows``).

    A GROUP BY over the messages reads all of them on every page (0.75-0.9 s at a million);
    this reads the rollup and a few rows per group (p95 79 ms through the API, bench/ui.py), in
    one statement, so the counts and the probes see the same snapshot.
    """
    rollup = rollup_rows(filters, scope)
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
        # Not > 0: a delete's delta row keeps its message's hour while the compaction moved
        # the rest of that day to midnight, so an hour may sum below zero until the next one.
        .exclude(total=0)
    )
    by_hour_sql, by_hour_params = by_hour.query.sql_with_params()
    messages = Message.objects.all() if scope is None else scope.messages()
    matching = apply_filters(messages, filters, scope).query
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


# Each group's counts and times from the trigger-kept totals (recovery.models.MessageTotal): the
# kept times where every counted key of the group is exact, else (a message left one since the
# last compaction) the two index probes of the rollup path, for that group only. Sorted and paged
# here (most recently seen first, then by key; {after} is the keyset condition), so only a page
# of rows leaves the database: at 10k groups, building and sorting every row in Python cost
# five times the query.
KEPT_GROUPS_SQL = """
WITH g AS (
    SELECT group_key, sum(n)::bigint AS count,
           coalesce(sum(n) FILTER (WHERE status = 'pending'), 0)::bigint AS pending,
           min(first_at) AS first_at, max(last_at) AS last_at, bool_and(exact) AS exact,
           max(source_queue) AS queue, max(source_exchange) AS exchange, max(reason) AS reason,
           max(kind) AS kind
    FROM recovery_messagetotal WHERE {where_totals}
    GROUP BY group_key HAVING sum(n) > 0
), r AS (
    SELECT g.group_key, '' AS label, g.queue, g.exchange, g.reason, g.kind, g.count, g.pending,
           CASE WHEN g.exact THEN g.first_at ELSE (
               SELECT collected_at FROM recovery_message WHERE group_key = g.group_key
                      AND ({where}) ORDER BY collected_at, id LIMIT 1) END AS first_seen,
           CASE WHEN g.exact THEN g.last_at ELSE (
               SELECT collected_at FROM recovery_message WHERE group_key = g.group_key
                      AND ({where}) ORDER BY collected_at DESC, id DESC LIMIT 1) END AS last_seen
    FROM g
)
SELECT * FROM r WHERE {after} ORDER BY last_seen {desc}, group_key {asc} LIMIT %s
"""


def _where(queryset):
    """The WHERE clause of a queryset as (sql, params); ("true", ()) when it has none."""
    query = queryset.query
    try:
        return query.get_compiler(connection=connection).compile(query.where)
    except FullResultSet:  # no filter
        return "true", ()


def kept_times_answer(filters):
    """Whether ``kept_groups`` can answer these filters (the totals have no hours, no text)."""
    return not (filters.get("q") or filters.get("since") or filters.get("until"))


def kept_groups(filters, edge=None, reverse=False, limit=None, scope=None):
    """The groups' rows for these filters from the counts' kept times (``MessageTotal``: no
    probe of a group's messages unless one left it since the last compaction), most recently
    seen first (then by key), without labels (``attach_labels`` reads them for a page).

    ``edge`` = (last_seen, group_key) of a page's edge row: the rows after it, or with
    ``reverse`` the rows before it, nearest first; at most ``limit`` (None: all). Only for
    filters ``kept_times_answer`` accepts. ``scope``: a caller's Scope (a team's own groups)."""
    totals = MessageTotal.objects.all() if scope is None else MessageTotal.objects.filter(scope.q())
    for name, column in ROLLUP_COLUMNS.items():
        if filters.get(name):
            totals = totals.filter(**{column: filters[name]})
    where_totals, totals_params = _where(totals)
    messages = Message.objects.all() if scope is None else scope.messages()
    where, where_params = _where(apply_filters(messages, filters, scope))
    after, after_params = "true", []
    if edge is not None:
        newer = ">" if reverse else "<"
        after = (
            f"(last_seen {newer} %s OR (last_seen = %s AND group_key {'<' if reverse else '>'} %s))"
        )
        after_params = [edge[0], edge[0], edge[1]]
    sql = KEPT_GROUPS_SQL.format(
        where_totals=where_totals,
        where=where,
        after=after,
        desc="ASC" if reverse else "DESC",
        asc="DESC" if reverse else "ASC",
    )
    params = [*totals_params, *(list(where_params) * 2), *after_params, limit]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [dict(zip(GROUP_FIELDS, row, strict=True)) for row in cur.fetchall()]


def attach_labels(groups):
    """Set each group's ``label`` where it has none (one index probe per group: for a page)."""
    missing = [group["group_key"] for group in groups if not group["label"]]
    if missing:
        with connection.cursor() as cur:
            cur.execute(
                """
                SELECT g.key, (SELECT group_label FROM recovery_message m
                               WHERE m.group_key = g.key LIMIT 1)
                FROM unnest(%s::text[]) AS g(key)
                """,
                [missing],
            )
            labels = dict(cur.fetchall())
        for group in groups:
            if not group["label"]:
                group["label"] = labels.get(group["group_key"]) or ""
    return groups


def message_groups(filters, scope=None):
    """Every group's row, aggregated over the matching messages (a search, or since/until
    inside an hour: what the rollup cannot answer exactly)."""
    # The key hashes queue, reason and exception, so MAX() of each is the group's value.
    return list(
        narrow_search(
            apply_filters(
                Message.objects.all() if scope is None else scope.messages(), filters, scope
            ),
            filters,
        )
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


def group_counts(counts, open_only=False):
    """Per group of the (filtered) ``MessageTotal`` (or ``MessageCount``) rows ``counts``:
    total, open, poisoned and replayed messages (the console's groups page)."""
    rows = (
        counts.values("group_key")
        .annotate(
            total=Sum("n"),
            open=Sum("n", filter=Q(status__in=OPEN), default=0),
            poisoned=Sum("n", filter=Q(status=Status.POISONED), default=0),
            replayed=Sum("n", filter=Q(status=Status.REPLAYED), default=0),
        )
        .filter(total__gt=0)
    )
    return rows.filter(open__gt=0) if open_only else rows
