"""Two messages side by side: where their properties, headers and bodies differ."""

import difflib

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.access import viewer_required
from console.views.message import display_rows, message_body_views
from recovery.masking.policy import log_body_view, view_of, with_unmask
from recovery.models import scope_of, team_scoped

# difflib is quadratic in the worst case: bodies are compared on their first lines only.
DIFF_LINES = 2000


def _ids(request):
    try:
        return int(request.GET["a"]), int(request.GET["b"])
    except (KeyError, ValueError) as exc:
        raise Http404("Compare needs two message ids, a and b.") from exc


def table_diff(a, b):
    """Rows (name, a's value, b's value, differs) over the names of both tables."""
    left, right = {n: v for n, _t, v in a}, {n: v for n, _t, v in b}
    absent = "(absent)"
    return [
        (name, left.get(name, absent), right.get(name, absent), left.get(name) != right.get(name))
        for name in sorted(left.keys() | right.keys())
    ]


def body_text(views):
    """The form of a body an operator compares: decoded where it decodes, else the pretty JSON,
    the text or the hex dump (the same form the detail page shows first)."""
    if views["default"] == "decoded":
        return views["decoded_text"], views["decoded"].label
    if views["default"] == "json":
        return views["json"], "json"
    if views["default"] == "text":
        return views["text"], "text"
    return views["hex"], "hex"


def body_diff(a_text, b_text):
    """(kind, line) pairs of a unified diff: kind is same, added, removed or hunk."""
    a_lines, b_lines = a_text.splitlines()[:DIFF_LINES], b_text.splitlines()[:DIFF_LINES]
    lines = []
    for line in list(difflib.unified_diff(a_lines, b_lines, "a", "b", lineterm="", n=3))[2:]:
        kind = {"+": "added", "-": "removed", "@": "hunk"}.get(line[:1], "same")
        lines.append((kind, line))
    return lines


@team_scoped
@login_required
@viewer_required
@require_GET
def message_compare(request):
    a_id, b_id = _ids(request)
    scope, user = scope_of(request), request.user
    messages = with_unmask(scope.messages(), user).filter(pk__in=[a_id, b_id])
    found = {m.pk: m for m in messages}
    if a_id not in found or b_id not in found:
        missing = ", ".join(f"#{i}" for i in (a_id, b_id) if i not in found)
        raise Http404(f"No message {missing} (or it is not yours to see).")
    a, b = found[a_id], found[b_id]
    # Each as the caller may see it (masked, or no body for a metadata-only caller), and each
    # body shown is a body view in the activity log.
    views = {m.pk: view_of(scope, user, m) for m in (a, b)}
    bodies = {}
    for m in (a, b):
        view = views[m.pk]
        if view.bodies:
            bodies[m.pk] = body_text(message_body_views(m, view.masker))
            log_body_view(user, m.pk, "console", "compare", not view.masked)
        else:
            bodies[m.pk] = ("", "metadata only: no body")
    (a_body, a_form), (b_body, b_form) = bodies[a.pk], bodies[b.pk]
    diff = body_diff(a_body or "", b_body or "")
    shown_bodies = views[a.pk].bodies and views[b.pk].bodies
    return render(
        request,
        "messages/compare.html",
        {
            "a": a,
            "b": b,
            "properties": table_diff(
                display_rows(a.properties, times=("timestamp",)),
                display_rows(b.properties, times=("timestamp",)),
            ),
            "headers": table_diff(
                display_rows(views[a.pk].masker.headers(a.headers), skip=("x-death",)),
                display_rows(views[b.pk].masker.headers(b.headers), skip=("x-death",)),
            ),
            "forms": (a_form, b_form),
            "shown_bodies": shown_bodies,
            "diff": diff,
            # Masked bodies are compared as shown: equal stored bytes behind a mask would say
            # that the hidden values are equal.
            "same_body": shown_bodies
            and (
                a_body == b_body
                if views[a.pk].masked or views[b.pk].masked
                else bytes(a.body_bytes) == bytes(b.body_bytes)
            ),
            "cut": max(len((a_body or "").splitlines()), len((b_body or "").splitlines()))
            > DIFF_LINES,
            "diff_lines": DIFF_LINES,
        },
    )
