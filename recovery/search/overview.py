"""The overview's queries over the counts rollup (MessageCount, MessageTotal) and the store:
totals and hourly charts, messages collected lately, and "what changed" (new and busiest
failure groups with their sparklines)."""

import datetime

from django.db import models
from django.db.models import Q, Sum
from django.utils import timezone

from recovery.models import Message, MessageCount, MessageTotal
from recovery.search.details import group_details

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


# ---- "what changed": the overview's first panel ----

# Messages counted exactly for the last 15 / 60 minutes up to this many; above it "more than".
RECENT_COUNT_CAP = 100_000
SPARK_HOURS = 12


def collected_since(since, messages=None):
    """Messages collected since ``since`` (newest-first index), counted up to RECENT_COUNT_CAP:
    (count, capped)."""
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
