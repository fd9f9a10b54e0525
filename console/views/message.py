"""One message: everything stored about it, and what an operator can do with it."""

import contextlib
import datetime
import json
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import OperationalError, transaction
from django.db.models import Q
from django.http import HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.access import operator_required, viewer_required
from console.forms.reasons import ReasonForm
from console.forms.replay import DiscardForm, EditReplayForm, TargetForm, add_engine_errors
from recovery.bodies import DECODE_FIELDS
from recovery.client import headers as header_codec
from recovery.errors import BrokerUnavailable, ReplayError
from recovery.masking.engine import NO_MASKING
from recovery.masking.policy import log_body_view, view_of, with_unmask
from recovery.models import (
    Message,
    Privilege,
    Role,
    Unmask,
    attach_died_again,
    mark_died_again,
    scope_of,
    team_scoped,
)
from recovery.models.decoders import readable
from recovery.replay import (
    STRIPPED_HEADERS,
    discard_message,
    edit_and_replay,
    replay_message,
    restore_message,
)
from recovery.search.filters import MessageFilterForm, narrow_search, planner_settings

HEX_LIMIT = 64 * 1024
# What the download reads: the body and what says how it is encoded (masking decodes it).
RAW_BODY_FIELDS = ("id", "body", *DECODE_FIELDS)
TEXT_LIMIT = 1024 * 1024


def body_views(body):
    """The body as text, pretty JSON and hex (whichever apply), cut to what a page can hold."""
    views = {"size": len(body), "text": None, "json": None, "hex": None}
    with contextlib.suppress(UnicodeDecodeError):
        views["text"] = body[:TEXT_LIMIT].decode("utf-8")
    views["text_truncated"] = views["text"] is not None and len(body) > TEXT_LIMIT
    if views["text"] is not None and not views["text_truncated"]:
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(views["text"])
            if isinstance(parsed, dict | list):
                views["json"] = json.dumps(parsed, indent=2, ensure_ascii=False)
    shown = body[:HEX_LIMIT]
    views["hex"] = "\n".join(
        f"{offset:08x}  {shown[offset : offset + 16].hex(' '):<47}  "
        + "".join(chr(b) if 32 <= b < 127 else "." for b in shown[offset : offset + 16])
        for offset in range(0, len(shown), 16)
    )
    views["hex_truncated"] = len(body) > len(shown)
    views["default"] = "json" if views["json"] else "text" if views["text"] is not None else "hex"
    return views


def message_body_views(message, masker=NO_MASKING):
    """body_views, plus the decoded form where the properties or an admin's decoder rule name a
    chain (gzip, msgpack, protobuf...): shown first when it decodes; when it does not, the
    reason above the raw forms. ``masker``: the masking rules that apply to the viewer."""
    stored = readable(message)
    views = body_views(masker.stored(message.body_bytes, stored))
    views["decoded"] = None
    decoded = masker.decoded(stored)
    if decoded is not None:
        views["decoded"] = decoded
        views["decoded_text"] = (decoded.text or "")[:TEXT_LIMIT]
        if decoded.error is None and decoded.text is not None:
            views["default"] = "decoded"
    return views


def value_type(value):
    if isinstance(value, dict):
        return value.get(header_codec.TAG) or "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return "null" if value is None else "string"


def display_rows(table, skip=(), times=()):
    """(name, AMQP type, readable value) for stored headers or properties, sorted by name;
    ``times``: integer fields that are POSIX seconds (the AMQP ``timestamp`` property)."""
    rows = []
    for name, value in sorted(table.items()):
        if name in skip:
            continue
        if name in times and isinstance(value, int) and not isinstance(value, bool):
            rows.append((name, "timestamp", _posix_time(value)))
            continue
        shown = header_codec.plain(value)
        if isinstance(shown, dict | list):
            shown = json.dumps(shown, ensure_ascii=False, default=str)
        rows.append((name, value_type(value), "" if shown is None else str(shown)))
    return rows


def _posix_time(seconds):
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{seconds} (not a time)"
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({seconds})"


def death_timeline(message):
    """x-death entries oldest first (RabbitMQ keeps them newest first)."""
    entries = message.x_death
    with contextlib.suppress(TypeError):
        return sorted(entries, key=lambda e: str(e.get("time", "")))
    return list(reversed(entries))


def _duration(seconds):
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def _shown_edits(message, attempts, view):
    """Each edited attempt's copy as this viewer may see it (``shown_headers``/``shown_body``:
    masked, read as the message is; no body without the bodies privilege)."""
    for attempt in attempts:
        edit = getattr(attempt, "edit", None) if attempt.edited else None
        if edit is None:
            continue
        edit.shown_headers = None if edit.headers is None else view.masker.headers(edit.headers)
        edit.shown_body = None
        if edit.body is not None and view.bodies:
            edit.shown_body = view.masker.stored(
                edit.body, readable(message, body=edit.body) if view.masked else None
            )
        edit.body_withheld = edit.body is not None and not view.bodies
    return attempts


