"""Which messages a replay job covers: a filter, ids, a failure group, and which statuses. Used
by create_job and dry_run; every error is a ValidationError naming the argument. The job's
options and their limits are ``recovery.replay.options``.
"""

from dataclasses import dataclass

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from recovery.access.teams import NOTHING
from recovery.models import Activity, Message, Role, Scope, Status, TeamScope
from recovery.replay.options import parse_message_ids
from recovery.search.filters import MessageFilterForm, apply_filters

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
    try:
        return parse_message_ids(message_ids)
    except ValidationError as exc:
        raise ValidationError({"message_ids": exc.messages}) from None


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
    """A Selection (its filters cleaned once: the job stores ``stored_filters``) or
    ValidationError."""
    form = clean_filters(filters)
    ids = _clean_ids(message_ids)
    if group_key is not None and (not isinstance(group_key, str) or len(group_key) > 64):
        raise ValidationError({"group_key": "a failure-group key (at most 64 characters)"})
    stored_filters = form.filter_dict() if form else {}
    if not (stored_filters or ids or group_key):
        raise ValidationError(
            {
                NON_FIELD_ERRORS: "choose the messages: a filter, message ids or a failure group "
                "(to replay every pending message, filter on status=pending)"
            }
        )
    data = form.cleaned_data if form else {}
    statuses = allowed_statuses(data.get("status") or None, ids, include_poisoned)
    return Selection(data, stored_filters, ids, group_key or "", statuses)


@dataclass(frozen=True)
class Selection:
    data: dict  # the cleaned filters (MessageFilterForm.cleaned_data)
    stored_filters: dict  # the same as JSON (ReplayJob.filters)
    ids: list | None
    group_key: str
    statuses: list

    def queryset(self, scope=None):
        """``scope``: the caller's (a search reads only the contents they may read)."""
        return selection_queryset(self.data, self.ids, self.group_key, self.statuses, scope=scope)


def selection_queryset(data, ids, group_key, statuses, until=None, scope=None):
    queryset = apply_filters(Message.objects.all(), data, scope) if data else Message.objects.all()
    if ids:
        queryset = queryset.filter(pk__in=ids)
    if group_key:
        queryset = queryset.filter(group_key=group_key)
    queryset = queryset.filter(status__in=statuses)
    if until is not None:
        queryset = queryset.filter(collected_at__lte=until)
    return queryset.order_by()


def job_queryset(job):
    """The messages a job covers: as the operator saw them when making it. Collected after it
    was made, or replayed after it was made (by another job, or one click), they are not in it
    — the job would otherwise send again what was sent meanwhile."""
    form = clean_filters(job.filters or None)
    data = form.cleaned_data if form else {}
    # A search reads the contents its creator may read (a "metadata only" operator's job
    # finds by ids only, as their preview did).
    creator = job.created_by
    searcher = Scope.of(creator, job.team_id) if creator is not None and creator.is_active else None
    return selection_queryset(
        data,
        job.message_ids or None,
        job.group_key,
        job.allowed_statuses,
        until=job.created_at,
        scope=searcher,
    ).exclude(last_replayed_at__gt=job.created_at)


def scoped_job_queryset(job):
    """``job_queryset`` within the scope its team has now (a team's job; see Scope.of_job):
    a message moved out of scope, or re-scoped, since the job was made is left out."""
    return job_queryset(job).filter(Scope.of_job(job).q(Role.OPERATOR))


def team_scope_rows(team_id):
    """A team's scopes now, as the job's ``job_created`` row keeps them:
    [[vhost, queue pattern, exchange pattern], ...]."""
    return [
        list(row)
        for row in TeamScope.objects.filter(team_id=team_id)
        .order_by("id")
        .values_list("vhost", "queue_pattern", "exchange_pattern")
    ]


def scope_at_creation(job):
    """A Q of the scope a team's job was made in (kept in its ``job_created`` row), or None: a
    global job, or one made before the scope was kept. What the team could see then, so a
    count within it tells the team nothing about other teams' messages."""
    if job.team_id is None:
        return None
    detail = (
        Activity.objects.filter(job_id=job.pk, action="job_created")
        .values_list("detail", flat=True)
        .first()
    )
    rows = (detail or {}).get("scope")
    if not rows:
        return None
    then = NOTHING
    for vhost, queue_pattern, exchange_pattern in rows:
        row = TeamScope(vhost=vhost, queue_pattern=queue_pattern, exchange_pattern=exchange_pattern)
        then |= row.q()
    return then


def selection_sql(job):
    """(sql, params) selecting ``id, replay_count`` of the job's messages (for the snapshot)."""
    return scoped_job_queryset(job).values_list("id", "replay_count").query.sql_with_params()
