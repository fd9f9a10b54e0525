"""Collector health: queue depths (the lag) per vhost and source, and live collector threads."""

import datetime

from django.conf import settings
from django.utils import timezone

from recovery.models import CollectorHeartbeat
from recovery.topology import queue_depths

STALE_AFTER = datetime.timedelta(seconds=30)


def collector_health(database_ok=True):
    broker = {"ok": True}
    lag = {}
    for vhost in settings.RECOVERY_VHOSTS:
        try:
            lag[vhost] = queue_depths(vhost)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            broker = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            break
    collectors = []
    if database_ok:
        fresh_after = timezone.now() - STALE_AFTER
        for beat in CollectorHeartbeat.objects.filter(updated_at__gte=fresh_after).order_by(
            "vhost", "queue", "worker"
        ):
            collectors.append(
                {
                    "worker": beat.worker,
                    "vhost": beat.vhost,
                    "queue": beat.queue,
                    "collected": beat.collected,
                    "duplicates": beat.duplicates,
                    "quarantined": beat.quarantined,
                    "errors": beat.errors,
                    "last_error": beat.last_error,
                    "seen": beat.updated_at.isoformat(),
                }
            )
    return {
        "broker": broker,
        "running": bool(collectors),
        "lag": lag,
        "threads": collectors,
    }
