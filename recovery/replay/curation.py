"""What an operator does to stored messages besides a plain replay: discard (soft, restorable)
and restore, one message or every match of a filter, and edit-then-replay. Every change is
written to the activity log with the user, one row per message."""

import binascii
import json
import time

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from recovery.client import headers as header_codec
from recovery.errors import StateError
from recovery.models import (
    DISCARDABLE,
    RESTORABLE,
    Activity,
    Message,
    MessageHistory,
    ReplayJobItem,
    Role,
    Status,
)
from recovery.replay.one import holding_job, replay_message
from recovery.search.filters import apply_filters


def _locked(message, statuses):
    """The message row, locked, if its status is one of ``statuses``; else StateError."""
    row = Message.objects.select_for_update().filter(pk=message.pk).first()
    if row is None:
        raise StateError(f"message {message.pk} no longer exists")
    if row.status not in statuses:
        raise StateError(
            f"message {message.pk} is {row.status}; only {', '.join(statuses)} messages can be "
            "changed this way"
        )
    job_id = holding_job(message.pk)
    if job_id is not None:
        raise StateError(f"message {message.pk} is being replayed by job #{job_id}")
    return row


def discard_message(message, user, via="console", reason="", team=None):
    """Soft-discard a pending, poisoned or replayed message; ``restore_message`` undoes it.

    Discarded messages are never replayed (not even by a job that selected them earlier) and
    retention deletes them after RETENTION_DAYS. Raises StateError (a ValidationError and a
    ReplayError) if the message is replaying, already discarded, or held by a running job.
    Returns the updated Message. Logged as ``discard`` with the reason (``team``: the team the
    caller's API token acts as, Scope.acting_team).
    """
    reason = (reason or "").strip()[:1000]
    with transaction.atomic():
        row = _locked(message, DISCARDABLE)
        now = timezone.now()
        Message.objects.filter(pk=row.pk).update(
            status=Status.DISCARDED,
            status_before_discard=row.status,
            discarded_at=now,
            status_reason=reason,
            updated_at=now,
        )
        Activity.record(
            user,
            "discard",
            detail={"reason": reason, "previous_status": row.status, "message": row.pk},
            via=via,
            message=row,
            team=team,
        )
        MessageHistory.record_messages([row.pk], "discard", user=user, via=via, detail=reason)
    return Message.objects.get(pk=row.pk)


# Messages per transaction of a discard or restore by filter, and how long one call works
# before it reports back (a console request or an API call; the caller calls again for the rest).
BY_FILTER_BATCH = 500
BY_FILTER_BUDGET_S = 5.0


def names_a_filter(filters):
    """Whether cleaned filter data names at least one filter (by-filter changes need one)."""
    return any(value not in (None, "") for value in filters.values())


def _by_filter(
    user,
    via,
    action,
    filters,
    statuses,
    column,
    updates,
    detail,
    budget_s,
    batch,
    history_detail,
    scope=None,
):
    """``action`` for every message in ``statuses`` matching ``filters`` (cleaned filter data,
    at least one filter), in batches of ``batch``, oldest id first, for about ``budget_s``
    seconds (at least one batch): each batch's messages get ``updates(now)`` (an update's
    fields) and an ``action`` activity row each, with ``detail(id, value of column)``, and a
    history row each (MessageHistory, with ``history_detail``).

    Returns ``(changed, remaining)``: ``remaining`` still match (beyond the budget, held by a
    running job, or locked by a replay at that moment); call again for them. Each batch is one
    transaction that locks its messages first and only then looks for a job's claim, as the
    one-message actions do (``_locked``), so a message a job or a one-click replay holds is
    skipped, never changed under it.
    """
    if not names_a_filter(filters):
        raise ValidationError({"filters": "name at least one filter: this changes every match"})
    team = scope.acting_team if scope is not None else None
    matching = apply_filters(Message.objects.filter(status__in=statuses), filters, scope)
    if scope is not None:  # a team caller: only what they operate on
        matching = matching.filter(scope.q(Role.OPERATOR))
    deadline = time.monotonic() + (BY_FILTER_BUDGET_S if budget_s is None else budget_s)
    batch = batch or BY_FILTER_BATCH
    changed, after = 0, 0
    while True:  # at least one batch per call, so every call gets somewhere
        with transaction.atomic():
            rows = list(
                matching.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True, of=("self",))
                .values_list("pk", column)[:batch]
            )
            if not rows:
                break
            after = rows[-1][0]
            held = set(
                ReplayJobItem.objects.filter(
                    message_id__in=[pk for pk, _value in rows],
                    state=ReplayJobItem.State.CLAIMED,
                ).values_list("message_id", flat=True)
            )
            rows = [(pk, value) for pk, value in rows if pk not in held]
            now = timezone.now()
            Message.objects.filter(pk__in=[pk for pk, _value in rows]).update(**updates(now))
            Activity.record_many(
                Activity.entry(
                    user, action, detail=detail(pk, value), via=via, message=pk, team=team
                )
                for pk, value in rows
            )
            MessageHistory.record_messages(
                [pk for pk, _value in rows], action, user=user, via=via, detail=history_detail
            )
            changed += len(rows)
        if time.monotonic() >= deadline:
            break
    return changed, matching.count()


