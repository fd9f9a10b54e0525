"""Who is bound to what, and since when: the bindings history the audit reads.

RabbitMQ does not know consumer groups; Lazarus assumes one queue per group (the usual RabbitMQ
shape) and names the group after the queue. When consumer logs name a different group for a
queue, the audit maps it through the logs' queue/group pairs (spark/transforms.py).

record_bindings()     a beat task every AUDIT_BINDINGS_POLL_SECONDS: lists the bindings of each
                      watched vhost and writes only what changed (``BindingPeriod``: first and
                      last seen) plus how far the history reaches (``BindingsCoverage``)
bindings_for_day()    the entries the audit of a day expects groups from, each with its time
                      span and source, and [{code, count}] warnings where it could not see:
                      AUDIT_BINDINGS (configured) replaces the broker; a vhost without history
                      falls back to a snapshot taken now; no bindings at all is said
"""

import datetime
import json

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from recovery.broker.management import Management
from recovery.models import BindingPeriod, BindingsCoverage

# A pause longer than this many poll intervals ends a stretch of coverage: what changed in it
# is only known at the next poll, and the audit says so.
BINDINGS_STALE_POLLS = 3


def broker_bindings(vhost, management=None):
    """The application bindings of ``vhost`` from the management API: [{exchange, routing_key,
    consumer_group, queue}], the routing key a topic pattern ("#" for fanout and headers
    exchanges, which match every key). Lazarus's own exchanges are left out."""
    management = management or Management()
    types = {
        e["name"]: e["type"]
        for e in management.request("GET", f"/exchanges/{management.quote(vhost)}")
    }
    out = []
    for binding in management.bindings(vhost):
        exchange = binding.get("source", "")
        if not exchange or binding.get("destination_type") != "queue":
            continue
        if exchange.startswith("recovery.") or exchange == settings.RECOVERY_DLX:
            continue
        kind = types.get(exchange, "topic")
        pattern = binding.get("routing_key", "") if kind in ("topic", "direct") else "#"
        out.append(
            {
                "exchange": exchange,
                "routing_key": pattern,
                "consumer_group": binding["destination"],
                "queue": binding["destination"],
            }
        )
    return out


def configured_bindings():
    with open(settings.AUDIT_BINDINGS, encoding="utf-8") as fh:
        entries = json.load(fh)
    return [{**entry, "source": "configured"} for entry in entries]


def _poll_interval():
    return datetime.timedelta(seconds=settings.AUDIT_BINDINGS_POLL_SECONDS)


def record_bindings(now=None, management=None, vhosts=None):
    """One poll of the bindings history; returns {vhost: (bindings added, bindings gone)}.

    A binding present at the very first poll of a vhost has no ``first_seen`` (it was there
    before the history began); one that appears later is first seen at this poll; one that is
    no longer listed was last seen at the previous poll. A broker that cannot be reached raises:
    the coverage then stops growing, and audits of that time say so."""
    now = now or datetime.datetime.now(datetime.UTC)
    management = management or Management()
    changes = {}
    for vhost in vhosts or settings.RECOVERY_VHOSTS:
        current = {
            (b["exchange"], b["routing_key"], b["queue"])
            for b in broker_bindings(vhost, management)
        }
        with transaction.atomic():
            coverage = (
                BindingsCoverage.objects.select_for_update()
                .filter(vhost=vhost)
                .order_by("-polled_at")
                .first()
            )
            open_periods = {
                (p.exchange, p.routing_key, p.queue): p
                for p in BindingPeriod.objects.select_for_update().filter(
                    vhost=vhost, gone_at__isnull=True
                )
            }
            added = current - open_periods.keys()
            gone = open_periods.keys() - current
            BindingPeriod.objects.bulk_create(
                BindingPeriod(
                    vhost=vhost,
                    exchange=exchange,
                    routing_key=routing_key,
                    queue=queue,
                    first_seen=None if coverage is None else now,
                )
                for exchange, routing_key, queue in sorted(added)
            )
            for key in gone:
                period = open_periods[key]
                period.last_seen = coverage.polled_at if coverage else now
                period.gone_at = now
                period.save(update_fields=["last_seen", "gone_at"])
            stale = BINDINGS_STALE_POLLS * _poll_interval()
            if coverage is not None and now - coverage.polled_at <= stale:
                coverage.polled_at = now
                coverage.save(update_fields=["polled_at"])
            else:
                BindingsCoverage.objects.create(vhost=vhost, started_at=now, polled_at=now)
        changes[vhost] = (len(added), len(gone))
    return changes


def _ms(moment):
    return None if moment is None else int(moment.timestamp() * 1000)


def bindings_for_day(day, grace, management=None):
    """(entries, warnings) for the audit of ``day``: every binding that existed at some time
    between the producer look-back before the day and the day's end + grace, with ``from_ms`` /
    ``until_ms`` (null: unbounded) and ``source``; warnings as [{code, count}]:

    - ``bindings_snapshot_only`` (count: vhosts): no history for a vhost, so its bindings of
      now stand for the whole day;
    - ``bindings_history_gap`` (count: minutes of the day the history did not see);
    - ``no_bindings``: nothing at all, the audit can only use what the logs show.
    """
    if settings.AUDIT_BINDINGS:
        entries = configured_bindings()
        return entries, [] if entries else [{"code": "no_bindings", "count": 1}]
    day_start = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
    day_end = day_start + datetime.timedelta(days=1)
    look_back = max(datetime.timedelta(hours=1), grace)
    lo, hi = day_start - look_back, day_end + grace
    entries, snapshot_only, unseen = [], 0, datetime.timedelta()
    for vhost in settings.RECOVERY_VHOSTS:
        coverage = list(
            BindingsCoverage.objects.filter(vhost=vhost, started_at__lt=hi).order_by("started_at")
        )
        if not coverage:
            snapshot_only += 1
            entries += [
                {**b, "source": "bound"} for b in broker_bindings(vhost, management or Management())
            ]
            continue
        now = datetime.datetime.now(datetime.UTC)
        unseen += _uncovered(coverage, day_start, min(day_end, now))
        periods = BindingPeriod.objects.filter(vhost=vhost).filter(
            Q(first_seen__isnull=True) | Q(first_seen__lt=hi),
            Q(gone_at__isnull=True) | Q(last_seen__gte=lo),
        )
        entries += [
            {
                "exchange": p.exchange,
                "routing_key": p.routing_key,
                "consumer_group": p.queue,
                "queue": p.queue,
                "source": "bound",
                "from_ms": _ms(p.first_seen),
                # The last poll that saw it, inclusive; still bound: unbounded.
                "until_ms": None if p.gone_at is None else _ms(p.last_seen) + 1,
            }
            for p in periods
        ]
    warnings = []
    if snapshot_only:
        warnings.append({"code": "bindings_snapshot_only", "count": snapshot_only})
    minutes = int(unseen.total_seconds() // 60)
    if minutes:
        warnings.append({"code": "bindings_history_gap", "count": minutes})
    if not entries:
        warnings.append({"code": "no_bindings", "count": 1})
    return entries, warnings


def _uncovered(coverage, start, end):
    """How much of [start, end) no stretch of coverage saw (a stretch reaches one poll interval
    past its last poll). Time before the history began counts: the audit assumes the first
    poll's bindings were there, and says so."""
    seen, cursor = datetime.timedelta(), start
    for stretch in coverage:
        a = max(stretch.started_at, cursor)
        b = min(stretch.polled_at + _poll_interval(), end)
        if b > a:
            seen += b - a
            cursor = b
    return (end - start) - seen
