"""The store's counts: delta rows per hour and per failure group (MessageCount, MessageTotal),
written by triggers in the same statements that insert, change or delete messages, folded by a
beat task; and the queries over them (the overview, the failure groups, /metrics)."""

import datetime

from django.db import connection, models
from django.db.models import Q, Sum
from django.utils import timezone


def fold_deltas(cur, table, key, carried=None):
    """Fold the delta rows of each ``key`` of a count table into one row (the sum of n, and the
    least ``carried`` column if any), dropping keys that sum to zero; returns the rows removed.
    Only keys with more than one row (or a zero sum) are rewritten; rows another transaction
    commits meanwhile are not in this statement's snapshot and stay as they are."""
    cols = ", ".join(key)
    extra = f", {carried}" if carried else ""
    least = f", min({carried})" if carried else ""
    cur.execute(
        f"""
        WITH busy AS (
            SELECT {cols} FROM {table} GROUP BY {cols} HAVING count(*) > 1 OR sum(n) = 0
        ), gone AS (
            DELETE FROM {table} c USING busy b
            WHERE {" AND ".join(f"c.{k} = b.{k}" for k in key)}
            RETURNING {", ".join(f"c.{k}" for k in key)}{extra.replace(", ", ", c.")}, c.n
        ), folded AS (
            INSERT INTO {table} ({cols}{extra}, n)
            SELECT {cols}{least}, sum(n) FROM gone GROUP BY {cols} HAVING sum(n) <> 0
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM folded)
        """
    )
    return cur.fetchone()[0]


def recount(table, rebuild_sql):
    """Replace a count table's rows with a count of the messages themselves."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        cur.execute(f"DELETE FROM {table}")
        cur.execute(rebuild_sql)


class CountKey(models.Model):
    """What the count tables count messages by (besides MessageCount's hour)."""

    vhost = models.CharField(max_length=255)
    kind = models.CharField(max_length=16)
    source_queue = models.CharField(max_length=255)
    source_exchange = models.CharField(max_length=255)
    reason = models.CharField(max_length=16)
    status = models.CharField(max_length=16)
    group_key = models.CharField(max_length=64)

    class Meta:
        abstract = True


class MessageCount(CountKey):
    """Message counts per hour x vhost x kind x source x reason x status x failure group.

    Written only by statement-level triggers on ``recovery_message`` (migration 0004): every
    INSERT/UPDATE/DELETE appends its net change as delta rows, so writers never contend for a
    counter row. Readers sum the rows; ``compact()`` folds the deltas together now and then.
    The overview and failure-group pages read this instead of aggregating a million messages.
    ``hour`` is the UTC hour of collection; once compact() folded it, the UTC day (midnight).
    """

    hour = models.DateTimeField()
    n = models.BigIntegerField()

    # Rows stay hourly from the UTC midnight before (now - HOURLY_FOR) on, which covers the
    # 24-hour chart; older ones are folded into days.
    HOURLY_FOR = datetime.timedelta(hours=24)
    KEY = (
        "hour",
        "vhost",
        "kind",
        "source_queue",
        "source_exchange",
        "reason",
        "status",
        "group_key",
    )

    class Meta:
        indexes = [
            models.Index(fields=["hour"], name="msgcount_hour"),
            models.Index(fields=["group_key"], name="msgcount_group"),
        ]

    @classmethod
    def compact(cls):
        """Fold delta rows with the same key into one row; returns the rows removed.

        Hours older than HOURLY_FOR (whole UTC days) are folded into their day first: ``hour``
        is then the day's midnight, which is all the 7-day chart needs, and a month of history
        costs a day's worth of rows per day instead of 24. Only keys with more than one row (or
        a zero sum) are rewritten. Rows another transaction commits meanwhile are not in this
        statement's snapshot and stay as they are, so the sums stay right. One compactor at a
        time (advisory lock); others return at once.
        """
        from django.db import connection, transaction

        key = ", ".join(cls.KEY)
        table = cls._meta.db_table
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('recovery_messagecount'))")
            if not cur.fetchone()[0]:
                return 0
            rest = ", ".join(cls.KEY[1:])
            cur.execute(
                f"""
                WITH old AS (
                    DELETE FROM {table}
                    WHERE hour < date_trunc('day', now() - %s * interval '1 hour', 'UTC')
                      AND hour <> date_trunc('day', hour, 'UTC')
                    RETURNING {key}, n
                ), days AS (
                    INSERT INTO {table} ({key}, n)
                    SELECT date_trunc('day', hour, 'UTC'), {rest}, sum(n) FROM old
                    GROUP BY date_trunc('day', hour, 'UTC'), {rest} HAVING sum(n) <> 0
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM old) - (SELECT count(*) FROM days)
                """,
                [cls.HOURLY_FOR.total_seconds() / 3600],
            )
            removed = cur.fetchone()[0]
            return removed + fold_deltas(cur, table, cls.KEY)

    @classmethod
    def rebuild(cls):
        """Recount from the messages themselves (after a restore, or to check the triggers)."""
        recount(cls._meta.db_table, REBUILD_COUNTS_SQL)


