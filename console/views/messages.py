"""The message list: filters, search, keyset pages, and bulk actions on a selection."""

from urllib.parse import urlencode

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import OperationalError, transaction
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.access import operator_required, viewer_required
from console.forms.reasons import ReasonForm
from console.forms.replay import BulkActionForm
from console.views.paging import anchor_of, newest_first_page, query_without
from recovery.errors import ReplayError
from recovery.export import export_lines, prepare_export
from recovery.models import (
    DISCARDABLE,
    RESTORABLE,
    Message,
    Privilege,
    Role,
    attach_died_again,
    scope_of,
    team_scoped,
)
from recovery.replay import discard_matching, discard_message, restore_matching
from recovery.replay.curation import names_a_filter
from recovery.replay.jobs import create_job
from recovery.search.filters import (
    MIN_SUBSTRING_LENGTH,
    MessageFilterForm,
    apply_filters,
    narrow_search,
    planner_settings,
)

PAGE_SIZE = 50
SEARCH_TIMEOUT_MS = 5000
LIST_COLUMNS = (
    "id",
    "kind",
    "vhost",
    "reason",
    "source_queue",
    "source_exchange",
    "message_id",
    "body_size",
    "status",
    "replay_count",
    "group_key",
    "collected_at",
)


def _page(form, before, scope):
    """One newest-first page. A free-text search gets a time limit: a term made only of very
    common trigrams (short numbers, say) can make PostgreSQL recheck most of the store."""
    queryset = scope.messages(form.apply(Message.objects.only(*LIST_COLUMNS), scope))
    visible = scope.messages()
    if not form.cleaned_data.get("q"):
        page = newest_first_page(queryset, before, PAGE_SIZE, "collected_at", visible=visible)
        return attach_died_again(page.rows), page.next_before
    unsearched = scope.messages(
        apply_filters(Message.objects.only(*LIST_COLUMNS), {**form.cleaned_data, "q": ""}, scope)
    )
    with transaction.atomic(), planner_settings(statement_timeout=SEARCH_TIMEOUT_MS):
        queryset = narrow_search(queryset, form.cleaned_data, unsearched)
        page = newest_first_page(queryset, before, PAGE_SIZE, "collected_at", visible=visible)
    # Outside the search's time limit: one probe of msg_origin per replayed row of the page.
    return attach_died_again(page.rows), page.next_before


@team_scoped
@login_required
@viewer_required
@require_GET
def message_list(request):
    form = MessageFilterForm(request.GET)
    rows, next_before, search_error = [], None, None
    if form.is_valid():
        try:
            rows, next_before = _page(form, anchor_of(request), scope_of(request))
        except OperationalError:
            search_error = (
                f"The search took longer than {SEARCH_TIMEOUT_MS // 1000} s and was stopped. "
                "Narrow it: a queue, a time range, or a longer, rarer term."
            )
    query = query_without(request, "before")
    filter_query = query_without(request, "before", "page")
    ctx = {
        "form": form,
        "messages_page": rows,
        "next_before": next_before,
        "query": query,
        "job_query": filter_query,
        # The detail page's "← Messages" comes back to this list, filter and page included.
        "back_suffix": "?" + urlencode({"back": query}) if query else "",
        "filtered": form.is_valid() and names_a_filter(form.cleaned_data),
        "paged": bool(request.GET.get("before")),
        "min_substring": MIN_SUBSTRING_LENGTH,
        "next": request.get_full_path(),
        "search_error": search_error,
        "can_export": scope_of(request).may(Privilege.EXPORT),
    }
    template = "messages/list.html"
    if request.htmx and request.htmx.target == "message-table":
        template += "#message-table"
    return render(request, template, ctx)


def _back(request, fallback="messages"):
    target = request.POST.get("next", "")
    # A path of this site only: redirect() would take any other text for a view's name (a 500).
    if (
        target.startswith("/")
        and "\x00" not in target
        and url_has_allowed_host_and_scheme(target, {request.get_host()})
    ):
        return HttpResponseRedirect(target)
    return redirect(fallback)


