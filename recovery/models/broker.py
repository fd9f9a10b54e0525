"""Counted twice: the broker's own tally of what it dead-lettered or dropped, set against what
Lazarus stored in the same interval. recovery/broker/tally.py reads the broker's counters;
``BrokerTally.objects.record`` sets one sample of them against the store and the previous
sample; the pages, the API and the broker_tally alert read the samples through the manager."""

import datetime

from django.conf import settings
from django.db import connection, models
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from recovery.broker.tally import compare, deltas

# A collector batch's rows carry the time its transaction began (now()) and become visible when
# it commits, so "stored in (previous sample, this one]" by collected_at would miss a batch that
# began before a sample and committed after it. Instead each sample counts, in one statement
# (one snapshot), the rows visible since a bound SETTLE_S before the previous sample and since a
# bound SETTLE_S before itself: what the next sample subtracts. A row is counted in the interval
# in which it became visible, exactly once, as long as no batch stays open for SETTLE_S.
SETTLE_S = 120

_STORED_SQL = """
SELECT kind, reason,
       count(*) FILTER (WHERE collected_at > %(since_previous)s),
       count(*) FILTER (WHERE collected_at > %(since_now)s)
FROM recovery_message
WHERE collected_at > least(%(since_previous)s, %(since_now)s)
GROUP BY kind, reason
"""


def stored_counts(since_previous, since_now):
    """({kind:reason: visible rows collected after since_previous}, {... after since_now})."""
    with connection.cursor() as cur:
        cur.execute(_STORED_SQL, {"since_previous": since_previous, "since_now": since_now})
        rows = cur.fetchall()
    return (
        {f"{kind}:{reason}": n for kind, reason, n, _ in rows if n},
        {f"{kind}:{reason}": n for kind, reason, _, n in rows if n},
    )


def by_reason_since(rows):
    """The readable samples' by_reason summed: {reason: {broker, discarded, stored, unstored}},
    ``unstored`` = dead-lettered by the broker and not stored (waiting in the recovery queues, or
    gone); biggest first."""
    sums = {}
    for row in rows:
        if row.error:
            continue
        for reason, counts in (row.by_reason or {}).items():
            total = sums.setdefault(reason, {"broker": 0, "discarded": 0, "stored": 0})
            for name in total:
                total[name] += counts.get(name, 0)
    for total in sums.values():
        total["unstored"] = total["broker"] - total["stored"]
    return dict(
        sorted(sums.items(), key=lambda item: -(item[1]["unstored"] + item[1]["discarded"]))
    )


class BrokerTallyManager(models.Manager):
    def unreadable(self, now, error):
        """A sample whose counters could not be read: that interval is unknown, never zero."""
        return self.create(taken_at=now, error=str(error)[:2000])

    def record(self, now, counters, waiting):
        """One sample of the broker's ``counters`` ({node: series}, tally.scrape) and ``waiting``
        (tally.backlog), compared with the previous good one; the first is a baseline."""
        previous = self.filter(error="", taken_at__lt=now).order_by("-taken_at").first()
        settle = datetime.timedelta(seconds=SETTLE_S)
        since_previous = (previous.taken_at if previous else now) - settle
        visible, tally_base = stored_counts(since_previous, now - settle)
        tally = self.model(taken_at=now, counters=counters, backlog=waiting, stored_base=tally_base)
        if previous is None:
            tally.save()  # the baseline: nothing to compare yet
            return tally
        rose, tally.resets = deltas(previous.counters, counters)
        # Rows that became visible since the previous sample, by (kind, reason).
        stored = {}
        for key, n in visible.items():
            kind, _, reason = key.partition(":")
            stored[(kind, reason)] = n - previous.stored_base.get(key, 0)
        tally.set_figures(rose, stored, previous, waiting)
        tally.save()
        return tally

    def by_hour(self, since):
        """Per hour since ``since``, newest first: the sums of the figures, the samples taken and
        how many of them could not be read."""
        return (
            self.filter(taken_at__gte=since)
            .annotate(hour=TruncHour("taken_at"))
            .values("hour")
            .annotate(
                samples=Count("id"),
                unreadable=Count("id", filter=~Q(error="")),
                **{name: Sum(name) for name in self.model.FIGURES},
            )
            .order_by("-hour")
        )

    def window(self, minutes, now=None):
        """The samples of the last ``minutes``, newest first, and the sums of the readable ones
        (with ``unknown_intervals``: how many could not be read)."""
        now = now or timezone.now()
        rows = list(self.filter(taken_at__gt=now - datetime.timedelta(minutes=minutes)))
        good = [r for r in rows if not r.error and r.gap is not None]
        sums = {name: sum(getattr(r, name) for r in good) for name in self.model.FIGURES}
        sums["unknown_intervals"] = sum(1 for r in rows if r.error)
        return rows, sums

    def state(self, now=None):
        """The tally as a whole: the newest sample, whether beat stopped sampling (stale),
        whether the newest could not be read, and the last hour's sums."""
        now = now or timezone.now()
        newest = self.order_by("-taken_at").first()
        stale_after = datetime.timedelta(seconds=3 * settings.BROKER_TALLY_SECONDS)
        rows, hour = self.window(60, now)
        return {
            "newest": newest,
            "stale": newest is None or now - newest.taken_at > stale_after,
            "unreadable": bool(newest and newest.error),
            "hour": hour,
            "lost_hour": hour["discarded"] + hour["unroutable_dropped"],
            "hour_by_reason": by_reason_since(rows),
        }

    def prune(self, keep_days=14):
        """Samples older than ``keep_days`` go (one a minute is ~20k rows a fortnight)."""
        cutoff = timezone.now() - datetime.timedelta(days=keep_days)
        return self.filter(taken_at__lt=cutoff).delete()[0]