def _detail_context(message, scope, user, target_form=None, discard_form=None, error=None):
    exchange, routing_key = message.default_target()
    attach_died_again([message])  # afresh: after a replay the cached answer is stale
    view = view_of(scope, user, message)
    attempts = mark_died_again(message, message.attempts.select_related("user", "edit__user")[:50])
    return {
        "message": message,
        "view": view,
        "unmask_for": _duration(settings.UNMASK_SECONDS),
        "body": message_body_views(message, view.masker) if view.bodies else None,
        "headers": display_rows(view.masker.headers(message.headers), skip=("x-death",)),
        "group_label": view.masker.label(message.group_label, message.headers),
        "properties": display_rows(message.properties, times=("timestamp",)),
        "deaths": death_timeline(message),
        "attempts": _shown_edits(message, attempts, view),
        "activity": message.activity.select_related("user").order_by("-created_at", "-id")[:20],
        # Copies that died again elsewhere (replayed to another team's queue) stay theirs.
        "returns": scope.messages(message.returns.only("id", "collected_at", "status", "reason"))[
            :20
        ],
        "default_exchange": exchange,
        "default_routing_key": routing_key,
        "target_form": target_form or TargetForm(),
        "discard_form": discard_form or DiscardForm(),
        "error": error,
    }


@team_scoped
@login_required
@viewer_required
@require_GET
def message_detail(request, pk):
    message = get_object_or_404(with_unmask(scope_of(request).messages(), request.user), pk=pk)
    context = _detail_context(message, scope_of(request), request.user)
    if context["body"] is not None:
        log_body_view(request.user, message.pk, "console", "detail", not context["view"].masked)
    # The list it came from (filters, page): parsed and encoded again, so it can only ever be a
    # query string for the message list.
    back = QueryDict(request.GET.get("back", ""))
    context["back"] = back.urlencode()
    context["back_suffix"] = "?" + urlencode({"back": context["back"]}) if back else ""
    # Came from a group's page (its links say only group=<key>): back there, not to the list.
    context["back_group"] = back["group"] if list(back) == ["group"] else None
    context["newer"], context["older"] = list_neighbours(message, back, scope_of(request))
    return render(request, "messages/detail.html", context)


NEIGHBOUR_TIMEOUT_MS = 2000


def list_neighbours(message, back, scope):
    """The ids of the messages just newer and just older than ``message`` in the list ``back``
    names (its filters and search, newest first, as the list orders them), for previous/next
    links that keep the filter; (None, None) when there is no list, or its search is too slow to
    repeat within NEIGHBOUR_TIMEOUT_MS (the links are left out, the page still answers)."""
    if not back:
        return None, None
    form = MessageFilterForm(back)
    if not form.is_valid():
        return None, None
    # With the scope: a metadata-only caller's search reads no body here either.
    rows = scope.messages(form.apply(Message.objects.all(), scope))
    at, pk = message.collected_at, message.pk
    try:
        with transaction.atomic(), planner_settings(statement_timeout=NEIGHBOUR_TIMEOUT_MS):
            rows = narrow_search(rows, form.cleaned_data)
            newer = (
                rows.filter(Q(collected_at__gt=at) | Q(collected_at=at, id__gt=pk))
                .order_by("collected_at", "id")
                .values_list("id", flat=True)
                .first()
            )
            older = (
                rows.filter(Q(collected_at__lt=at) | Q(collected_at=at, id__lt=pk))
                .order_by("-collected_at", "-id")
                .values_list("id", flat=True)
                .first()
            )
    except OperationalError:
        return None, None
    return newer, older


def _status_response(request, message, error=None, status=200, target_form=None, notice=None):
    """The actions box for htmx (with the error or notice in it), or back to the whole page
    with the error or notice as a flash message."""
    message.refresh_from_db()
    if request.htmx:
        ctx = _detail_context(
            message, scope_of(request), request.user, target_form=target_form, error=error
        )
        ctx["notice"] = notice
        return render(request, "messages/detail.html#actions", ctx, status=status)
    if error:
        flash.error(request, error)
    elif notice:
        flash.info(request, notice)
    return redirect("message", pk=message.pk)


def _error_text(exc):
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            return "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        return "; ".join(exc.messages)
    return str(exc)


@team_scoped
@login_required
@operator_required
@require_POST
def message_replay(request, pk):
    """One-click replay, to the default target or the one chosen in the target form."""
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    form = TargetForm(request.POST)
    if not form.is_valid():
        error = " ".join(" ".join(e) for e in form.errors.values())
        return _status_response(request, message, error, 400, target_form=form)
    try:
        attempt = replay_message(message, user=request.user, via="console", **form.target())
    except (ValidationError, ReplayError) as exc:
        status = 503 if isinstance(exc, BrokerUnavailable) else 409
        return _status_response(request, message, _error_text(exc), status, target_form=form)
    if attempt.outcome != "confirmed":
        return _status_response(
            request, message, f"Replay {attempt.outcome}: {attempt.detail}", 200
        )
    notice = f"Replayed to {attempt.exchange or '(default)'} / {attempt.routing_key}; " + (
        attempt.detail or "the broker confirmed it."
    )
    return _status_response(request, message, notice=notice)


