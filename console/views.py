import contextlib
import json

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.access import operator_required, viewer_required
from recovery.collector_health import collector_health
from recovery.filters import MessageFilterForm
from recovery.models import Message
from recovery.replay import ReplayError, replay_message

PAGE_SIZE = 50


@login_required
@viewer_required
@require_GET
def message_list(request):
    form = MessageFilterForm(request.GET)
    messages = Message.objects.none()
    if form.is_valid():
        messages = form.apply(Message.objects.defer("body", "headers", "properties"))
    before = request.GET.get("before", "")
    if before.isdigit():
        # Keyset pagination on (collected_at, id): constant time however deep the page.
        anchor = Message.objects.filter(pk=int(before)).values("collected_at", "id").first()
        if anchor:
            messages = messages.filter(collected_at__lte=anchor["collected_at"]).exclude(
                collected_at=anchor["collected_at"], id__gte=anchor["id"]
            )
    page = list(messages[: PAGE_SIZE + 1])
    next_before = page[PAGE_SIZE - 1].pk if len(page) > PAGE_SIZE else None
    query = request.GET.copy()
    query.pop("before", None)
    ctx = {
        "form": form,
        "messages": page[:PAGE_SIZE],
        "next_before": next_before,
        "query": query.urlencode(),
    }
    template = "messages/list.html"
    if request.htmx and request.htmx.target == "message-table":
        template += "#message-table"
    return render(request, template, ctx)


def body_views(body):
    """The body as text, pretty JSON and hex (whichever apply)."""
    views = {"size": len(body), "text": None, "json": None, "hex": None}
    with contextlib.suppress(UnicodeDecodeError):
        views["text"] = body.decode("utf-8")
    if views["text"] is not None:
        with contextlib.suppress(ValueError):
            views["json"] = json.dumps(json.loads(views["text"]), indent=2, ensure_ascii=False)
    shown = body[: 64 * 1024]
    views["hex"] = "\n".join(
        f"{offset:08x}  {shown[offset : offset + 16].hex(' ')}"
        for offset in range(0, len(shown), 16)
    )
    views["hex_truncated"] = len(body) > len(shown)
    return views


@login_required
@viewer_required
@require_GET
def message_detail(request, pk):
    message = get_object_or_404(Message, pk=pk)
    ctx = {
        "message": message,
        "body": body_views(message.body_bytes),
        "headers": {k: v for k, v in message.headers.items() if k != "x-death"},
        "attempts": message.attempts.select_related("user")[:50],
        "target": message.default_target(),
    }
    return render(request, "messages/detail.html", ctx)


@login_required
@operator_required
@require_POST
def message_replay(request, pk):
    message = get_object_or_404(Message, pk=pk)
    error = None
    try:
        replay_message(message, user=request.user)
    except ReplayError as exc:
        error = str(exc)
    message.refresh_from_db()
    status = 200 if error is None else 409
    return render(
        request,
        "messages/detail.html#replay-status",
        {"message": message, "error": error},
        status=status,
    )


@require_GET
def healthz(request):
    report = {"database": {"ok": True}, "broker": {"ok": True}}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["database"] = {"ok": False, "error": str(exc)}
    report["collector"] = collector_health(database_ok=report["database"]["ok"])
    report["broker"] = report["collector"].pop("broker")
    ok = report["database"]["ok"] and report["broker"]["ok"]
    return JsonResponse(report, status=200 if ok else 503)


def favicon(request):
    return HttpResponse(status=204)
