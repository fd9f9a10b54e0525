"""The activity log: who did what, filterable, newest first."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.access import viewer_required
from console.forms.people import ActivityFilterForm
from console.views.paging import anchor_of, newest_first_page, query_without
from recovery.models import Activity, scope_of, team_scoped

PAGE_SIZE = 100


@team_scoped
@login_required
@viewer_required
@require_GET
def activity_list(request):
    form = ActivityFilterForm(request.GET)
    rows, next_before = [], None
    if form.is_valid():
        queryset = scope_of(request).activity(
            form.apply(Activity.objects.select_related("user", "message", "job", "acting_team"))
        )
        visible = scope_of(request).activity(Activity.objects.all())
        page = newest_first_page(
            queryset, anchor_of(request), PAGE_SIZE, "created_at", visible=visible
        )
        rows, next_before = page.rows, page.next_before
    ctx = {
        "form": form,
        "entries": rows,
        "next_before": next_before,
        "query": query_without(request, "before"),
        "actions": [value for value, _label in ActivityFilterForm.ACTIONS if value],
    }
    template = "activity.html"
    if request.htmx and request.htmx.target == "activity-table":
        template += "#activity-table"
    return render(request, template, ctx)
