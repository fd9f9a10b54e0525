"""The broker page: what an operator needs when messages pile up (node memory and disk against
their alarm limits, alarms, blocked publishers, the recovery queues), and the broker's own tally
of what it dead-lettered or dropped set against what Lazarus stored."""

import datetime

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.access import viewer_required
from recovery.broker.health import broker_health
from recovery.broker.trace import trace_status
from recovery.models import BrokerTally


@login_required
@viewer_required
@require_GET
def broker_page(request):
    now = timezone.now()
    health = broker_health(refresh="refresh" in request.GET)
    context = {
        "health": health,
        "checked_at": datetime.datetime.fromtimestamp(health.checked_at, datetime.UTC),
        "tally": BrokerTally.objects.state(now),
        "hours": BrokerTally.objects.by_hour(now - datetime.timedelta(hours=24)),
        "trace": firehose_rows(),
    }
    return render(request, "broker/health.html", context)


def firehose_rows():
    """Per watched vhost: the firehose on or off, its trace queue and the tap's last flush; a
    vhost the management API did not answer for is unknown, never "off"."""
    rows = trace_status()
    for row in rows:
        tap = row.get("tap") or {}
        for field, key in (("tap_at", "flushed_ms"), ("tap_last_record", "last_ms")):
            ms = tap.get(key)
            row[field] = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC) if ms else None
    return rows
