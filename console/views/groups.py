"""Failure groups: messages that failed the same way (queue + reason + exception fingerprint)."""

import datetime
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import BinaryField, Max, Q
from django.db.models.functions import Substr
from django.http import Http404
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.access import viewer_required
from console.views.paging import anchor_of, newest_first_page
from recovery.bodies import DECODE_FIELDS
from recovery.masking.policy import log_body_views, privacy_of
from recovery.models import (
    DecoderRule,
    Kind,
    Message,
    MessageCount,
    MessageTotal,
    Reason,
    attach_died_again,
    scope_of,
    team_scoped,
)
from recovery.search.details import SAMPLE_BYTES, group_details, shown_sample
from recovery.search.groups import group_counts
from recovery.search.overview import hourly_sparks

PAGE_SIZE = 100
NEW_GROUP_AGE = datetime.timedelta(hours=1)
TREND_HOURS = 24


class GroupFilterForm(forms.Form):
    SORTS = [("open", "most open"), ("total", "most messages"), ("recent", "most recent")]
    queue = forms.CharField(required=False, max_length=255)
    kind = forms.ChoiceField(choices=[("", "any")] + list(Kind.choices), required=False)
    reason = forms.ChoiceField(choices=[("", "any")] + list(Reason.choices), required=False)
    open_only = forms.BooleanField(required=False, label="With open messages only")
    sort = forms.ChoiceField(choices=SORTS, required=False)
    # Bounded: OFFSET takes a bigint, and no one pages a million deep (sort or filter instead).
    page = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, widget=forms.HiddenInput
    )

    def apply(self, queryset):
        data = self.cleaned_data
        if data.get("queue"):
            queryset = queryset.filter(
                Q(source_queue=data["queue"]) | Q(source_exchange=data["queue"])
            )
        if data.get("kind"):
            queryset = queryset.filter(kind=data["kind"])
        if data.get("reason"):
            queryset = queryset.filter(reason=data["reason"])
        return queryset


def group_rows(form, scope):
    # The totals, not the hours: a row per key (tens of thousands at 10k groups, not ~450k),
    # with each key's newest time kept (recovery.models.MessageTotal) for "most recent".
    return group_counts(
        form.apply(MessageTotal.objects.filter(scope.q())),
        open_only=form.cleaned_data.get("open_only"),
    )


@team_scoped
@login_required
@viewer_required
@require_GET
def group_list(request):
    form = GroupFilterForm(request.GET)
    groups, has_more, page = [], False, 1
    if form.is_valid():
        page = form.cleaned_data.get("page") or 1
        sort = form.cleaned_data.get("sort") or "open"
        scope = scope_of(request)
        rows = group_rows(form, scope)
        if sort == "recent":
            rows = rows.annotate(newest=Max("last_at")).order_by("-newest", "group_key")
        elif sort == "total":
            rows = rows.order_by("-total", "group_key")
        else:
            rows = rows.order_by("-open", "-total", "group_key")
        chunk = list(rows[(page - 1) * PAGE_SIZE : page * PAGE_SIZE + 1])
        has_more = len(chunk) > PAGE_SIZE
        chunk = chunk[:PAGE_SIZE]
        details = group_details(
            [row["group_key"] for row in chunk], scope.where_sql(), privacy_of(scope)
        )
        # A group whose messages are all gone (retention) has no details: it is not shown.
        groups = [
            {**row, **details[row["group_key"]]} for row in chunk if row["group_key"] in details
        ]
        # Trend: messages collected per hour over the last day, from the hourly counts.
        sparks = hourly_sparks(
            MessageCount.objects.filter(scope.q(), group_key__in=[g["group_key"] for g in groups]),
            timezone.now(),
            TREND_HOURS,
        )
        for group in groups:
            group["trend"] = sparks.get(group["group_key"], [0] * TREND_HOURS)
    query = request.GET.copy()
    query.pop("page", None)
    ctx = {
        "form": form,
        "groups": groups,
        # A group first seen this recently is marked "new".
        "new_since": timezone.now() - NEW_GROUP_AGE,
        "page": page,
        "has_more": has_more,
        "query": query.urlencode(),
    }
    template = "groups/list.html"
    if request.htmx and request.htmx.target == "group-table":
        template += "#group-table"
    return render(request, template, ctx)


GROUP_PAGE_SIZE = 50


@team_scoped
@login_required
@viewer_required
@require_GET
def group_detail(request, key):
    """One failure group: a header card (reason, exception, queue, counts, first and last seen,
    a sample) and its messages, newest first, with a body preview each."""
    if "\x00" in key:  # no key has one, and PostgreSQL refuses NUL in text (a 500)
        raise Http404("No such failure group (or none of its messages is yours to see).")
    scope = scope_of(request)
    counts = next(iter(group_counts(MessageTotal.objects.filter(scope.q(), group_key=key))), None)
    privacy = privacy_of(scope)
    details = group_details([key], scope.where_sql(), privacy)
    if counts is None or key not in details:
        raise Http404("No such failure group (or none of its messages is yours to see).")
    messages = scope.messages(
        Message.objects.filter(group_key=key)
        .only(
            "id",
            "status",
            "message_id",
            "body_size",
            "collected_at",
            "replay_count",
            "vhost",
            "source_queue",
            "source_exchange",
            # How the body decodes: a masked preview is read through the decoder chain.
            *DECODE_FIELDS,
        )
        .annotate(preview=Substr("body", 1, SAMPLE_BYTES, output_field=BinaryField()))
    )
    page = newest_first_page(
        messages, anchor_of(request), GROUP_PAGE_SIZE, "collected_at", visible=scope.messages()
    )
    rows = attach_died_again(page.rows)
    decoders = list(DecoderRule.objects.all())
    shown = {}  # message id -> shown unmasked: the page's body reads, for the activity log
    for row in rows:
        # As the caller may see it: masked, or nothing for a metadata-only caller.
        masker, bodies = privacy(row.vhost, row.source_queue, row.source_exchange)
        row.preview_line = shown_sample(row, masker, bodies, decoders)
        if bodies:
            shown[row.pk] = not masker
    group = details[key]
    if group["sample_read"]:
        shown.setdefault(group["sample_id"], not group["sample_masked"])
    log_body_views(request.user, shown, "group_preview")
    back = urlencode({"group": key})
    return render(
        request,
        "groups/detail.html",
        {
            "key": key,
            "group": {**counts, **details[key]},
            "new_since": timezone.now() - NEW_GROUP_AGE,
            "messages_page": rows,
            "next_before": page.next_before,
            "paged": bool(request.GET.get("before")),
            # Each message's page comes back here, and pages through this group.
            "back_suffix": "?" + urlencode({"back": back}),
        },
    )
