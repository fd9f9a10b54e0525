"""Collector health: per source (vhost x recovery queue) what was collected, how fast, and the lag.

``collector_health()`` is what /healthz, the console overview and the API's ``stats`` show. The
counters come from the heartbeat rows every collector thread upserts every few seconds
(``CollectorHeartbeat``, written by ``recovery.collector.writer.BatchWriter.beat``); the lag is the
number of messages waiting in each recovery queue, asked of the broker now.
"""

import datetime

from django.conf import settings
from django.utils import timezone

from recovery.broker.topology import Names, queue_depths
from recovery.collector.rows import source_of
from recovery.models import CollectorHeartbeat

# A collector that has not written its heartbeat for this long is not counted as running (it
# writes one every 5 s, and at least after every batch).
STALE_AFTER = datetime.timedelta(seconds=30)


def collector_health(database_ok=True):
    """The collector's state, as a JSON-ready dict (keep this shape: the console and API use it).

    ::

        {
          "broker": {"ok": bool, "error": str (only when not ok)},
          "running": bool,      # some collector thread wrote a heartbeat in the last 30 s
          "lag": {vhost: {queue: int | None}},   # messages waiting in each recovery queue
                                                 # (source queues and quarantine); None: the
                                                 # queue does not exist (vhost not wired)
          "sources": [          # one per (vhost in RECOVERY_VHOSTS, source queue), in order
            {
              "vhost": str, "queue": str,
              "source": "dead_letters" | "unrouted" | "returns",
              "depth": int | None,        # = lag: messages waiting to be collected
              "collected": int,           # stored by the running collectors since they started
              "duplicates": int,          # redeliveries recognised as already stored
              "quarantined": int,         # sent to the quarantine queue instead
              "errors": int, "last_error": str,
              "rate": float,              # messages stored per second, summed over collectors
              "collectors": int,          # running collector threads on this source
              "last_collected_at": ISO 8601 str | None,
            }, ...
          ],
          "quarantine": {vhost: int | None},     # messages waiting in recovery.quarantine
          "threads": [          # every running collector thread (one per worker and source)
            {"worker", "vhost", "queue", "collected", "duplicates", "quarantined", "errors",
             "last_error", "rate", "last_collected_at", "seen" (ISO 8601)}, ...
          ],
        }
    """
    names = Names.from_settings()
    broker = {"ok": True}
    lag = {}
    for vhost in settings.RECOVERY_VHOSTS:
        try:
            lag[vhost] = queue_depths(vhost, names)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            broker = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            break
    threads = _running_threads() if database_ok else []
    sources = [
        _source(vhost, queue, names, lag, threads)
        for vhost in settings.RECOVERY_VHOSTS
        for queue in names.source_queues
    ]
    return {
        "broker": broker,
        "running": bool(threads),
        "lag": lag,
        "sources": sources,
        "quarantine": {vhost: depths.get(names.quarantine) for vhost, depths in lag.items()},
        "threads": threads,
    }


def _source(vhost, queue, names, lag, threads):
    """One source queue's row: its depth and what its running collectors did, summed."""
    mine = [t for t in threads if t["vhost"] == vhost and t["queue"] == queue]
    return {
        "vhost": vhost,
        "queue": queue,
        "source": source_of(queue, names),
        "depth": lag.get(vhost, {}).get(queue),
        "collected": sum(t["collected"] for t in mine),
        "duplicates": sum(t["duplicates"] for t in mine),
        "quarantined": sum(t["quarantined"] for t in mine),
        "errors": sum(t["errors"] for t in mine),
        "last_error": next((t["last_error"] for t in mine if t["last_error"]), ""),
        "rate": round(sum(t["rate"] for t in mine), 1),
        "collectors": len(mine),
        "last_collected_at": max(
            (t["last_collected_at"] for t in mine if t["last_collected_at"]), default=None
        ),
    }


def _running_threads():
    fresh_after = timezone.now() - STALE_AFTER
    beats = CollectorHeartbeat.objects.filter(updated_at__gte=fresh_after).order_by(
        "vhost", "queue", "worker"
    )
    return [
        {
            "worker": beat.worker,
            "vhost": beat.vhost,
            "queue": beat.queue,
            "collected": beat.collected,
            "duplicates": beat.duplicates,
            "quarantined": beat.quarantined,
            "errors": beat.errors,
            "last_error": beat.last_error,
            "rate": beat.rate,
            "last_collected_at": (
                beat.last_collected_at.isoformat() if beat.last_collected_at else None
            ),
            "seen": beat.updated_at.isoformat(),
        }
        for beat in beats
    ]


def without_error_text(health):
    """``health`` for a team member: the collector's error texts (a database error may quote a
    row of any team's) become "(hidden)"; counts and states stay."""
    for row in [*health["sources"], *health["threads"]]:
        if row.get("last_error"):
            row["last_error"] = "(hidden)"
    return health
