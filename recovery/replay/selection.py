"""Validation of a replay job's arguments: which messages (a filter, ids, a failure group, and
which statuses), and its options (rate, canary, breaker, via). Used by create_job and dry_run;
every error is a ValidationError naming the argument.
"""

import math

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from recovery.models import Message, Status
from recovery.search.filters import MessageFilterForm, apply_filters

VIAS = ("console", "api", "system")
MAX_MESSAGE_IDS = 100_000


# ---- which messages ---------------------------------------------------------------------


def clean_filters(filters):
    """The stored (JSON) filters -> cleaned form data; ValidationError on the field ``filters``."""
    if filters is None:
        return None
    if not isinstance(filters, dict):
        raise ValidationError({"filters": "filters must be an object of filter names to values"})
    form = MessageFilterForm(data=filters)
    unknown = sorted(set(filters) - set(form.fields))
    if unknown:
        raise ValidationError(
            {"filters": f"unknown filter(s): {', '.join(unknown)}; known: {', '.join(form.fields)}"}
        )
    if not form.is_valid():
        raise ValidationError(
            {
                "filters": [
                    f"{field}: {message}"
                    for field, messages in form.errors.items()
                    for message in messages
                ]
            }
        )
    return form


def _clean_ids(message_ids):
    if message_ids is None:
        return None
    if isinstance(message_ids, str | bytes) or not hasattr(message_ids, "__iter__"):
        raise ValidationError({"message_ids": "a list of message ids"})
    ids = []
    for value in message_ids:
        if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < 1:
            raise ValidationError({"message_ids": f"{value!r} is not a message id"})
        ids.append(int(value))
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValidationError({"message_ids": "no message ids given"})
    if len(ids) > MAX_MESSAGE_IDS:
        raise ValidationError(
            {"message_ids": f"at most {MAX_MESSAGE_IDS} ids; use a filter for more"}
        )
    return ids


def allowed_statuses(filter_status, message_ids, include_poisoned):
    statuses = [Status.PENDING.value]
    if include_poisoned:
        statuses.append(Status.POISONED.value)
    if message_ids or filter_status == Status.REPLAYED:
        statuses.append(Status.REPLAYED.value)
    if filter_status in (Status.DISCARDED, Status.REPLAYING):
        raise ValidationError(
            {"filters": f"status={filter_status}: such messages are not replayed by jobs"}
        )
    if filter_status == Status.POISONED and not include_poisoned:
        raise ValidationError(
            {
                "include_poisoned": "status=poisoned selects only poisoned messages; set "
                "include_poisoned to replay them anyway"
            }
        )
    return statuses


def clean_selection(filters, message_ids, group_key, include_poisoned):
    """(cleaned filter data, ids, group key, allowed statuses) or ValidationError."""
    form = clean_filters(filters)
    ids = _clean_ids(message_ids)
    if group_key is not None and (not isinstance(group_key, str) or len(group_key) > 64):
        raise ValidationError({"group_key": "a failure-group key (at most 64 characters)"})
    if not ((form and form.filter_dict()) or ids or group_key):
        raise ValidationError(
            {
                NON_FIELD_ERRORS: "choose the messages: a filter, message ids or a failure group "
                "(to replay every pending message, filter on status=pending)"
            }
        )
    data = form.cleaned_data if form else {}
    statuses = allowed_statuses(data.get("status") or None, ids, include_poisoned)
    return data, ids, group_key or "", statuses


def selection_queryset(data, ids, group_key, statuses, until=None):
    queryset = apply_filters(Message.objects.all(), data) if data else Message.objects.all()
    if ids:
        queryset = queryset.filter(pk__in=ids)
    if group_key:
        queryset = queryset.filter(group_key=group_key)
    queryset = queryset.filter(status__in=statuses)
    if until is not None:
        queryset = queryset.filter(collected_at__lte=until)
    return queryset.order_by()


# ---- options ----------------------------------------------------------------------------


def _number(errors, field, value, minimum=None, maximum=None, integer=False, above=None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors[field] = "a number"
        return None
    if integer and int(value) != value:
        errors[field] = "a whole number"
        return None
    if not math.isfinite(value):
        errors[field] = "a finite number"
    elif minimum is not None and value < minimum:
        errors[field] = f"at least {minimum:g}"
    elif above is not None and value <= above:
        errors[field] = f"above {above:g}"
    elif maximum is not None and value > maximum:
        errors[field] = f"at most {maximum:g}"
    return int(value) if integer else float(value)


def clean_options(
    rate,
    canary_size,
    canary_pause_seconds,
    canary_max_failure_pct,
    breaker_threshold_pct,
    via,
):
    errors = {}
    rate = _number(errors, "rate", rate, above=0, maximum=1_000_000)
    canary_size = _number(errors, "canary_size", canary_size or 0, minimum=0, integer=True)
    pause = _number(
        errors, "canary_pause_seconds", canary_pause_seconds or 0, minimum=0, maximum=86400
    )
    canary_pct = _number(
        errors, "canary_max_failure_pct", canary_max_failure_pct, above=0, maximum=100
    )
    breaker = _number(
        errors, "breaker_threshold_pct", breaker_threshold_pct, minimum=0, maximum=100
    )
    if via not in VIAS:
        errors["via"] = f"one of {', '.join(VIAS)}"
    if errors:
        raise ValidationError(errors)
    if canary_size and canary_pct is None:
        canary_pct = settings.REPLAY_CANARY_MAX_FAILURE_PCT
    if breaker is None:
        breaker = settings.REPLAY_BREAKER_THRESHOLD_PCT
    return {
        "rate": rate,
        "canary_size": canary_size or 0,
        "canary_pause_seconds": (pause or 0.0) if canary_size else 0.0,
        "canary_max_failure_pct": canary_pct if canary_size else None,
        "breaker_threshold_pct": breaker or None,
        "via": via,
    }


def job_queryset(job):
    """The messages a job covers: as the operator saw them when making it. Collected after it
    was made, or replayed after it was made (by another job, or one click), they are not in it
    — the job would otherwise send again what was sent meanwhile."""
    form = clean_filters(job.filters or None)
    data = form.cleaned_data if form else {}
    return selection_queryset(
        data, job.message_ids or None, job.group_key, job.allowed_statuses, until=job.created_at
    ).exclude(last_replayed_at__gt=job.created_at)


def selection_sql(job):
    """(sql, params) selecting ``id, replay_count`` of the job's messages (for the snapshot)."""
    return job_queryset(job).values_list("id", "replay_count").query.sql_with_params()
