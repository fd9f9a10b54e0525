"""One check per alert kind: is its condition true now, with a value, a one-line summary and the
items behind it (group keys, job ids, queue names). Each reads an aggregate the store already
keeps (``MessageTotal`` sums, the heartbeat table, the newest audit) or one management API
call, so a cycle of rules stays cheap at a million stored messages.

Parameters per kind (``AlertRule.params``, their types and bounds in recovery/alerts/params.py)
and the scope fields each honours:

- new_failure_group: ``window_minutes`` (60): groups whose first message is that recent
  (hour resolution: the totals table's). Scope: vhost, queue, exchange.
- open_messages: ``threshold`` (0): open (pending, poisoned, replaying) messages above it.
  Scope: vhost, queue, exchange, group_key.
- open_growth: ``per_minute`` (100), ``window_minutes`` (10): messages collected in the window
  per minute above the rate. Scope: vhost, queue, exchange, group_key.
- collector_down: ``seconds`` (60): no collector heartbeat that recent. Scope: vhost.
- collector_lag: ``threshold`` (1000): messages waiting in a recovery queue. Scope: vhost.
- replay_job: ``window_minutes`` (60): jobs paused now, or failed that recently.
- audit: ``lost_above`` (0), ``loss_ppm_above`` (none), ``warnings`` (true), ``missing_after``
  ("06:00" UTC: yesterday's audit should have succeeded by then).
- broker_alarm: memory or disk alarms on any node, blocked or blocking connections.
- queue_without_consumers: a recovery queue with no consumer (the collector is not draining
  it). Scope: vhost.
- uncovered_queues: application queues without dead-lettering to Lazarus, exchanges without
  an alternate exchange, recovery queues whose delivery limit is not unlimited
  (recovery/broker/coverage.py). Scope: vhost. Only rows whose answer the management API did
  not give (``*_unknown``): unknown, neither firing nor clearing.
- broker_tally: ``threshold`` (0), ``window_minutes`` (15): over the window, the broker's own
  counters say it discarded (no DLX), dropped (unroutable) or dead-lettered more than Lazarus
  stored or holds (recovery/models/broker.py). No sample in the window, or one whose counters
  could not be read, is an error (unknown), not ok. Broker-wide (the counters have no vhost).
- retention_archive: the last retention run could not write its archive (RETENTION_ARCHIVE_DIR:
  a full disk, a directory it cannot create): it deleted nothing it could not archive and
  stopped. Resolves with the next run that archives (recovery/retention/run.py).
"""

import datetime
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Exists, Min, OuterRef, Q, Sum

from recovery.alerts.params import params_problems, vhost_problem
from recovery.broker import health as broker_health
from recovery.broker.coverage import uncovered
from recovery.broker.management import Management
from recovery.broker.topology import Names, declared_counts
from recovery.errors import ManagementError
from recovery.models import (
    OPEN,
    AuditRun,
    BrokerTally,
    CollectorHeartbeat,
    Message,
    MessageTotal,
    ReplayJob,
)
from recovery.retention.run import last_archive_failure

ITEMS_KEPT = 50


class UnwatchedVhost(Exception):
    """The rule's scope names a vhost outside RECOVERY_VHOSTS (saved before that was refused,
    or the setting changed): its queues are not Lazarus's to read or show."""


class InvalidParams(Exception):
    """The rule's saved params are not what its kind takes (saved before they were checked, or
    in code): said as such, instead of the TypeError or AttributeError the check would raise
    (an audit rule with ``"missing_after": 6`` raised "'int' object has no attribute
    'partition'" on every evaluation)."""


class OutsideTeamScope(Exception):
    """A team's rule names what its team's scopes no longer cover (a scope removed or
    narrowed since it was saved): it is not looked at, and its state is unknown, until it is
    edited or the scope is given back."""


class TallyUnknown(Exception):
    """The broker tally cannot say anything for the window (no sample, counters unreadable)."""


# items named in a notification; the count says how many there were


