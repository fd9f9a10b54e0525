"""The store's counts: delta rows per hour and per failure group (MessageCount, MessageTotal),
written by triggers in the same statements that insert, change or delete messages, folded by a
beat task. The pages' queries over them: recovery/search/overview.py (the overview) and
recovery/search/details.py (a failure group's label and sample line)."""

import datetime

from django.db import connection, models


def fold_deltas(cur, table, key, carried=None):
    """Fold the delta rows of each ``key`` of a count table into one row (the sum of n, and each
    ``carried`` column by its aggregate: {column: "min"}), dropping keys that sum to zero;
    returns the rows removed. Only keys with more than one row (or a zero sum) are rewritten;
    rows another transaction commits meanwhile are not in this statement's snapshot and stay
    as they are."""
    carried = carried or {}
    cols = ", ".join(key)
    extra = "".join(f", {column}" for column in carried)
    returned = "".join(f", c.{column}" for column in carried)
    aggregated = "".join(f", {how}({column})" for column, how in carried.items())
    cur.execute(
        f"""
        WITH busy AS (
            SELECT {cols} FROM {table} GROUP BY {cols} HAVING count(*) > 1 OR sum(n) = 0
        ), gone AS (
            DELETE FROM {table} c USING busy b
            WHERE {" AND ".join(f"c.{k} = b.{k}" for k in key)}
            RETURNING {", ".join(f"c.{k}" for k in key)}{returned}, c.n
        ), folded AS (
            INSERT INTO {table} ({cols}{extra}, n)
            SELECT {cols}{aggregated}, sum(n) FROM gone GROUP BY {cols} HAVING sum(n) <> 0
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM folded)
        """
    )
    return cur.fetchone()[0]


def recount(table, rebuild_sql):
    """Replace a count table's rows with a count of the messages themselves."""
    from django.db import transaction

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
            # By hour, with the kind and the count in the index: the overview's trend (every
            # group's rows of eight days, summed by hour and kind: 730k rows at 10k groups) is
            # an index-only scan, not a read of the table (174 -> 64 ms at 10M messages;
            # docs/big-store.md). Hour ranges (compaction, the busiest groups) use it too.
            models.Index(fields=["hour", "kind"], include=["n"], name="msgcount_hour_kind"),
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
        from django.db import transaction

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
    with the hour of the first message counted under the key (``first_hour``) and the key's
    oldest and newest collection times (``first_at``, ``last_at``: the groups API sorts and pages
    on them instead of probing every group's messages).

    MessageCount's hours make it grow with groups x hours (445k rows at 10k groups over 14 days):
    what only needs totals (alert checks, /metrics) reads this instead, one row per key once
    compacted (tens of thousands at 10k groups). Kept the same way: statement-level triggers
    (migration 0018) append delta rows, ``compact()`` folds them (sum of n, min of first_hour);
    a key whose sum is zero is dropped, so a group whose messages were all deleted (retention)
    is new again when it comes back.

    The times (migration 0021): a message counted under a key (inserted, or moved there by an
    update of its status) brings its ``collected_at``, so a key's min(first_at)/max(last_at)
    stay exact as messages arrive, at no read. A message leaving a key (deleted, or moved to
    another status) may have been its oldest or newest: finding the next one costs a read, so
    the trigger only writes a delta row with ``exact`` false and no times, and the key's times
    are then bounds (no newer than first_at, no older than last_at). ``compact()`` puts them
    right: each key with an inexact row is recounted from the messages (two index probes) into
    one exact row. Until then (a minute, beat) readers probe the messages for those keys only
    (recovery.search.groups.kept_groups): exact answers, and probes only where something left.
    """

    first_hour = models.DateTimeField()
    n = models.BigIntegerField()
    first_at = models.DateTimeField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    exact = models.BooleanField(default=True, db_default=True)

    KEY = ("vhost", "kind", "source_queue", "source_exchange", "reason", "status", "group_key")

    class Meta:
        indexes = [
            models.Index(fields=["group_key"], name="msgtotal_group"),
            # An alert rule scoped to a queue, and the new groups of the last hour.
            models.Index(fields=["source_queue", "status"], name="msgtotal_queue_status"),
            models.Index(fields=["first_hour"], name="msgtotal_first_hour"),
        ]

    CARRIED = {"first_hour": "min", "first_at": "min", "last_at": "max", "exact": "bool_and"}

    @classmethod
    def compact(cls):
        """Fold the delta rows of each key into one, then make the times of keys a message left
        exact again (``correct_times``); returns the rows removed. One compactor at a time
        (advisory lock); rows committed meanwhile stay as they are, the sums stay right."""
        from django.db import transaction

        table = cls._meta.db_table
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('recovery_messagetotal'))")
            if not cur.fetchone()[0]:
                return 0
            removed = fold_deltas(cur, table, cls.KEY, carried=cls.CARRIED)
            return removed + cls.correct_times(cur)

    @classmethod
    def correct_times(cls, cur):
        """Each key with an inexact row becomes one exact row: its rows' sums, and its oldest and
        newest messages' times read from the messages (msg_group_newest). One statement, one
        snapshot: a message deleted after it leaves a new inexact row for the next run, one
        inserted after it a row of its own. ``first_hour`` keeps the least of the rows (a group
        whose oldest messages retention deleted is not new). Returns the rows removed."""
        table = cls._meta.db_table
        key = cls.KEY
        cols = ", ".join(key)
        matches = " AND ".join(f"m.{k} = s.{k}" for k in key)
        probe = (
            "SELECT m.collected_at FROM recovery_message m WHERE "
            + matches
            + " ORDER BY m.collected_at {order}, m.id {order} LIMIT 1"
        )
        cur.execute(
            f"""
            WITH dirty AS (
                SELECT DISTINCT {cols} FROM {table} WHERE NOT exact
            ), gone AS (
                DELETE FROM {table} c USING dirty d
                WHERE {" AND ".join(f"c.{k} = d.{k}" for k in key)}
                RETURNING {", ".join(f"c.{k}" for k in key)}, c.first_hour, c.n
            ), sums AS (
                SELECT {cols}, min(first_hour) AS first_hour, sum(n) AS n FROM gone
                GROUP BY {cols} HAVING sum(n) <> 0
            ), fixed AS (
                INSERT INTO {table} ({cols}, first_hour, n, first_at, last_at, exact)
                SELECT {", ".join(f"s.{k}" for k in key)}, s.first_hour, s.n,
                       ({probe.format(order="ASC")}), ({probe.format(order="DESC")}), true
                FROM sums s
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM fixed)
            """
        )
        return cur.fetchone()[0]

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
    INSERT INTO recovery_messagetotal ({TOTAL_KEY_SQL}, first_hour, n, first_at, last_at, exact)
    SELECT {TOTAL_KEY_SQL}, min(date_trunc('hour', collected_at, 'UTC')), count(*),
           min(collected_at), max(collected_at), true
    FROM recovery_message GROUP BY 1, 2, 3, 4, 5, 6, 7
"""
