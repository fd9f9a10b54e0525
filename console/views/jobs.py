"""Replay jobs: create (with a dry-run preview), watch progress live, cancel, resume."""

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.access import operator_required, viewer_required
from console.forms.replay import MAX_BULK_IDS, JobForm, add_engine_errors
from console.views.paging import anchor_of, newest_first_page, query_without
from recovery.errors import ReplayError
from recovery.masking.policy import privacy_of
from recovery.models import (
    ReplayJob,
    ReplayJobItem,
    Role,
    scope_of,
    team_scoped,
)
from recovery.replay.jobs import create_job, describe_target, dry_run, resume_job
from recovery.replay.safety import job_breaker
from recovery.search.details import group_details

PAGE_SIZE = 50
POLL_SECONDS = 1


@team_scoped
@login_required
@viewer_required
@require_GET
def job_list(request):
    jobs = scope_of(request).jobs(ReplayJob.objects.select_related("created_by"))
    page = newest_first_page(jobs, anchor_of(request), PAGE_SIZE, "created_at", visible=jobs)
    any_active = any(job.is_active for job in page.rows)
    ctx = {
        "jobs": page.rows,
        "next_before": page.next_before,
        "query": query_without(request, "before"),
        "poll": any_active,
        "poll_seconds": POLL_SECONDS,
    }
    template = "jobs/list.html"
    if request.htmx and request.htmx.target == "job-table":
        template += "#job-table"
    return render(request, template, ctx)


def _selection_summary(form, scope):
    """What the job will replay, in words, for the form page."""
    if not form.is_valid():
        return ""
    selection = form.selection()
    if "message_ids" in selection:
        return f"{len(selection['message_ids'])} selected message(s)"
    if "group_key" in selection:
        key = selection["group_key"]
        # As the caller may see it: masked as the group's newest message's headers.
        detail = group_details([key], scope.where_sql(), privacy_of(scope)).get(key)
        return f"failure group {detail['label'] if detail else key}"
    return "messages matching " + ", ".join(f"{k}={v}" for k, v in selection["filters"].items())


@team_scoped
@login_required
@viewer_required
@require_http_methods(["GET", "POST"])
def job_new(request):
    """The job form. GET with ``preview`` runs a dry run; POST (operators) starts the job."""
    scope = scope_of(request)
    if request.method == "POST" and not scope.has_role(Role.OPERATOR):
        raise PermissionDenied("requires the operator role")
    if request.method == "POST":
        form = JobForm(request.POST)
        if form.is_valid():
            try:
                job = create_job(
                    request.user, **form.selection(), **form.options(), via="console", scope=scope
                )
            except ValidationError as exc:
                add_engine_errors(form, exc)
            else:
                flash.success(request, f"Job #{job.pk} queued: {describe_target(job)}.")
                return redirect("job", pk=job.pk)
        preview = None
    else:
        form = JobForm(request.GET or None)
        preview = None
        # A page opened with a selection (a group's "Replay group…", the list's "New job…", a
        # cancelled job's "Replay the rest…") shows what it would send before "Start job".
        if (request.GET.get("preview") or _names_selection(request.GET)) and form.is_valid():
            try:
                preview = dry_run(scope, **form.selection(), **form.options())
            except ValidationError as exc:
                add_engine_errors(form, exc)
    if preview is not None:
        preview = {"targets": preview, "total": sum(row["count"] for row in preview)}
    ctx = {
        "form": form,
        "preview": preview,
        "summary": _selection_summary(form, scope),
        "defaults": {
            "canary": settings.REPLAY_CANARY_MAX_FAILURE_PCT,
            "breaker": settings.REPLAY_BREAKER_THRESHOLD_PCT,
        },
    }
    template = "jobs/new.html"
    if request.htmx and request.htmx.target == "preview":
        template += "#preview"
    return render(request, template, ctx)


def _names_selection(query):
    return any(query.get(name) for name in ("ids", "group", *JobForm.FILTER_FIELDS))


def rest_query(job):
    """The new-job query that selects what a cancelled job did not send: its unsent items for a
    job of chosen messages, else its own group or filter (what it sent is no longer pending)."""
    query = QueryDict(mutable=True)
    if job.message_ids:
        unsent = job.items.filter(state=ReplayJobItem.State.PENDING).values_list(
            "message_id", flat=True
        )
        query["ids"] = ",".join(str(pk) for pk in unsent[:MAX_BULK_IDS])
    elif job.group_key:
        query["group"] = job.group_key
    else:
        for name, value in (job.filters or {}).items():
            query[name] = value
    return query.urlencode()


def latest_attempts(job, scope):
    """The job's newest attempts, each saying whether its message died again since (linking
    only to copies the caller may see: one may die in another team's queue)."""
    return job.mark_died_again(
        job.attempts.select_related("message")
        .only("created_at", "exchange", "routing_key", "outcome", "detail", "message__message_id")
        .order_by("-created_at", "-id")[:20],
        scope,
    )


@team_scoped
@login_required
@viewer_required
@require_GET
def job_detail(request, pk):
    job = get_object_or_404(
        scope_of(request).jobs(ReplayJob.objects.select_related("created_by")), pk=pk
    )
    ctx = {
        "job": job,
        "target": describe_target(job),
        "poll_seconds": POLL_SECONDS,
        "attempts": latest_attempts(job, scope_of(request)),
        "died_again": job.died_again(scope=scope_of(request)),
        "breaker": job_breaker(job, settings.REPLAY_BREAKER_MIN_SAMPLE),
        "eta": job.eta_seconds(),
        "canary_wait_left": job.canary_wait_left(),
        "rest_query": rest_query(job) if job.state == ReplayJob.State.CANCELLED else "",
    }
    template = "jobs/detail.html"
    if request.htmx and request.htmx.target == "job-progress":
        template += "#job-progress"
    return render(request, template, ctx)


def _job_action(request, pk, method_name, done_message):
    job = get_object_or_404(scope_of(request).jobs(ReplayJob.objects.all(), Role.OPERATOR), pk=pk)
    error = None
    # A resume looks at the creator's rights again (recovery.replay.jobs.resume_job).
    if method_name == "resume":
        action = lambda user, via: resume_job(job, user, via)  # noqa: E731
    else:
        action = getattr(job, method_name)
    try:
        action(request.user, via="console")
    except (ValidationError, ReplayError) as exc:
        error = "; ".join(getattr(exc, "messages", None) or [str(exc)])
    if request.htmx:
        job.refresh_from_db()
        ctx = {
            "job": job,
            "poll_seconds": POLL_SECONDS,
            "error": error,
            "attempts": latest_attempts(job, scope_of(request)),
            "died_again": job.died_again(scope=scope_of(request)),
            "breaker": job_breaker(job, settings.REPLAY_BREAKER_MIN_SAMPLE),
            "eta": job.eta_seconds(),
            "canary_wait_left": job.canary_wait_left(),
            "rest_query": rest_query(job) if job.state == ReplayJob.State.CANCELLED else "",
        }
        return render(request, "jobs/detail.html#job-progress", ctx, status=409 if error else 200)
    if error:
        flash.error(request, error)
    else:
        flash.success(request, done_message.format(job=job))
    return redirect("job", pk=job.pk)


@team_scoped
@login_required
@operator_required
@require_POST
def job_cancel(request, pk):
    return _job_action(request, pk, "cancel", "Job #{job.pk} cancelled.")


@team_scoped
@login_required
@operator_required
@require_POST
def job_resume(request, pk):
    return _job_action(request, pk, "resume", "Job #{job.pk} resumed.")