@dataclass
class Check:
    firing: bool
    value: float | None = None
    summary: str = ""
    items: list = field(default_factory=list)


def _vhosts(rule):
    return [rule.vhost] if rule.vhost else list(settings.RECOVERY_VHOSTS)


def _broker_vhosts(rule):
    """The vhosts whose queues a check may read through the management API (and name in its
    items): only watched ones, whatever the rule was saved with."""
    if vhost_problem(rule.vhost):
        raise UnwatchedVhost(f"the scope's vhost {rule.vhost!r} is not one Lazarus watches")
    return _vhosts(rule)


def _count_scope(rule, prefix=""):
    q = Q()
    for name, column in (
        ("vhost", "vhost"),
        ("queue", "source_queue"),
        ("exchange", "source_exchange"),
        ("group_key", "group_key"),
    ):
        value = getattr(rule, name)
        if value:
            q &= Q(**{prefix + column: value})
    return q


def new_failure_group(rule, now, management):
    window = datetime.timedelta(minutes=rule.params.get("window_minutes", 60))
    since = (now - window).replace(minute=0, second=0, microsecond=0)
    scope = _count_scope(rule)
    # Groups with a row first counted since then, and none (in the scope) counted before: two
    # index ranges, not a GROUP BY over every group.
    older = MessageTotal.objects.filter(
        scope, group_key=OuterRef("group_key"), first_hour__lt=since
    )
    rows = (
        MessageTotal.objects.filter(scope, first_hour__gte=since)
        .filter(~Exists(older))
        .values("group_key")
        .annotate(first=Min("first_hour"), n=Sum("n"))
        .filter(n__gt=0)
        .order_by("-first")
    )
    keys = [row["group_key"] for row in rows[:ITEMS_KEPT]]
    count = rows.count() if len(keys) == ITEMS_KEPT else len(keys)
    return Check(count > 0, count, f"{count} new failure group(s) since {since:%H:%M} UTC", keys)


def open_messages(rule, now, management):
    threshold = rule.params.get("threshold", 0)
    n = (
        MessageTotal.objects.filter(_count_scope(rule), status__in=OPEN).aggregate(n=Sum("n"))["n"]
        or 0
    )
    return Check(n > threshold, n, f"{n} open message(s) (threshold {threshold})")


def open_growth(rule, now, management):
    per_minute = rule.params.get("per_minute", 100)
    minutes = rule.params.get("window_minutes", 10)
    scope = _count_scope(rule)
    n = Message.objects.filter(
        scope, collected_at__gte=now - datetime.timedelta(minutes=minutes)
    ).count()
    rate = n / minutes
    return Check(
        rate > per_minute,
        rate,
        f"{rate:.0f} messages/min collected over {minutes} min (limit {per_minute})",
    )


def collector_down(rule, now, management):
    seconds = rule.params.get("seconds", 60)
    beats = CollectorHeartbeat.objects.filter(
        updated_at__gte=now - datetime.timedelta(seconds=seconds)
    )
    down = [v for v in _vhosts(rule) if not beats.filter(vhost=v).exists()]
    return Check(
        bool(down),
        len(down),
        f"no collector heartbeat for {seconds} s in {', '.join(down)}" if down else "collecting",
        down,
    )


def _recovery_queue_counts(vhost, management, names):
    """{source queue: (messages, consumers)} of a vhost: the management API's numbers, or where
    it leaves them out (statistics disabled), a passive declare's (ready messages only). A
    queue neither can count is not in the answer."""
    counts = {}
    missing = []
    for q in management.queues(vhost) or []:
        if q["name"] not in names.source_queues:
            continue
        messages, consumers = q.get("messages"), q.get("consumers")
        if messages is None or consumers is None:
            missing.append(q["name"])
        else:
            counts[q["name"]] = (messages, consumers)
    if missing:
        declared = declared_counts(vhost, missing)
        counts |= {queue: c for queue, c in declared.items() if c is not None}
    return counts


