"""The store's counts: delta rows per hour and per failure group (MessageCount, MessageTotal),
written by triggers in the same statements that insert, change or delete messages, folded by a
beat task; and the queries over them (the overview, the failure groups, /metrics)."""

import dataclasses
import datetime
import json

from django.db import connection, models
from django.db.models import Q, Sum
from django.utils import timezone

from recovery.client import headers as header_codec
from recovery.dead_letters import exception_type
from recovery.models.decoders import readable


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
        from django.db import connection, transaction

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


def group_details(keys, where=("true", ()), privacy=None, samples=True):
    """Label, kind, source and exact first/last collection time per group (index probes);
    ``where``: (SQL, params) over recovery_message, a caller's scope (``Scope.where_sql``);
    ``privacy``: ``(vhost, queue, exchange) -> (masker, may read bodies)`` for the caller
    (recovery.masking): the exception header and the sample line are shown as they may see
    them. None: unmasked (the system's own use). ``samples`` False: no sample line (labels
    only: no body is decoded or masked)."""
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
                    ORDER BY recovery_message.collected_at, recovery_message.id LIMIT 1),
                   newest.headers, newest.sample, newest.vhost, newest.id, newest.body_size,
                   newest.content_type, newest.content_encoding, newest.properties
            FROM unnest(%s::text[]) AS g(key)
            CROSS JOIN LATERAL (
                SELECT group_label, kind, reason, source_queue, source_exchange, collected_at,
                       headers, substring(body from 1 for %s) AS sample, vhost, id, body_size,
                       content_type, content_encoding, properties
                FROM recovery_message WHERE recovery_message.group_key = g.key AND ({where_sql})
                ORDER BY recovery_message.collected_at DESC, recovery_message.id DESC LIMIT 1
            ) AS newest
            """,
            [*where_params, list(keys), SAMPLE_BYTES, *where_params],
        )
        details = {}
        decoders = []  # loaded once, at the first masked sample
        for row in cur.fetchall():
            details[row[0]] = _group_detail(row, privacy, samples, decoders)
        return details


DETAIL_COLUMNS = ["key", "label", "kind", "reason", "queue", "exchange", "last", "first"]


def _group_detail(row, privacy, samples, decoders):
    detail = dict(zip(DETAIL_COLUMNS, row[:8], strict=True))
    # A raw cursor gives jsonb as its text (Django decodes it in the field, not here).
    headers = _jsonb(row[8]) or {}
    masker, bodies = privacy(row[10], row[4], row[5]) if privacy else (None, True)
    if masker is not None:
        detail["label"] = masker.label(detail["label"], headers)
        headers = masker.headers(headers)
    detail["exception"] = exception_type(header_codec.headers_from_json(headers))
    if not samples:
        return detail
    if masker and not decoders:
        decoders.append(_decoder_rules())
    # The message the sample is read from, and how (the group page logs a body view).
    detail["sample_id"] = row[11]
    detail["sample_read"], detail["sample_masked"] = bodies, bool(masker)
    sample = SampleOf(
        vhost=row[10],
        source_queue=row[4],
        source_exchange=row[5],
        content_type=row[13],
        content_encoding=row[14],
        properties=_jsonb(row[15]) or {},
        body_size=row[12],
        preview=bytes(row[9] or b""),
    )
    detail["sample"] = shown_sample(sample, masker, bodies, decoders[0] if decoders else None)
    return detail


def _jsonb(value):
    return json.loads(value) if isinstance(value, str) else value


def _decoder_rules():
    from recovery.models.decoders import DecoderRule

    return list(DecoderRule.objects.all())


@dataclasses.dataclass
class SampleOf:
    """What a sample line is read from: the first SAMPLE_BYTES of a body (``preview``), and
    what says how the body decodes (recovery.bodies.DECODE_FIELDS)."""

    vhost: str
    source_queue: str
    source_exchange: str
    content_type: str
    content_encoding: str
    properties: dict
    body_size: int | None
    preview: bytes


# How much of a group's newest body its sample line is read from.
SAMPLE_BYTES = 400


MASKED_SAMPLE = "(masked: open a message to see its body)"


def shown_sample(message, masker, bodies, decoders=None):
    """A body's sample line as a caller may see it. ``message``: a SampleOf, or a Message with
    its first SAMPLE_BYTES as ``preview`` and the DECODE_FIELDS loaded; ``decoders``: the
    DecoderRules, loaded once for a page (None: read here).

    Masked, the sample goes through the decoder chain the message's own page uses (base64,
    gzip, protobuf, Avro...: masking its stored bytes would show what the rules hide, as it is
    once the layers are undone) and is masked decoded. A sample that is not the whole body
    cannot be decoded or parsed as the rules need it (a cut document): it is not shown."""
    if not bodies:
        return "(metadata only: no body)"
    sample = bytes(message.preview or b"")
    if not masker:
        return sample_line(sample)
    size = message.body_size
    whole = len(sample) >= size if size is not None else len(sample) < SAMPLE_BYTES
    decoded = readable(message, decoders, body=sample)
    if decoded is not None:
        return _decoded_sample(masker, decoded) if whole else MASKED_SAMPLE
    if masker.paths and not whole:
        return MASKED_SAMPLE
    return sample_line(masker.body(sample))


def _decoded_sample(masker, decoded):
    if decoded.error is not None:
        return MASKED_SAMPLE  # what the rules would reach in it cannot be found
    shown = masker.decoded(decoded)
    if shown.value is not None:
        return _first_line(json.dumps(shown.value, ensure_ascii=False, default=str))
    if shown.text is not None:
        return _first_line(shown.text)
    return sample_line(shown.data)


def sample_line(body):
    """The first line of a body, as an operator skims a list: text up to 120 characters, or
    what it is when it is not text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(body) - 4:  # not just a character cut at SAMPLE_BYTES
            return f"(binary, starts {body[:8].hex(' ')})"
        text = body[: exc.start].decode("utf-8")
    return _first_line(text)


