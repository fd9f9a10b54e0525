"""Audit runs and their reports: per-hour charts, window badges, the evidence behind each number."""

import datetime
from collections import defaultdict

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.access import operator_required, viewer_required
from console.forms.audits import EvidenceFilterForm
from console.forms.paging import anchor_of
from recovery.models import AuditRun, Message, Role, scope_of, team_scoped
from recovery.replay.jobs import (
    NothingRecoverable,
    RecoverableGone,
    describe_target,
    replay_recoverable,
)

RUNS_PER_PAGE = 50
EVIDENCE_PER_PAGE = 200
# The totals the run list shows; the report shows all of them.
HEADLINE = ("distinct_published", "lost", "dup_msgs", "dead_lettered", "recovered")
# What each warning means to an operator (codes: recovery.models.WARNING_METRICS and
# recovery.audit.bindings.bindings_for_day); the count follows the text.
WARNING_TEXT = {
    "unclaimed": "confirmed messages no consumer group was expected to receive (no binding, "
    "no configuration, no consumer seen): nobody can say whether they arrived",
    "unbound_consumption": "deliveries to groups no binding names for that routing key "
    "(they are held to what they consumed: expected by observation)",
    "missing_consumer_logs": "windows × groups where a group expected to receive messages "
    "wrote no log line at all: its messages are unverified, not lost",
    "unverified": "messages not accounted for in windows with an input gap: neither lost nor fine",
    "input_gaps": "hours with a missing log file from a process that logged before and after",
    "malformed_lines": "log lines that could not be read",
    "orphan_consumptions": "consumptions of messages no producer log has: a producer log is "
    "missing",
    "no_bindings": "no bindings known and none configured: only what the consumer logs show "
    "could be expected",
    "bindings_snapshot_only": "vhosts without a bindings history: today's bindings stood in "
    "for the whole day",
    "bindings_history_gap": "minutes of the day the bindings history did not see (beat or the "
    "broker was down)",
}
WINDOW_COLUMNS = (
    "distinct_published",
    "delivered_unique",
    "dead_lettered",
    "recovered",
    "lost",
    "unverified",
    "unclaimed",
    "pending",
    "dup_msgs",
    "orphan_consumptions",
    "latency_p95_ms",
)


# The report's totals in the order an operator reads them, named in words (the code beside).
TOTAL_LABELS = {
    "lost": "Lost",
    "unverified": "Unverified (input gaps)",
    "unclaimed": "Unclaimed (no consumer expected)",
    "dead_lettered": "Dead-lettered",
    "recovered": "Recovered by Lazarus",
    "dup_msgs": "Duplicated messages",
    "dup_deliveries": "Duplicate deliveries",
    "distinct_published": "Published (distinct)",
    "confirmed": "Confirmed by the broker",
    "expected_confirmed": "Confirmed and expected by a group",
    "delivered_unique": "Delivered (unique)",
    "pending": "Pending (not yet due)",
    "nacked": "Nacked by the broker",
    "returned": "Returned unroutable",
    "unconfirmed": "Never confirmed",
    "latency_p50_ms": "Latency p50 (ms)",
    "latency_p95_ms": "Latency p95 (ms)",
    "latency_p99_ms": "Latency p99 (ms)",
    "latency_max_ms": "Latency max (ms)",
    "within_sla_share": "Within the SLA (share)",
    "late_deliveries": "Late deliveries",
    "loss_ppm": "Loss (parts per million)",
}


def readable_totals(totals):
    """(label, code, value) for every total: the known ones in reading order, the rest after
    them alphabetically (labelled from their code)."""
    known = [(TOTAL_LABELS[c], c, totals[c]) for c in TOTAL_LABELS if c in totals]
    rest = [
        (c.replace("_", " ").capitalize(), c, totals[c])
        for c in sorted(totals)
        if c not in TOTAL_LABELS
    ]
    return known + rest


