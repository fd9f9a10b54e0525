"""The message history: what was done to a message id, still there after retention deleted
the message (recovery.models.history)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.access import viewer_required
from console.forms.history import HistoryFilterForm
from console.views.paging import newest_first_page, query_without
from recovery.models import MessageHistory, scope_of, team_scoped

PAGE_SIZE = 100


@team_scoped
@login_required
@viewer_required
@require_GET
def history_list(request):
    form = HistoryFilterForm(request.GET)
    rows, next_before = [], None
    if form.is_valid():
        queryset = form.apply(MessageHistory.objects.filter(scope_of(request).history_q()))
        page = newest_first_page(queryset, request.GET.get("before"), PAGE_SIZE, "at")
        rows, next_before = MessageHistory.mark_stored(page.rows), page.next_before
    ctx = {
        "form": form,
        "entries": rows,
        "next_before": next_before,
        "query": query_without(request, "before"),
    }
    template = "history.html"
    if request.htmx and request.htmx.target == "history-table":
        template += "#history-table"
    return render(request, template, ctx)
