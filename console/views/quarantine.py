"""Quarantine: what the collector could not store, looked at and sent back or discarded
(recovery/broker/quarantine.py). The messages live in the broker's quarantine queue of each
watched vhost, not in the store."""

import pika.exceptions
from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.access import operator_required, viewer_required
from recovery.bodies import needs_decoding
from recovery.broker import quarantine
from recovery.models import Activity, Privilege, scope_of
from recovery.models.masking import MaskingRules

ACTIONS = {"retry": quarantine.retry, "discard": quarantine.discard}


def _shown_preview(item, masker, bodies):
    if not bodies:
        return "(metadata only: no body)"
    if masker and needs_decoding(
        item.properties.get("content_type"), item.properties.get("content_encoding")
    ):
        return "(masked: an encoded or binary body's preview is not shown while rules apply)"
    if masker.paths and item.size > len(item.preview):
        return "(masked: the preview is cut before the document ends, its paths cannot be masked)"
    return masker.body(item.preview).decode("utf-8", "replace")


@login_required
@viewer_required
@require_GET
def quarantine_list(request):
    sections = []
    # A quarantined delivery belongs to no stored message (nor team): every masking rule applies.
    masker = MaskingRules.load().team_masker(None)
    bodies = scope_of(request).may(Privilege.BODIES)
    for vhost in settings.RECOVERY_VHOSTS:
        try:
            items, depth = quarantine.browse(vhost)
            error = None
        except (pika.exceptions.AMQPError, OSError) as exc:
            items, depth, error = [], None, f"{type(exc).__name__}: {exc}"
        for item in items:
            item.shown_headers = masker.headers(item.headers)
            item.shown_preview = _shown_preview(item, masker, bodies)
        sections.append(
            {
                "vhost": vhost,
                "items": items,
                "depth": depth,
                "error": error,
                "more": depth is not None and depth > len(items),
            }
        )
    return render(
        request,
        "quarantine.html",
        {
            "sections": sections,
            "limit": quarantine.BROWSE_LIMIT,
            "max_body": settings.COLLECTOR_MAX_BODY_BYTES,
        },
    )


@login_required
@operator_required
@require_POST
def quarantine_act(request):
    vhost, key = request.POST.get("vhost", ""), request.POST.get("key", "")
    action = ACTIONS.get(request.POST.get("action", ""))
    if vhost not in settings.RECOVERY_VHOSTS or action is None or not key:
        raise Http404("no such quarantined message or action")
    name = request.POST["action"]
    try:
        item = action(vhost, key)
    except quarantine.NotInQuarantine as exc:
        flash.error(request, f"Nothing done: {exc}.")
    except (pika.exceptions.AMQPError, OSError) as exc:
        flash.error(request, f"Nothing done, the broker said: {type(exc).__name__}: {exc}")
    else:
        Activity.record(
            request.user,
            f"quarantine_{name}",
            detail={
                "vhost": vhost,
                "key": key,
                "source": item.source,
                "reason": item.reason,
                "size": item.size,
                "message_id": item.properties.get("message_id", ""),
            },
            via="console",
        )
        done = (
            f"sent back to {item.source}: the collector takes it again"
            if name == "retry"
            else "discarded for good (it was in no store)"
        )
        flash.success(request, f"Quarantined message {key} {done}.")
    return redirect("quarantine")