def headline(run, warnings, evidence_counts):
    """The report's first lines: the loss (or that the audit cannot say), what it could not
    decide, and what to do first, most urgent first. Never "all good" beside a warning."""
    totals = run.totals or {}
    lost = totals.get("lost")
    steps = []
    recoverable = totals.get("recoverable") or evidence_counts.get("recoverable") or 0
    lost_word = "truly lost" if recoverable else "lost"  # beside the recoverable, the rest
    if recoverable:
        steps.append(
            (
                f"Replay the {recoverable} recoverable message(s): never received by their "
                "group, dead-lettered and held by Lazarus (the button below makes one replay "
                "job of them).",
                "recoverable",
            )
        )
    if lost:
        steps.append(
            (
                f"Find the {lost} {lost_word} message(s): their ids, hour and consumer group "
                "are in the evidence. Republish them from the producer's side (its log or retry "
                "cache): Lazarus never held them.",
                "lost",
            )
        )
    stuck = (totals.get("dead_lettered") or 0) - (totals.get("recovered") or 0)
    if stuck > 0:
        steps.append(
            (
                f"{stuck} dead-lettered message(s) are not recovered yet: replay or discard "
                "them from the message list.",
                None,
            )
        )
    codes = {w["code"] for w in warnings}
    if codes & {"input_gaps", "unverified", "missing_consumer_logs", "orphan_consumptions"}:
        steps.append(
            (
                "Find the missing log files (see the input gaps and the warnings) and run the "
                "audit again for this day: its messages are unverified until then.",
                "unverified" if evidence_counts.get("unverified") else None,
            )
        )
    if codes & {"unclaimed", "no_bindings", "bindings_snapshot_only", "bindings_history_gap"}:
        steps.append(
            (
                "Say which consumer groups should receive which routing keys (bindings or "
                "AUDIT_EXPECTED_GROUPS): the audit cannot call unclaimed messages lost or fine.",
                "unclaimed" if evidence_counts.get("unclaimed") else None,
            )
        )
    if totals.get("dup_msgs"):
        steps.append(
            (
                f"{totals['dup_msgs']} message(s) were processed more than once: check that "
                "those consumers are idempotent.",
                "duplicate" if evidence_counts.get("duplicate") else None,
            )
        )
    unknown = totals.get("lost_confirmation_unknown")
    if unknown:
        steps.append(
            (
                f"{unknown} message(s) published (per their spans) and never received: the spans "
                "cannot say whether the broker confirmed them. Treat them as lost unless the "
                "producer knows otherwise.",
                "lost_confirmation_unknown",
            )
        )
    if run.status != "succeeded" and not run.totals:
        verdict, tone = "This audit has no result: it did not finish.", "bad"
    elif lost is None:
        verdict, tone = "This audit could not count losses.", "warn"
    elif lost or recoverable:
        parts = [f"{lost} message(s) {lost_word}"] if lost else []
        if recoverable:
            parts.append(f"{recoverable} recoverable from Lazarus")
        verdict, tone = ", ".join(parts) + ".", "bad"
    elif warnings:
        verdict, tone = "Nothing proven lost, but not everything could be checked.", "warn"
    else:
        verdict, tone = "Nothing lost.", "ok"
    return {"verdict": verdict, "tone": tone, "steps": steps}


@team_scoped
@login_required
@viewer_required
@require_GET
def audit_list(request):
    before = anchor_of(request)
    runs = AuditRun.objects.order_by("-date", "-revision", "-id")
    if before is not None:
        # A day's run is every team's (each sees its own windows of it): no scope to look in.
        anchor = AuditRun.objects.filter(pk=before).first()
        if anchor:
            runs = runs.filter(date__lte=anchor.date).exclude(
                date=anchor.date, revision__gte=anchor.revision
            )
    runs = list(runs[: RUNS_PER_PAGE + 1])
    scope = scope_of(request)
    if not scope.is_global:
        runs = [run.narrowed_to(scope.audit_q()) for run in runs]
    next_before = runs[RUNS_PER_PAGE - 1].pk if len(runs) > RUNS_PER_PAGE else None
    rows = with_days_not_run(runs[:RUNS_PER_PAGE], newest=None if before else yesterday())
    return render(
        request,
        "audits/list.html",
        {"rows": rows, "headline": HEADLINE, "next_before": next_before},
    )


def yesterday():
    return timezone.localdate() - datetime.timedelta(days=1)


def with_days_not_run(runs, newest=None):
    """The runs (newest day first) as rows, with a ``{"missing": day}`` row for each day between
    them (and from ``newest``, the last day a nightly audit should have done, down to the first
    run) that has no run at all: a day nobody audited is shown as not run, never left out.
    Days before the first run ever are not counted."""
    rows = []
    expected = newest
    for run in runs:
        while expected is not None and expected > run.date:
            rows.append({"missing": expected})
            expected -= datetime.timedelta(days=1)
        rows.append({"run": run})
        expected = run.date - datetime.timedelta(days=1)
    return rows


def _number(value):
    return value if isinstance(value, int | float) else 0