def _call_or_error(function, *args, **kwargs):
    try:
        function(*args, **kwargs)
    except (ValidationError, ReplayError) as exc:
        return _error_text(exc)
    return None


@team_scoped
@login_required
@operator_required
@require_POST
def message_discard(request, pk):
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    form = DiscardForm(request.POST)
    form.is_valid()
    reason = form.cleaned_data.get("reason", "")
    error = _call_or_error(discard_message, message, request.user, "console", reason)
    return _status_response(request, message, error, 409 if error else 200)


@team_scoped
@login_required
@operator_required
@require_POST
def message_restore(request, pk):
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    error = _call_or_error(restore_message, message, request.user, "console")
    return _status_response(request, message, error, 409 if error else 200)


def editable_headers(message):
    """The stored headers minus those a replay strips anyway, as pretty tagged JSON."""
    shown = {k: v for k, v in message.headers.items() if k not in STRIPPED_HEADERS}
    return json.dumps(shown, indent=2, ensure_ascii=False, sort_keys=True)


@team_scoped
@login_required
@operator_required
@require_http_methods(["GET", "POST"])
def message_edit(request, pk):
    """Edit headers/body/target and replay once; the stored original is never changed."""
    message = get_object_or_404(scope_of(request).messages(minimum=Role.OPERATOR), pk=pk)
    view = view_of(scope_of(request), request.user, message)
    if not view.bodies or view.masked:
        # Editing a masked rendering would send the masks: edit from the unmasked view only.
        flash.error(
            request,
            "Edit and replay needs the body unmasked: "
            + (
                "unmask this message first (with a reason)."
                if view.bodies and view.may_unmask
                else "you may not read this message's body unmasked."
            ),
        )
        return redirect("message", pk=message.pk)
    log_body_view(request.user, message.pk, "console", "edit", True)
    body = body_views(message.body_bytes)
    body_editable = body["text"] is not None and not body["text_truncated"]
    # A decodable document is edited decoded unless the operator asked for the raw text.
    decoded = readable(message)
    raw = (request.POST if request.method == "POST" else request.GET).get("raw") == "1"
    as_decoded = decoded if decoded is not None and decoded.editable and not raw else None
    if request.method == "POST":
        form = EditReplayForm(request.POST, body_editable=body_editable, decoded=as_decoded)
        if form.is_valid():
            try:
                attempt = edit_and_replay(
                    message,
                    request.user,
                    headers_json=form.cleaned_data["headers"],
                    body=form.body_bytes(),
                    via="console",
                    **form.target(),
                )
            except (ValidationError, ReplayError) as exc:
                if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
                    add_engine_errors(form, exc)
                else:
                    form.add_error(None, _error_text(exc))
            else:
                level = flash.SUCCESS if attempt.outcome == "confirmed" else flash.WARNING
                flash.add_message(
                    request, level, f"Edited replay {attempt.outcome}. {attempt.detail}".strip()
                )
                return redirect("message", pk=message.pk)
    else:
        shown = as_decoded.text if as_decoded is not None else body["text"] or ""
        form = EditReplayForm(
            initial={"headers": editable_headers(message), "body": shown},
            body_editable=body_editable,
            decoded=as_decoded,
        )
    exchange, routing_key = message.default_target()
    ctx = {
        "message": message,
        "form": form,
        "default_exchange": exchange,
        "default_routing_key": routing_key,
        "decoded": decoded,
        "as_decoded": as_decoded is not None,
        "raw": raw,
        "body_editable": body_editable,
    }
    return render(request, "messages/edit.html", ctx)


@team_scoped
@login_required
@viewer_required
@require_GET
def message_body(request, pk):
    """The body bytes (masked as the viewer sees them) as a download: never rendered inline,
    whatever its content type says."""
    message = get_object_or_404(
        scope_of(request).messages(Message.objects.only(*RAW_BODY_FIELDS)),
        pk=pk,
    )
    view = view_of(scope_of(request), request.user, message)
    if not view.bodies:
        raise PermissionDenied("your role shows metadata only: no bodies")
    log_body_view(request.user, message.pk, "console", "download", not view.masked)
    body = view.masker.stored(message.body_bytes, readable(message) if view.masked else None)
    response = HttpResponse(body, content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="message-{message.pk}.bin"'
    return response


@team_scoped
@login_required
@viewer_required
@require_POST
def message_unmask(request, pk):
    """Break-glass: the caller, holding the unmask privilege, reads this message unmasked for
    UNMASK_SECONDS, for the reason they state (recorded with them and the time)."""
    message = get_object_or_404(scope_of(request).messages(), pk=pk)
    if not scope_of(request).may(Privilege.UNMASK, message):
        raise PermissionDenied("unmasking needs the unmask privilege")
    reasons = ReasonForm(request.POST)
    try:
        if not reasons.is_valid():
            raise ValidationError(reasons.error_text())
        unmask = Unmask.grant(request.user, message, reasons.cleaned_data["reason"])
    except ValidationError as exc:
        flash.error(request, _error_text(exc))
    else:
        flash.warning(
            request,
            f"Unmasked until {unmask.expires_at:%H:%M:%S} UTC; this is in the activity log.",
        )
    return redirect("message", pk=message.pk)
