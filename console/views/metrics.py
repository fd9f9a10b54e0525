"""/metrics in the Prometheus text format.

Read from the store at scrape time, not kept in process memory: the console runs as several
gunicorn workers and the work happens in Celery workers, so per-process counters (or
prometheus-client's multiprocess mode, which needs a shared directory on every machine and
still cannot see the workers' work) would each tell part of the story. Every number here comes
from an aggregate the store already keeps (the counts table, heartbeats, jobs, the newest
audit, alert rules), so a scrape costs a few indexed queries at a million stored messages.

Series count is bounded: per-queue series only for the METRICS_MAX_QUEUES queues with the most
open messages; the rest are summed into ``queue="__other__"``. Not public, and not for
teams: see ``_refusal`` (docs/security.md, "Metrics and health").
"""

import datetime
import ipaddress

from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from recovery.access.tokens import caller_scope, is_monitoring
from recovery.models import (
    OPEN,
    AlertRule,
    AuditRun,
    BrokerTally,
    CollectorHeartbeat,
    MessageTotal,
    Notification,
    NotificationChannel,
    ReplayJob,
    Role,
    team_scoped,
)

OTHER = "__other__"
HEARTBEAT_FRESH = datetime.timedelta(seconds=60)


def _refusal(request):
    """Why /metrics is refused, as (status, text), or None.

    The series cover every team (queue names, counts, rule names), so only a global caller
    reads them: a client address in METRICS_ALLOWED_IPS sending no credentials (the
    scraper's network), MONITORING_TOKEN, or a global viewer or better (logged in, or by an
    API token acting as its user). A team's member or a team's token gets 403, whatever its
    address: credentials are judged as what they are, and no per-team series are made."""
    if is_monitoring(request):
        return None
    has_credentials = request.user.is_authenticated or "HTTP_AUTHORIZATION" in request.META
    if not has_credentials:
        if _address_allowed(request):
            return None
        return 401, "metrics need an API token, a login, or METRICS_ALLOWED_IPS\n"
    scope = caller_scope(request)
    if scope is None:
        return 401, "metrics need an API token, a login, or METRICS_ALLOWED_IPS\n"
    if not scope.is_global:
        return 403, "metrics cover every team: a team's member or token cannot read them\n"
    if not scope.has_role(Role.VIEWER):
        return 403, "metrics need a role (viewer or better)\n"
    return None


def _address_allowed(request):
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    networks = [ipaddress.ip_network(n, strict=False) for n in settings.METRICS_ALLOWED_IPS]
    return any(client in network for network in networks)