class MessageTotal(CountKey):
    """Message counts per vhost x kind x source x reason x status x failure group, over all time,
    with the hour of the first message counted under the key (``first_hour``).

    MessageCount's hours make it grow with groups x hours (445k rows at 10k groups over 14 days):
    what only needs totals (alert checks, /metrics) reads this instead, one row per key once
    compacted (tens of thousands at 10k groups). Kept the same way: statement-level triggers
    (migration 0018) append delta rows, ``compact()`` folds them (sum of n, min of first_hour);
    a key whose sum is zero is dropped, so a group whose messages were all deleted (retention)
    is new again when it comes back."""

    first_hour = models.DateTimeField()
    n = models.BigIntegerField()

    KEY = ("vhost", "kind", "source_queue", "source_exchange", "reason", "status", "group_key")

    class Meta:
        indexes = [
            models.Index(fields=["group_key"], name="msgtotal_group"),
            # An alert rule scoped to a queue, and the new groups of the last hour.
            models.Index(fields=["source_queue", "status"], name="msgtotal_queue_status"),
            models.Index(fields=["first_hour"], name="msgtotal_first_hour"),
        ]

    @classmethod
    def compact(cls):
        """Fold the delta rows of each key into one; returns the rows removed. One compactor at
        a time (advisory lock); rows committed meanwhile stay as they are, the sums stay right."""
        from django.db import connection, transaction

        table = cls._meta.db_table
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('recovery_messagetotal'))")
            if not cur.fetchone()[0]:
                return 0
            return fold_deltas(cur, table, cls.KEY, carried="first_hour")

    @classmethod
    def rebuild(cls):
        """Recount from the messages themselves."""
        recount(cls._meta.db_table, REBUILD_TOTALS_SQL)


# The hour bucket is UTC whatever the session time zone of the writer (the collector's psycopg
# connection does not set one).
COUNT_KEY_SQL = (
    "date_trunc('hour', collected_at, 'UTC'), vhost, kind, source_queue, source_exchange, "
    "reason, status, group_key"
)
REBUILD_COUNTS_SQL = f"""
    INSERT INTO recovery_messagecount ({", ".join(MessageCount.KEY)}, n)
    SELECT {COUNT_KEY_SQL}, count(*) FROM recovery_message GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
"""
TOTAL_KEY_SQL = "vhost, kind, source_queue, source_exchange, reason, status, group_key"
REBUILD_TOTALS_SQL = f"""
    INSERT INTO recovery_messagetotal ({TOTAL_KEY_SQL}, first_hour, n)
    SELECT {TOTAL_KEY_SQL}, min(date_trunc('hour', collected_at, 'UTC')), count(*)
    FROM recovery_message GROUP BY 1, 2, 3, 4, 5, 6, 7
"""


# ---- the console's queries over the store and its rollup (SQL beside the models it reads) ----

TOTALS_KEY = ("vhost", "kind", "source_queue", "source_exchange", "reason", "status")


def rollup_sums(since=None, scope_q=None):
    """(totals per source key, from MessageTotal; totals per hour and kind since ``since``,
    default the last eight UTC days: the overview's two charts, from MessageCount's hour index).

    Both tables are written by the same statements' triggers; at 10k failure groups MessageCount
    holds ~450k rows and MessageTotal ~40k, so the totals no longer scan the hours.
    ``scope_q``: a caller's ``Scope.q()`` (both tables have the messages' vhost and source
    columns): a team's own totals."""
    scope_q = scope_q or Q()
    if since is None:
        since = timezone.now().replace(minute=0, second=0, microsecond=0)
        since = since.replace(hour=0) - datetime.timedelta(days=8)
    totals = [
        {**{k: row[k] for k in TOTALS_KEY}, "total": row["total"]}
        for row in MessageTotal.objects.filter(scope_q)
        .values(*TOTALS_KEY)
        .annotate(total=Sum("n"))
        .filter(total__gt=0)
        .order_by()
    ]
    hourly = [
        row
        for row in MessageCount.objects.filter(scope_q, hour__gte=since)
        .values("hour", "kind")
        .annotate(total=Sum("n"))
        .order_by()
        if row["total"]
    ]
    return totals, hourly


def hourly_sums(start, end, scope_q=None):
    return (
        MessageCount.objects.filter(scope_q or Q(), hour__gte=start, hour__lt=end)
        .values("hour", "kind")
        .annotate(total=Sum("n"))
    )


def group_details(keys, where=("true", ())):
    """Label, kind, source and exact first/last collection time per group (index probes);
    ``where``: (SQL, params) over recovery_message, a caller's scope (``Scope.where_sql``)."""
    if not keys:
        return {}
    where_sql, where_params = where
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT g.key, newest.group_label, newest.kind, newest.reason, newest.source_queue,
                   newest.source_exchange, newest.collected_at,
                   (SELECT recovery_message.collected_at FROM recovery_message
                    WHERE recovery_message.group_key = g.key AND ({where_sql})
                    ORDER BY recovery_message.collected_at, recovery_message.id LIMIT 1)
            FROM unnest(%s::text[]) AS g(key)
            CROSS JOIN LATERAL (
                SELECT group_label, kind, reason, source_queue, source_exchange, collected_at
                FROM recovery_message WHERE recovery_message.group_key = g.key AND ({where_sql})
                ORDER BY recovery_message.collected_at DESC, recovery_message.id DESC LIMIT 1
            ) AS newest
            """,
            [*where_params, list(keys), *where_params],
        )
        columns = ["key", "label", "kind", "reason", "queue", "exchange", "last", "first"]
        return {row[0]: dict(zip(columns, row, strict=True)) for row in cur.fetchall()}