def _first_line(text):
    line = text.strip().split("\n", 1)[0].strip()
    return line[:120] + ("…" if len(line) > 120 else "")


# ---- "what changed": the overview's first panel ----

# Messages counted exactly for the last 15 / 60 minutes up to this many; above it "more than".
RECENT_COUNT_CAP = 100_000
SPARK_HOURS = 12


def collected_since(since, messages=None):
    """Messages collected since ``since`` (newest-first index), counted up to RECENT_COUNT_CAP:
    (count, capped)."""
    from recovery.models.store import Message

    queryset = (messages if messages is not None else Message.objects).filter(
        collected_at__gte=since
    )
    n = queryset.order_by()[: RECENT_COUNT_CAP + 1].count()
    return min(n, RECENT_COUNT_CAP), n > RECENT_COUNT_CAP


def hourly_sparks(counts, now, hours=SPARK_HOURS):
    """{group key: messages collected per hour, oldest first, over the ``hours`` up to ``now``'s}
    from the MessageCount rows ``counts`` (filter them to the groups wanted); groups without a
    message in those hours are left out."""
    current = now.replace(minute=0, second=0, microsecond=0)
    start = current - datetime.timedelta(hours=hours - 1)
    sparks: dict[str, list[int]] = {}
    rows = (
        counts.filter(hour__gte=start)
        .values("group_key", "hour")
        .annotate(total=Sum("n"))
        .order_by()
    )
    for row in rows:
        index = int((row["hour"] - start).total_seconds() // 3600)
        if 0 <= index < hours:
            sparks.setdefault(row["group_key"], [0] * hours)[index] += row["total"]
    return sparks


def changing_groups(now, counts=None, totals=None, limit=5, where=("true", ()), privacy=None):
    """(new, busiest): failure groups first seen in the last hour, and the groups with the most
    messages collected this hour and the last (this hour's pace above the last hour's is
    "growing"); each {key, label, spark: messages per hour over SPARK_HOURS, this_hour,
    last_hour, growing}. ``counts``/``totals``: MessageCount / MessageTotal querysets, and
    ``where`` the same over recovery_message (a caller's scope narrows all three)."""
    counts = counts if counts is not None else MessageCount.objects
    totals = totals if totals is not None else MessageTotal.objects
    new_keys = list(
        totals.values("group_key")
        .annotate(first=models.Min("first_at"), total=Sum("n"))
        .filter(first__gte=now - datetime.timedelta(hours=1), total__gt=0)
        .order_by("-first")
        .values_list("group_key", flat=True)[:limit]
    )
    current = now.replace(minute=0, second=0, microsecond=0)
    previous = current - datetime.timedelta(hours=1)
    elapsed = max((now - current).total_seconds(), 60.0) / 3600
    # The busiest groups are picked in the database, and sparklines read for the groups shown
    # only: at 10k groups the last SPARK_HOURS hold hundreds of thousands of count rows (1.7 s
    # to bring back and sum here at 10M messages, bench/ui.py), the last two hours far fewer.
    busiest = list(
        counts.filter(hour__gte=previous, hour__lte=current)
        .values("group_key")
        .annotate(
            this_hour=Sum("n", filter=Q(hour=current), default=0),
            last_hour=Sum("n", filter=Q(hour=previous), default=0),
        )
        .exclude(this_hour=0, last_hour=0)
        .order_by((models.F("this_hour") + models.F("last_hour")).desc(), "group_key")
        .values_list("group_key", flat=True)[:limit]
    )
    sparks = hourly_sparks(counts.filter(group_key__in=[*new_keys, *busiest]), now)

    def item(key):
        spark = sparks.get(key, [0] * SPARK_HOURS)
        this_hour, last_hour = spark[-1], spark[-2]
        return {
            "key": key,
            "spark": spark,
            "this_hour": this_hour,
            "last_hour": last_hour,
            "growing": this_hour / elapsed > last_hour,
        }

    details = group_details([*new_keys, *busiest], where, privacy)
    new = [
        {**item(k), "label": details[k]["label"], "first": details[k]["first"]}
        for k in new_keys
        if k in details
    ]
    busy = [{**item(k), "label": details[k]["label"]} for k in busiest if k in details]
    return new, busy