class StoreCollector:
    def __init__(self, now=None):
        self.now = now or timezone.now()

    def collect(self):
        yield from self.messages()
        yield from self.collector()
        yield from self.replay()
        yield from self.audit()
        yield from self.alerts()
        yield from self.broker()

    def messages(self):
        stored = GaugeMetricFamily(
            "lazarus_messages",
            "Messages in the store by kind, reason and status",
            labels=["kind", "reason", "status"],
        )
        rows = MessageTotal.objects.values("kind", "reason", "status").annotate(n=Sum("n"))
        for row in rows.order_by("kind", "reason", "status"):
            if row["n"]:
                stored.add_metric([row["kind"], row["reason"] or "", row["status"]], row["n"])
        yield stored
        open_ = GaugeMetricFamily(
            "lazarus_open_messages",
            "Open (pending, poisoned, replaying) messages per source queue; queues past "
            "METRICS_MAX_QUEUES are summed into queue=__other__",
            labels=["vhost", "queue"],
        )
        per_queue = list(
            MessageTotal.objects.filter(status__in=OPEN)
            .values("vhost", "source_queue")
            .annotate(n=Sum("n"))
            .filter(n__gt=0)
            .order_by("-n", "vhost", "source_queue")
        )
        limit = settings.METRICS_MAX_QUEUES
        for row in per_queue[:limit]:
            open_.add_metric([row["vhost"], row["source_queue"]], row["n"])
        rest = sum(row["n"] for row in per_queue[limit:])
        if rest:
            open_.add_metric(["", OTHER], rest)
        yield open_

    def collector(self):
        up = GaugeMetricFamily(
            "lazarus_collector_up",
            "1 if a collector reported on this recovery queue within the last minute",
            labels=["vhost", "queue"],
        )
        collected = CounterMetricFamily(
            "lazarus_collector_collected",
            "Messages stored by each collector thread since it started",
            labels=["worker", "vhost", "queue"],
        )
        rate = GaugeMetricFamily(
            "lazarus_collector_rate_messages_per_second",
            "Messages stored per second, summed over the live collectors of a queue",
            labels=["vhost", "queue"],
        )
        fresh = self.now - HEARTBEAT_FRESH
        latest = {}
        for beat in CollectorHeartbeat.objects.order_by("vhost", "queue", "worker"):
            collected.add_metric([beat.worker, beat.vhost, beat.queue], beat.collected)
            key = (beat.vhost, beat.queue)
            alive = beat.updated_at >= fresh
            up_now, rate_now = latest.get(key, (0, 0.0))
            latest[key] = (max(up_now, int(alive)), rate_now + (beat.rate if alive else 0.0))
        for (vhost, queue), (alive, per_second) in sorted(latest.items()):
            up.add_metric([vhost, queue], alive)
            rate.add_metric([vhost, queue], per_second)
        yield from (up, collected, rate)

    def replay(self):
        jobs = GaugeMetricFamily("lazarus_replay_jobs", "Replay jobs by state", labels=["state"])
        counts = dict(ReplayJob.objects.values_list("state").annotate(n=Count("id")))
        for state in ReplayJob.State.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        sums = ReplayJob.objects.aggregate(
            confirmed=Sum("confirmed"),
            returned=Sum("returned"),
            failed=Sum("failed"),
            dead_again=Sum("dead_again"),
        )
        outcomes = GaugeMetricFamily(
            "lazarus_replay_job_messages",
            "Messages sent by replay jobs, by outcome (jobs kept in the store)",
            labels=["outcome"],
        )
        for outcome, n in sorted(sums.items()):
            outcomes.add_metric([outcome], n or 0)
        yield outcomes

    def audit(self):
        last = (
            AuditRun.objects.filter(status=AuditRun.State.SUCCEEDED, finality="FINAL")
            .order_by("-date", "-revision")
            .first()
        )
        family = GaugeMetricFamily(
            "lazarus_audit_last_final",
            "The newest FINAL audit's totals (lost, duplicated, unverified, unclaimed pairs)",
            labels=["metric"],
        )
        warnings = GaugeMetricFamily(
            "lazarus_audit_last_final_warnings",
            "Warnings of the newest FINAL audit: what it could not decide",
        )
        day = GaugeMetricFamily(
            "lazarus_audit_last_final_day_timestamp_seconds",
            "The UTC day the newest FINAL audit covered (midnight, Unix seconds)",
        )
        if last is not None:
            for metric in ("lost", "dup_msgs", "unverified", "unclaimed"):
                family.add_metric([metric], last.totals.get(metric) or 0)
            warnings.add_metric([], len(last.warnings or []))
            midnight = datetime.datetime.combine(last.date, datetime.time(), datetime.UTC)
            day.add_metric([], midnight.timestamp())
        yield from (family, warnings, day)

    def alerts(self):
        # One state per enabled rule, as the console and the API show it: unknown (its check
        # raised, or beat has not evaluated it lately) is a value of its own, never ok.
        rules = list(AlertRule.objects.filter(enabled=True))
        states = [r.current_state for r in rules]
        firing = GaugeMetricFamily("lazarus_alert_rules_firing", "Alert rules firing now")
        firing.add_metric([], states.count(AlertRule.State.FIRING))
        by_state = GaugeMetricFamily(
            "lazarus_alert_rules",
            "Enabled alert rules by state (unknown: cannot check, or not evaluated lately)",
            labels=["state"],
        )
        for state in AlertRule.State.values:
            by_state.add_metric([state], states.count(state))
        per_rule = GaugeMetricFamily(
            "lazarus_alert_rule_state",
            "1 for the state each enabled alert rule is in (ok, firing, unknown), 0 for the others",
            labels=["rule_id", "rule", "kind", "state"],
        )
        for rule, current in zip(rules, states, strict=True):
            for state in AlertRule.State.values:
                per_rule.add_metric(
                    [str(rule.pk), rule.name, rule.kind, state], int(state == current)
                )
        pending = GaugeMetricFamily(
            "lazarus_notifications_pending", "Notifications waiting in the outbox"
        )
        pending.add_metric([], Notification.objects.filter(status="pending").count())
        failing = GaugeMetricFamily(
            "lazarus_notification_channels_failing",
            "Notification channels whose last attempts all failed",
        )
        failing.add_metric(
            [],
            NotificationChannel.objects.filter(
                consecutive_failures__gte=NotificationChannel.FAILING_AFTER
            ).count(),
        )
        yield from (firing, by_state, per_rule, pending, failing)

    def broker(self):
        """The broker tally's last hour (recovery/models/broker.py); unknown is said, not 0."""
        state = BrokerTally.objects.state(self.now)
        unknown = GaugeMetricFamily(
            "lazarus_broker_tally_unknown",
            "1 when the broker's counters are not being read (stale or unreadable samples)",
        )
        unknown.add_metric([], int(state["stale"] or state["unreadable"]))
        hour = GaugeMetricFamily(
            "lazarus_broker_tally_last_hour_messages",
            "The broker's own count against the store over the last hour, by figure",
            labels=["figure"],
        )
        for figure in BrokerTally.FIGURES:
            hour.add_metric([figure], state["hour"][figure])
        yield from (unknown, hour)


# Team callers reach the view (the middleware would answer 404) to be told why: 403.
@team_scoped
@require_GET
def metrics(request):
    refused = _refusal(request)
    if refused is not None:
        status, text = refused
        response = HttpResponse(text, status=status, content_type="text/plain")
        if status == 401:
            response["WWW-Authenticate"] = "Token"
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