def collector_lag(rule, now, management):
    threshold = rule.params.get("threshold", 1000)
    names = Names.from_settings()
    waiting = []
    for vhost in _broker_vhosts(rule):
        for queue, (messages, _) in sorted(
            _recovery_queue_counts(vhost, management, names).items()
        ):
            if messages > threshold:
                waiting.append(f"{vhost}/{queue}: {messages}")
    worst = max((int(w.rsplit(": ", 1)[1]) for w in waiting), default=0)
    return Check(
        bool(waiting), worst, f"recovery queues above {threshold} waiting: {len(waiting)}", waiting
    )


def replay_job(rule, now, management):
    window = datetime.timedelta(minutes=rule.params.get("window_minutes", 60))
    jobs = ReplayJob.objects.filter(
        Q(state=ReplayJob.State.PAUSED)
        | Q(state=ReplayJob.State.FAILED, finished_at__gte=now - window)
    ).order_by("-id")
    items = [f"job {j.pk} {j.state}: {j.state_reason}"[:200] for j in jobs[:ITEMS_KEPT]]
    return Check(bool(items), len(items), f"{len(items)} replay job(s) paused or failed", items)


def audit(rule, now, management):
    params = rule.params
    yesterday = now.date() - datetime.timedelta(days=1)
    runs = AuditRun.objects.filter(date=yesterday).order_by("-revision")
    run = runs.first()
    hour, _, minute = params.get("missing_after", "06:00").partition(":")
    due = datetime.datetime.combine(
        now.date(), datetime.time(int(hour), int(minute or 0)), datetime.UTC
    )
    problems = []
    waiting = ""
    if run is None or run.status == AuditRun.State.RUNNING:
        if now >= due:
            problems.append(f"no finished audit of {yesterday}")
        else:
            # Not due yet: not a problem, and not "clean" either.
            state = "still running" if run else "not run yet"
            waiting = f"audit of {yesterday} {state} (due by {due:%H:%M} UTC)"
    elif run.status == AuditRun.State.FAILED:
        problems.append(f"the audit of {yesterday} failed: {run.error[:200]}")
    else:
        lost = run.totals.get("lost") or 0
        if lost > params.get("lost_above", 0):
            problems.append(f"{lost} lost in the audit of {yesterday}")
        ppm = run.totals.get("loss_ppm")
        limit = params.get("loss_ppm_above")
        if limit is not None and ppm is not None and ppm > limit:
            problems.append(f"loss {ppm:.1f} ppm (limit {limit})")
        if params.get("warnings", True) and run.warnings:
            codes = ", ".join(f"{w['count']} {w['code']}" for w in run.warnings)
            problems.append(f"the audit of {yesterday} could not decide: {codes}")
    return Check(
        bool(problems),
        len(problems),
        "; ".join(problems) or waiting or f"audit of {yesterday} clean",
        problems,
    )


def broker_alarm(rule, now, management):
    health = broker_health.read(management)
    if health.error:
        raise ManagementError(health.error)
    items = list(health.alarms)
    blocked = health.blocked_connections
    if blocked:
        items.append(f"{len(blocked)} publishing connection(s) blocked by flow control")
        items += [f"{c['state']}: {c['name']} ({c['user']}@{c['vhost']})" for c in blocked]
    if not items and health.unknown:
        # Nothing in force that we can see, but not all could be seen: neither fire nor clear.
        raise BrokerUnknown("; ".join(health.unknown[:3]))
    items = items[:ITEMS_KEPT]
    return Check(bool(items), len(items), "; ".join(items[:3]) or "no broker alarm", items)


def queue_without_consumers(rule, now, management):
    names = Names.from_settings()
    idle = []
    for vhost in _broker_vhosts(rule):
        counts = _recovery_queue_counts(vhost, management, names)
        for queue, (_, consumers) in sorted(counts.items()):
            if not consumers:
                idle.append(f"{vhost}/{queue}")
    return Check(bool(idle), len(idle), f"{len(idle)} recovery queue(s) without consumers", idle)