def hourly_charts(windows):
    """Chart data per consumer group by hour: losses, duplicates and p95 latency.

    Counts add up over a group's exchanges; a percentile cannot be added, so the chart shows the
    worst exchange's p95 for the hour.
    """
    hours = sorted({w.window_start for w in windows})
    index = {hour: i for i, hour in enumerate(hours)}
    lost = defaultdict(lambda: [0] * len(hours))
    dups = defaultdict(lambda: [0] * len(hours))
    p95 = defaultdict(lambda: [None] * len(hours))
    for w in windows:
        group, i = w.consumer_group or "(none)", index[w.window_start]
        lost[group][i] += _number(w.metrics.get("lost"))
        dups[group][i] += _number(w.metrics.get("dup_msgs"))
        latency = w.metrics.get("latency_p95_ms")
        if isinstance(latency, int | float):
            p95[group][i] = max(latency, p95[group][i] or 0)
    labels = [h.strftime("%H:%M") for h in hours]

    def chart(series, kind):
        return {
            "type": kind,
            "labels": labels,
            "datasets": [{"label": g, "data": series[g]} for g in sorted(series)],
        }

    return {
        "lost": chart(lost, "bar"),
        "dups": chart(dups, "bar"),
        "latency": chart(p95, "line"),
    }


@team_scoped
@login_required
@viewer_required
@require_GET
def audit_detail(request, pk):
    scope = scope_of(request)
    run = get_object_or_404(AuditRun, pk=pk)
    if not scope.is_global:
        run.narrowed_to(scope.audit_q())
    windows = list(run.windows.filter(scope.audit_q()))
    revisions = (
        AuditRun.objects.filter(date=run.date)
        .order_by("-revision")
        .only("id", "revision", "status", "finality")
    )
    evidence_counts = {
        row["kind"]: row["n"]
        for row in run.evidence.filter(scope.audit_q())
        .values("kind")
        .annotate(n=Count("id"))
        .order_by("kind")
    }
    rows = [
        {
            "window": w,
            "metrics": [w.metrics.get(name) for name in WINDOW_COLUMNS],
        }
        for w in windows
    ]
    warnings = [{**w, "text": WARNING_TEXT.get(w["code"], w["code"])} for w in run.warnings or []]
    ctx = {
        "run": run,
        "headline": headline(run, warnings, evidence_counts),
        "warnings": warnings,
        "rows": rows,
        "columns": WINDOW_COLUMNS,
        "charts": hourly_charts(windows),
        "totals": readable_totals(run.totals or {}),
        "revisions": revisions,
        "evidence_counts": sorted(evidence_counts.items()),
        "gaps": run.input_gaps.filter(scope.audit_q(with_exchange=False))[:100],
        "recoverable_count": evidence_counts.get("recoverable", 0),
        "can_replay_recoverable": bool(evidence_counts.get("recoverable"))
        and scope.has_role(Role.OPERATOR),
    }
    return render(request, "audits/detail.html", ctx)


@team_scoped
@login_required
@viewer_required
@require_GET
def audit_evidence(request, pk):
    scope = scope_of(request)
    run = get_object_or_404(AuditRun, pk=pk)
    form = EvidenceFilterForm(request.GET)
    rows, next_after = [], None
    if form.is_valid():
        queryset = form.apply(run.evidence.filter(scope.audit_q()).order_by("id"))
        after = anchor_of(request, "after")
        if after is not None:
            queryset = queryset.filter(id__gt=after)
        rows = list(queryset[: EVIDENCE_PER_PAGE + 1])
        if len(rows) > EVIDENCE_PER_PAGE:
            rows = rows[:EVIDENCE_PER_PAGE]
            next_after = rows[-1].pk
    # A store row may be gone (retention): link only the ones still there.
    stored = set(
        Message.objects.filter(pk__in=[r.store_id for r in rows if r.store_id]).values_list(
            "pk", flat=True
        )
    )
    query = request.GET.copy()
    query.pop("after", None)
    ctx = {
        "run": run,
        "form": form,
        "rows": rows,
        "stored": stored,
        "next_after": next_after,
        "query": query.urlencode(),
    }
    template = "audits/evidence.html"
    if request.htmx and request.htmx.target == "evidence-table":
        template += "#evidence-table"
    return render(request, template, ctx)


@team_scoped
@login_required
@operator_required
@require_POST
def audit_replay_recoverable(request, pk):
    """One replay job of the run's recoverable messages (``AuditRun.recoverable_ids``), with the
    job defaults (canary, breaker); a team member's covers their team's windows only. 404 when
    the run found nothing recoverable the caller may see."""
    run = get_object_or_404(AuditRun, pk=pk)
    try:
        job, count = replay_recoverable(run, request.user, scope_of(request), via="console")
    except NothingRecoverable as error:
        raise Http404(str(error)) from None
    except RecoverableGone:
        flash.error(request, "No recoverable message of this audit is in the store any more.")
        return redirect("audit", pk=run.pk)
    except ValidationError as error:
        flash.error(request, "Could not start the replay: " + "; ".join(error.messages))
        return redirect("audit", pk=run.pk)
    flash.success(
        request,
        f"Job #{job.pk} queued: the {count} recoverable message(s) of audit {run.date} "
        f"r{run.revision}, {describe_target(job)}.",
    )
    return redirect("job", pk=job.pk)