class BrokerTally(models.Model):
    """One sample of the broker's global counters (rabbitmq_prometheus) and, since the previous
    good sample, what they say happened against what the store got.

    ``gap = dead_lettered - stored_dead_letters - backlog_change``: dead letters the broker says
    it sent to a dead-letter exchange that Lazarus neither stored nor holds in its queues.
    ``discarded`` (dead-lettered with no dead-letter exchange, strategy ``disabled``) and
    ``unroutable_dropped`` are gone for good the moment they happen. A sample whose counters
    could not be read keeps ``error`` and no figures: the interval is shown as unknown."""

    taken_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Seconds since the previous good sample (None: the first one, a baseline).
    interval_seconds = models.FloatField(null=True, blank=True)
    # Raw cumulative counters {node url: {series: value}}: the next sample's baseline.
    counters = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    dead_lettered = models.BigIntegerField(null=True, blank=True)
    discarded = models.BigIntegerField(null=True, blank=True)
    unroutable_dropped = models.BigIntegerField(null=True, blank=True)
    unroutable_returned = models.BigIntegerField(null=True, blank=True)
    stored_dead_letters = models.BigIntegerField(null=True, blank=True)
    stored_unroutable = models.BigIntegerField(null=True, blank=True)
    # Messages waiting in (or quarantined from) the recovery dead-letter queues at the sample.
    backlog = models.BigIntegerField(null=True, blank=True)
    backlog_change = models.BigIntegerField(null=True, blank=True)
    gap = models.BigIntegerField(null=True, blank=True)
    # {kind:reason: stored rows collected after taken_at - SETTLE_S, visible at this sample}:
    # what the next sample subtracts (SETTLE_S above).
    stored_base = models.JSONField(default=dict, blank=True)
    # {reason: {"broker": n, "discarded": n, "stored": n}}
    by_reason = models.JSONField(default=dict, blank=True)
    # Nodes whose counters went back (a restart): counted from zero for this interval.
    resets = models.JSONField(default=list, blank=True)

    # The figures summed per hour and per window, and exported as metrics.
    FIGURES = (
        "dead_lettered",
        "stored_dead_letters",
        "backlog_change",
        "gap",
        "discarded",
        "unroutable_dropped",
        "unroutable_returned",
    )

    objects = BrokerTallyManager()

    class Meta:
        ordering = ["-taken_at", "-id"]

    def __str__(self):
        return f"tally {self.taken_at:%Y-%m-%d %H:%M:%S} gap={self.gap} discarded={self.discarded}"

    @property
    def lost(self):
        """Gone for good in this interval, by the broker's own count."""
        if self.discarded is None:
            return None
        return self.discarded + (self.unroutable_dropped or 0)

    def set_figures(self, rose, stored, previous, waiting):
        """This interval's figures from the counters' rise and the rows stored since
        ``previous`` ({(kind, reason): n})."""
        self.by_reason = compare(rose, stored)
        self.interval_seconds = (self.taken_at - previous.taken_at).total_seconds()
        self.dead_lettered = sum(r["broker"] for r in self.by_reason.values())
        self.discarded = sum(r["discarded"] for r in self.by_reason.values())
        self.unroutable_dropped = int(rose.get("unroutable_dropped", 0))
        self.unroutable_returned = int(rose.get("unroutable_returned", 0))
        self.stored_dead_letters = sum(r["stored"] for r in self.by_reason.values())
        self.stored_unroutable = sum(n for (kind, _), n in stored.items() if kind == "unroutable")
        self.backlog_change = waiting - previous.backlog
        self.gap = self.dead_lettered - self.stored_dead_letters - self.backlog_change