class BrokerUnknown(Exception):
    """No alarm is in force that the management API reports, but it left some out."""


class CoverageUnknown(Exception):
    """Nothing is known to be uncovered, but something could not be read: not "ok"."""


def uncovered_queues(rule, now, management):
    rows = [row for vhost in _broker_vhosts(rule) for row in uncovered(vhost, management)]
    unknown = [row for row in rows if row.problem.endswith("_unknown")]
    if unknown and len(unknown) == len(rows):
        raise CoverageUnknown(
            "; ".join(f"{r.vhost}/{r.name}: {r.detail}" for r in unknown[:3])
            + (f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")
        )
    items = [f"{r.vhost}/{r.kind} {r.name}: {r.problem}" for r in rows[:ITEMS_KEPT]]
    return Check(
        bool(rows), len(rows), f"{len(rows)} queue(s)/exchange(s) Lazarus cannot collect", items
    )


def broker_tally(rule, now, management):
    threshold = rule.params.get("threshold", 0)
    minutes = rule.params.get("window_minutes", 15)
    rows, sums = BrokerTally.objects.window(minutes, now)
    if not rows:
        raise TallyUnknown(
            f"no broker tally sample in {minutes} min: is beat running (record-broker-tally)?"
        )
    if rows[0].error:
        raise TallyUnknown(f"the broker's counters could not be read: {rows[0].error}")
    lost = sums["discarded"] + sums["unroutable_dropped"]
    items = []
    if sums["discarded"]:
        items.append(f"{sums['discarded']} dead-lettered with no dead-letter exchange: discarded")
    if sums["unroutable_dropped"]:
        items.append(f"{sums['unroutable_dropped']} unroutable publishes dropped")
    if sums["gap"] > 0:
        items.append(
            f"{sums['gap']} dead-lettered by the broker, not stored by Lazarus nor waiting "
            f"({sums['dead_lettered']} dead-lettered, {sums['stored_dead_letters']} stored, "
            f"backlog {sums['backlog_change']:+d})"
        )
    if sums["unknown_intervals"]:
        items.append(f"{sums['unknown_intervals']} sample(s) in the window could not be read")
    worst = max(lost, sums["gap"])
    return Check(
        worst > threshold,
        worst,
        "; ".join(items) or f"the broker's count matches the store over {minutes} min",
        items,
    )


def retention_archive(rule, now, management):
    failed = last_archive_failure()
    if failed is None:
        return Check(False, 0, "retention archives what it deletes (or needs no archive)")
    error = failed.detail["archive_error"]
    at = f"{failed.created_at:%Y-%m-%d %H:%M} UTC"
    return Check(True, 1, f"retention stopped at {at}: {error}"[:500], [error[:500]])


CHECKS = {
    "new_failure_group": new_failure_group,
    "open_messages": open_messages,
    "open_growth": open_growth,
    "collector_down": collector_down,
    "collector_lag": collector_lag,
    "replay_job": replay_job,
    "audit": audit,
    "broker_alarm": broker_alarm,
    "queue_without_consumers": queue_without_consumers,
    "uncovered_queues": uncovered_queues,
    "broker_tally": broker_tally,
    "retention_archive": retention_archive,
}


def run_check(rule, now, management=None) -> Check:
    """The rule's check; raises (the rule is then unknown) when it cannot look, and before
    looking when the rule's params are not its kind's (``InvalidParams``)."""
    problems = params_problems(rule.kind, rule.params)
    if problems:
        raise InvalidParams(f"the rule's params cannot be used ({'; '.join(problems)}): edit it")
    # Checked each time, not only when saved: a team that lost the queue no longer watches it.
    outside = rule.scope_problems()
    if outside:
        raise OutsideTeamScope(f"{'; '.join(outside.values())}: edit the rule or the team's scopes")
    return CHECKS[rule.kind](rule, now, management or Management())