@team_scoped
@login_required
@operator_required
@require_POST
def message_bulk(request):
    """Replay, discard or make a job of the selected messages."""
    form = BulkActionForm(request.POST)
    if not form.is_valid():
        for error in form.errors.values():
            flash.error(request, " ".join(error))
        return _back(request)
    ids, action = form.cleaned_data["ids"], form.cleaned_data["action"]
    if action == "compare":
        return redirect(reverse("messages-compare") + "?" + urlencode({"a": ids[0], "b": ids[1]}))
    if action == "job":
        return redirect(reverse("job-new") + "?" + urlencode({"ids": ",".join(map(str, ids))}))
    if action == "replay":
        try:
            job = create_job(request.user, message_ids=ids, via="console", scope=scope_of(request))
        except ValidationError as exc:
            flash.error(request, "; ".join(exc.messages))
            return _back(request)
        flash.success(request, f"Job #{job.pk} replays {len(ids)} selected message(s).")
        return redirect("job", pk=job.pk)
    return _discard_many(request, ids, form.cleaned_data["reason"])


def _discard_many(request, ids, reason):
    discarded, refused = 0, []
    operable = scope_of(request).messages(minimum=Role.OPERATOR)
    for message in operable.filter(pk__in=ids).defer("body"):
        try:
            discard_message(message, request.user, "console", reason)
            discarded += 1
        except (ValidationError, ReplayError) as exc:
            refused.append(f"#{message.pk}: {exc}")
    if discarded:
        flash.success(request, f"Discarded {discarded} message(s).")
    for line in refused:
        flash.error(request, line)
    return _back(request)


# What the by-filter page does, per action: the function, which statuses it changes, words.
BY_FILTER = {
    "discard": (discard_matching, DISCARDABLE, "Discarded", "pending, poisoned or replayed"),
    "restore": (restore_matching, RESTORABLE, "Restored", "discarded"),
}


@team_scoped
@login_required
@operator_required
@require_http_methods(["GET", "HEAD", "POST"])
def message_by_filter(request, action):
    """Discard (or restore) everything the list's filter matches: GET counts and asks, POST
    acts (for a few seconds per request; the page offers to go on while some remain)."""
    change, statuses, done, described = BY_FILTER[action]
    form = MessageFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else None
    # The filter as a query without the form's empty fields: for the list and this page's form.
    query = urlencode([(name, value) for name, value in request.GET.items() if value])
    named = filters is not None and names_a_filter(filters)
    changed = None
    if request.method == "POST" and named:
        reasons = ReasonForm(request.POST)
        if not reasons.is_valid():
            flash.error(request, reasons.error_text())
            return redirect(reverse("messages") + "?" + query)
        extra = {"reason": reasons.cleaned_data["reason"]} if action == "discard" else {}
        try:
            changed, remaining = change(
                request.user, filters, "console", scope=scope_of(request), **extra
            )
        except ValidationError as exc:
            flash.error(request, "; ".join(exc.messages))
            return redirect(reverse("messages") + "?" + query)
        flash.success(request, f"{done} {changed} message(s).")
        if not remaining:
            return redirect(reverse("messages") + "?" + query)
    operable = scope_of(request).messages(minimum=Role.OPERATOR)
    count = (
        form.apply(operable.filter(status__in=statuses), scope_of(request)).count() if named else 0
    )
    return render(
        request,
        "messages/by_filter.html",
        {
            "action": action,
            "described": described,
            "form": form,
            "named": named,
            "count": count,
            "continuing": changed is not None,
            "query": query,
            "reason": request.POST.get("reason", ""),
        },
    )


@team_scoped
@login_required
@viewer_required
@require_GET
def message_export(request):
    """The list's filter as JSON Lines with base64 bodies, masked (the export privilege)."""
    form = MessageFilterForm(request.GET)
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return HttpResponse(errors, status=400, content_type="text/plain; charset=utf-8")
    try:
        ids, readable = prepare_export(
            scope_of(request), request.user, form.cleaned_data, "console"
        )
    except ValidationError as exc:
        return HttpResponse(
            " ".join(exc.messages), status=400, content_type="text/plain; charset=utf-8"
        )
    response = StreamingHttpResponse(
        export_lines(ids, readable), content_type="application/x-ndjson"
    )
    response["Content-Disposition"] = 'attachment; filename="lazarus-export.jsonl"'
    return response
