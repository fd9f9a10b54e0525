"""The overview: what is in the store, how it trends, and whether collection keeps up.

Counts come from MessageCount (kept by triggers), never from aggregating the messages, so the
page costs the same with a million stored messages. The broker-facing half (collector health,
queue depths) is a separate fragment the page loads and refreshes, so a slow or unreachable
broker never holds up the page itself.
"""

import datetime
from collections import defaultdict

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.access import viewer_required
from recovery.broker.coverage import (
    UNLIMITED,
    effective_delivery_limit,
    read_operator_policies,
)
from recovery.broker.management import Management
from recovery.broker.topology import DLX_POLICY, Names, broker_version
from recovery.collector.health import collector_health, without_error_text
from recovery.errors import ManagementError
from recovery.masking.policy import mask_for_display, privacy_of
from recovery.models import (
    OPEN,
    Activity,
    AlertRule,
    BrokerTally,
    Kind,
    MessageCount,
    MessageTotal,
    scope_of,
    team_scoped,
)
from recovery.models.masking import MaskingRules
from recovery.search.overview import (
    changing_groups,
    collected_since,
    hourly_sums,
    rollup_sums,
)

TOP_SOURCES = 15
MANAGEMENT_TIMEOUT_SECONDS = 3
APP_QUEUES_SHOWN = 20


def _hour(moment):
    return moment.replace(minute=0, second=0, microsecond=0)


def store_counts(rows):
    """Totals by kind, source, reason and status (rows: rollup_sums()[0])."""
    by_kind, by_reason, by_status = defaultdict(int), defaultdict(int), defaultdict(int)
    open_by_kind, open_by_reason = defaultdict(int), defaultdict(int)
    by_source = defaultdict(lambda: {"total": 0, "open": 0})
    for row in rows:
        n, is_open = row["total"], row["status"] in OPEN
        by_kind[row["kind"]] += n
        by_reason[row["reason"]] += n
        by_status[row["status"]] += n
        source = by_source[(row["vhost"], row["source_queue"], row["source_exchange"])]
        source["total"] += n
        if is_open:
            open_by_kind[row["kind"]] += n
            open_by_reason[row["reason"]] += n
            source["open"] += n

    def table(totals, opens):
        return sorted(
            ({"name": k, "total": v, "open": opens.get(k, 0)} for k, v in totals.items()),
            key=lambda r: (-r["open"], -r["total"], r["name"]),
        )

    sources = sorted(
        ({"vhost": v, "queue": q, "exchange": e, **n} for (v, q, e), n in by_source.items()),
        key=lambda r: (-r["open"], -r["total"]),
    )
    return {
        "by_kind": table(by_kind, open_by_kind),
        "by_reason": table(by_reason, open_by_reason),
        "by_status": sorted(by_status.items(), key=lambda kv: -kv[1]),
        "sources": sources[:TOP_SOURCES],
        "more_sources": max(0, len(sources) - TOP_SOURCES),
        "vhosts": sorted({s["vhost"] for s in sources}),
        "total": sum(by_kind.values()),
        "open": sum(open_by_kind.values()),
    }


