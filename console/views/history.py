"""The message history: what was done to a message id, still there after retention deleted
the message (recovery.models.history)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.access import viewer_required
from console.forms.history import HistoryFilterForm
from console.views.paging import anchor_of, newest_first_page, query_without
from recovery.masking.policy import privacy_of
from recovery.models import MessageHistory, scope_of, team_scoped
from recovery.models.masking import MaskingRules
from recovery.search.details import group_details

PAGE_SIZE = 100


@team_scoped
@login_required
@viewer_required
@require_GET
def history_list(request):
    form = HistoryFilterForm(request.GET)
    rows, next_before = [], None
    if form.is_valid():
        visible = MessageHistory.objects.filter(scope_of(request).history_q())
        page = newest_first_page(
            form.apply(visible), anchor_of(request), PAGE_SIZE, "at", visible=visible
        )
        rows, next_before = MessageHistory.mark_stored(page.rows), page.next_before
        rows = masked_rows(rows, scope_of(request))
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


def masked_rows(rows, scope):
    """A page's group labels and details as the caller may see them (docs/security.md,
    "Private data"): a label is made from exception headers, so it is masked as its group's
    newest message's headers are (one probe per group shown); a group with no message left has
    no headers to cut out, so every rule applies and an exception header rule masks the
    label's exception part whole. A detail (a discard's reason, a broker's refusal) is free
    text that may quote content: every rule's regular expressions. In memory only."""
    rules = MaskingRules.load()
    if not rules or not rows:
        return rows
    keys = sorted({row.group_key for row in rows if row.group_key})
    details = group_details(keys, scope.where_sql(), privacy_of(scope, rules), samples=False)
    masker = rules.team_masker(None)
    for row in rows:
        detail = details.get(row.group_key)
        if detail is not None:
            row.group_label = detail["label"]
        else:
            row.group_label = masker.label_without_headers(row.group_label)
        row.detail = masker.free_text(row.detail)
    return rows