def discard_matching(
    user, filters, via="console", reason="", budget_s=None, batch=None, scope=None
):
    """Soft-discard the pending, poisoned and replayed messages matching ``filters``, as
    ``discard_message`` does one (restorable, one ``discard`` activity row each), in steps
    (``_by_filter``); ``(discarded, remaining)``."""
    reason = (reason or "").strip()[:1000]
    return _by_filter(
        user,
        via,
        "discard",
        filters,
        DISCARDABLE,
        "status",
        lambda now: {
            "status": Status.DISCARDED,
            "status_before_discard": F("status"),
            "discarded_at": now,
            "status_reason": reason,
            "updated_at": now,
        },
        lambda pk, status: {"reason": reason, "previous_status": status, "message": pk},
        budget_s,
        batch,
        reason,
        scope,
    )


def restore_matching(user, filters, via="console", budget_s=None, batch=None, scope=None):
    """Undo the discard of every discarded message matching ``filters``, as
    ``restore_message`` does one (each gets back the status it had; one ``restore`` activity
    row each), in steps (``_by_filter``); ``(restored, remaining)``."""
    return _by_filter(
        user,
        via,
        "restore",
        filters,
        RESTORABLE,
        "status_before_discard",
        lambda now: {
            "status": Coalesce(NullIf("status_before_discard", Value("")), Value(Status.PENDING)),
            "status_before_discard": "",
            "discarded_at": None,
            "status_reason": "",
            "updated_at": now,
        },
        lambda pk, before: {"restored_status": before or Status.PENDING, "message": pk},
        budget_s,
        batch,
        "restored by filter",
        scope,
    )


def restore_message(message, user, via="console", team=None):
    """Undo a discard: the message gets back the status it had. Logged as ``restore``.

    Raises StateError if the message is not discarded. Returns the updated Message.
    """
    with transaction.atomic():
        row = _locked(message, RESTORABLE)
        status = row.status_before_discard or Status.PENDING
        Message.objects.filter(pk=row.pk).update(
            status=status,
            status_before_discard="",
            discarded_at=None,
            status_reason="",
            updated_at=timezone.now(),
        )
        Activity.record(
            user,
            "restore",
            detail={"restored_status": status, "message": row.pk},
            via=via,
            message=row,
            team=team,
        )
        MessageHistory.record_messages(
            [row.pk], "restore", user=user, via=via, detail=f"restored to {status}"
        )
    return Message.objects.get(pk=row.pk)


def parse_headers(headers_json):
    """Tagged-JSON headers (a dict or JSON text) -> the dict to store; ValidationError if bad."""
    if headers_json is None:
        return None
    if isinstance(headers_json, str | bytes):
        try:
            headers_json = json.loads(headers_json)
        except ValueError as exc:
            raise ValidationError({"headers_json": f"not valid JSON: {exc}"}) from None
    if not isinstance(headers_json, dict):
        raise ValidationError({"headers_json": "headers must be a JSON object"})
    try:
        header_codec.headers_from_json(headers_json)
    except (ValueError, TypeError, KeyError, binascii.Error, ArithmeticError) as exc:
        raise ValidationError({"headers_json": f"not a valid header value: {exc}"}) from None
    return headers_json


def edit_and_replay(
    message,
    user,
    headers_json=None,
    body=None,
    exchange=None,
    routing_key=None,
    via="console",
    queue=None,
    delay_seconds=None,
    scope=None,
):
    """Replay an edited copy of a message; the stored original is never changed.

    ``headers_json``: the headers to send, tagged JSON like Message.headers (a dict or JSON text;
    replay bookkeeping headers are stripped and re-added as for any replay). ``body``: bytes or
    str (sent UTF-8). None keeps the original. Target as for ``replay_message``. The edited
    version and the editor are kept in a MessageEdit linked to the attempt; the activity log
    gets ``edit_replay``. Returns the ReplayAttempt. Raises ValidationError (field
    ``headers_json``/``body``) for bad edits, StateError / BrokerUnavailable as replay_message.
    """
    headers = parse_headers(headers_json)
    if isinstance(body, str):
        body = body.encode()
    elif body is not None and not isinstance(body, bytes | bytearray | memoryview):
        raise ValidationError({"body": "body must be bytes or text"})
    if body is not None:
        body = bytes(body)
    return replay_message(
        message,
        user=user,
        exchange=exchange,
        routing_key=routing_key,
        via=via,
        headers=headers,
        body=body,
        queue=queue,
        delay_seconds=delay_seconds,
        scope=scope,
    )