def trend(now, buckets, bucket_hours, hourly=None):
    """Messages collected per bucket and kind, the last bucket being the current hour or (UTC)
    day: chart.js-ready data. ``hourly``: rollup_sums()[1], or None to ask the database."""
    current = _hour(now)
    if bucket_hours == 24:
        current = current.replace(hour=0)
    end = current + datetime.timedelta(hours=bucket_hours)
    start = end - datetime.timedelta(hours=buckets * bucket_hours)
    rows = hourly_sums(start, end) if hourly is None else hourly
    series = defaultdict(lambda: [0] * buckets)
    for row in rows:
        if not start <= row["hour"] < end:
            continue
        index = int((row["hour"] - start).total_seconds() // 3600) // bucket_hours
        series[row["kind"]][index] += row["total"]
    fmt = "%H:%M" if bucket_hours < 24 else "%a %d"
    labels = [
        (start + datetime.timedelta(hours=i * bucket_hours)).strftime(fmt) for i in range(buckets)
    ]
    return {
        "labels": labels,
        "datasets": [
            {"label": kind.value, "data": series[kind.value]}
            for kind in Kind
            if kind.value in series
        ],
    }


def what_changed(now, scope):
    """The first panel: what an operator woken at 3 a.m. asks first, from the database only (the
    broker-facing half is the live fragment): new and busiest failure groups with their hourly
    sparklines, messages collected in the last 15 and 60 minutes, the alert rules firing or
    unable to check, and the broker tally's last hour and backlog (unknown when not sampled).
    A team sees its own groups, messages and rules; the tally is broker-wide, so not theirs."""
    new, busiest = changing_groups(
        now,
        counts=MessageCount.objects.filter(scope.q()),
        totals=MessageTotal.objects.filter(scope.q()),
        where=scope.where_sql(),
        privacy=privacy_of(scope),
    )
    alerts = list(
        scope.owned(AlertRule.objects)
        .filter(state__in=[AlertRule.State.FIRING, AlertRule.State.UNKNOWN])
        .order_by("state", "name")
        .only("id", "team_id", "name", "state", "last_summary", "last_error", "last_items")[:10]
    )
    # Their summaries are the badges' tooltips: masked as the alert pages mask them.
    mask_for_display(alerts)
    state = BrokerTally.objects.state(now) if scope.is_global else None
    last15, capped15 = collected_since(now - datetime.timedelta(minutes=15), scope.messages())
    last60, capped60 = collected_since(now - datetime.timedelta(minutes=60), scope.messages())
    return {
        "new_groups": new,
        "busiest_groups": busiest,
        "last15": last15,
        "capped15": capped15,
        "last60": last60,
        "capped60": capped60,
        "per_minute": round(last15 / 15, 1),
        "alerts": alerts,
        "tally": state,
        "tally_known": state is not None and not (state["stale"] or state["unreadable"]),
    }


@team_scoped
@login_required
@viewer_required
@require_GET
def overview(request):
    """A team sees its own figures: the count tables filtered by its scope."""
    now = timezone.now()
    scope = scope_of(request)
    totals, hourly = rollup_sums(scope_q=scope.q())
    ctx = {
        **store_counts(totals),
        "changed": what_changed(now, scope),
        "trend_24h": trend(now, 24, 1, hourly),
        "trend_7d": trend(now, 7, 24, hourly),
        "activity": scope.activity(Activity.objects.select_related("user")).order_by(
            "-created_at", "-id"
        )[:12],
        "now": now,
    }
    return render(request, "overview.html", ctx)


def broker_queues(scope):
    """Depths of the recovery queues and of the application queues that dead-letter to us
    (a team's own application queues only)."""
    names = Names.from_settings()
    recovery_queues = {*names.source_queues, names.quarantine}
    management = Management(timeout=MANAGEMENT_TIMEOUT_SECONDS)
    version = broker_version(management)
    report = []
    for vhost in settings.RECOVERY_VHOSTS:
        entry = {"vhost": vhost, "recovery": [], "app": [], "error": ""}
        try:
            queues = management.queues(vhost) or []
        except ManagementError as exc:
            entry["error"] = str(exc)
            report.append(entry)
            continue
        for queue in queues:
            # Left out with management statistics disabled: unknown (None), never shown as 0.
            for key in ("messages", "messages_ready", "messages_unacknowledged", "consumers"):
                queue.setdefault(key, None)
            arguments = queue.get("arguments") or {}
            if queue["name"] in recovery_queues:
                entry["recovery"].append(queue)
            elif (
                arguments.get("x-dead-letter-exchange") == names.dlx
                or queue.get("policy") == DLX_POLICY
            ) and scope.allows(vhost, queue["name"], ""):
                entry["app"].append(queue)
        _add_delivery_limits(management, vhost, entry["recovery"] + entry["app"], version, names)
        entry["recovery"].sort(key=lambda q: q["name"])
        entry["app"].sort(key=lambda q: (-(q.get("messages") or 0), q["name"]))
        entry["more_app"] = max(0, len(entry["app"]) - APP_QUEUES_SHOWN)
        entry["app"] = entry["app"][:APP_QUEUES_SHOWN]
        report.append(entry)
    return report


def _add_delivery_limits(management, vhost, queues, version, names):
    """Each shown quorum queue's delivery limit and what happens at it (``limit_shown``): an
    application queue shown here dead-letters to Lazarus; a recovery queue parks. The policy
    lists are read only when a queue's own policy fields are missing (statistics disabled)."""
    policies = operator = None
    if any("effective_policy_definition" not in q for q in queues):
        try:
            policies = management.policies(vhost) or []
        except ManagementError:
            policies = None
        operator = read_operator_policies(management, vhost)
    for queue in queues:
        limit = effective_delivery_limit(queue, version, policies, operator)
        if limit is None:
            queue["limit_shown"] = "unknown"
        elif limit == UNLIMITED:
            queue["limit_shown"] = UNLIMITED
        elif queue["name"] in names.limited_queues:
            queue["limit_shown"] = f"{limit}, then parked in {names.parked}"
        else:
            queue["limit_shown"] = f"{limit}, then dead-lettered to Lazarus"


@team_scoped
@login_required
@viewer_required
@require_GET
def overview_live(request):
    """Collector health and live queue depths (its own page without JavaScript)."""
    scope = scope_of(request)
    health = collector_health()
    ctx = {
        "health": masked_errors(health) if scope.is_global else without_error_text(health),
        "queues": broker_queues(scope),
        "now": timezone.now(),
    }
    template = "overview_live.html"
    if request.htmx:
        template += "#live"
    return render(request, template, ctx)


def masked_errors(health):
    """The collector's error texts (shown, and as tooltips) through every masking rule's
    regular expressions: an error can quote the row it failed on, of any team's queue."""
    masker = MaskingRules.load().team_masker(None)
    if not masker:
        return health
    for row in [*health.get("sources", []), *health.get("threads", [])]:
        if row.get("last_error"):
            row["last_error"] = masker.free_text(row["last_error"])
    if health.get("broker", {}).get("error"):
        health["broker"]["error"] = masker.free_text(health["broker"]["error"])
    return health
