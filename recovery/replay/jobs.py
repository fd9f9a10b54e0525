"""Bulk replay jobs: make one (validated), preview it (dry run), cancel, resume, keep them running.

``create_job`` fixes *what* a job replays (a filter, an id list or a failure group, and only
messages collected before the job was made: a message that dies again during the job is not
picked up by it), *where* (``recovery.replay.targets``), *how fast* and *how safely* (canary,
circuit breaker). A Celery task (``recovery.replay.tasks.run_replay_job``) runs it with
``recovery.replay.runner.JobRunner``; ``resume_stalled_jobs`` (Celery beat) restarts the jobs whose
runner died.

Which statuses a job sends: ``pending`` always; ``poisoned`` only with ``include_poisoned``;
``replayed`` only when asked explicitly (an id list, or the filter ``status=replayed``).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from recovery.errors import StateError
from recovery.models import Activity, Privilege, ReplayJob, Role, Scope, TeamScope
from recovery.replay.authority import job_authority
from recovery.replay.options import clean_job_options
from recovery.replay.selection import clean_selection, team_scope_rows
from recovery.replay.targets import NEEDS_FULL_READ, target_in_teams, validate_target

log = logging.getLogger(__name__)

# A queued job whose task has not started for this many leases is enqueued again (its task
# message may be lost); a running one as soon as its lease is stale.
QUEUED_PATIENCE_LEASES = 10


# ---- the interface the console and the API call -----------------------------------------------


def clean_job(
    *,
    filters=None,
    message_ids=None,
    group_key=None,
    target_exchange=None,
    target_routing_key=None,
    target_queue=None,
    delay_seconds=None,
    include_poisoned=False,
    rate=None,
    canary_size=0,
    canary_pause_seconds=0,
    canary_max_failure_pct=None,
    breaker_threshold_pct=None,
    via="console",
):
    """create_job's arguments checked once: (Target, Selection, options); ValidationError
    naming the arguments otherwise. dry_run checks with it too, so a preview shows the errors
    the job would get."""
    target = validate_target(target_exchange, target_routing_key, target_queue, delay_seconds)
    selection = clean_selection(filters, message_ids, group_key, include_poisoned)
    options = clean_job_options(
        rate, canary_size, canary_pause_seconds, canary_max_failure_pct, breaker_threshold_pct, via
    )
    _check_canary_outlasts_delay(options, target)
    return target, selection, options


def _check_canary_outlasts_delay(options, target):
    delay = target.delay_seconds or 0
    if options["canary_size"] and delay and options["canary_pause_seconds"] <= delay:
        # The canary would be judged before its messages even reached the consumer.
        raise ValidationError(
            {
                "canary_pause_seconds": "with a delay, the canary pause must be longer than the "
                f"delay ({delay}s)"
            }
        )


def check_job_target(scope, target, team_ids):
    """A job's target, for a caller with ``scope`` acting for ``team_ids`` (None: globally).

    Checked here, when the job is made, against the teams' scopes in any of their vhosts (a
    400 now rather than a job of skipped items); the runner checks it again per message, in
    that message's vhost and with the creator's rights as they are then
    (recovery.replay.authority). A caller who may read no body anywhere (metadata only) may
    send only to each message's own target: what they cannot read must not be put where they
    can."""
    if target.is_default:
        return
    field = target.names()[0]
    if not scope.may(Privilege.BODIES):
        raise ValidationError({field: NEEDS_FULL_READ})
    if team_ids is None:
        return
    vhosts = TeamScope.objects.filter(team_id__in=team_ids).values_list("vhost", flat=True)
    if not any(target_in_teams(target, vhost, team_ids) for vhost in set(vhosts)):
        raise ValidationError({field: "not in your team's scopes"})


def _creation_detail(job):
    """What the ``job_created`` activity row keeps of a job."""
    return {
        "filters": job.filters,
        "message_ids": len(job.message_ids),
        "group_key": job.group_key,
        "target": describe_target(job),
        "rate": job.rate,
        "canary_size": job.canary_size,
        "breaker_threshold_pct": job.breaker_threshold_pct,
        "include_poisoned": job.include_poisoned,
        # What the team could see when the job was made: the runner counts what left it
        # within this only (recovery.replay.selection.scope_at_creation).
        **({"scope": team_scope_rows(job.team_id)} if job.team_id is not None else {}),
    }


def create_job(user, *, include_poisoned=False, scope=None, **arguments):
    """Validate and create a bulk replay job; it starts (a Celery task) once the transaction
    commits. Returns the ReplayJob (state ``queued``).

    Selection — at least one of: ``filters`` (a dict of MessageFilterForm fields: kind, queue,
    exchange, reason, status, vhost, group, since, until, q), ``message_ids`` (list of ints),
    ``group_key`` (a failure group). Target — ``target_queue``, or ``target_exchange`` +
    ``target_routing_key``, or none for each message's default; ``delay_seconds`` (one of
    settings.REPLAY_DELAYS) delays through a TTL + DLX queue. ``rate``: msgs/s, None = as fast
    as confirms allow. ``include_poisoned``: also poisoned messages. Canary: the first
    ``canary_size`` messages, then ``canary_pause_seconds``, then go on only if fewer than
    ``canary_max_failure_pct`` % (default setting REPLAY_CANARY_MAX_FAILURE_PCT) came back
    dead-lettered; else the job pauses. ``breaker_threshold_pct``: pause when this % of the
    replayed messages comes back dead-lettered (default REPLAY_BREAKER_THRESHOLD_PCT; 0 = off).
    ``via``: console | api | system. The limits of each: ``recovery.replay.options``.

    Raises ValidationError with the offending argument names as fields (``__all__`` when no
    message is selected or none matches) and PermissionDenied if ``user`` is not an operator.
    Logged as ``job_created``. ``scope`` (the caller's Scope; None: ``user``'s own): a team
    caller's job selects only messages they operate on, belongs to their team, and is checked
    against that team's scope again when it runs.
    """
    if scope is None:
        scope = Scope.of(user) if user is not None else Scope(Role.ADMIN)
    if not scope.has_role(Role.OPERATOR):
        raise PermissionDenied("replay jobs need the operator role")
    team_id = scope.job_team()
    target, selection, options = clean_job(include_poisoned=include_poisoned, **arguments)
    check_job_target(scope, target, None if team_id is None else [team_id])
    if not selection.queryset(scope).filter(scope.q(Role.OPERATOR)).exists():
        raise ValidationError(
            {
                NON_FIELD_ERRORS: "no replayable message matches ("
                + ", ".join(selection.statuses)
                + ")"
            }
        )
    with transaction.atomic():
        job = ReplayJob.objects.create(
            created_by=user,
            team_id=team_id,
            filters=selection.stored_filters,
            message_ids=selection.ids or [],
            group_key=selection.group_key,
            target_exchange=target.exchange,
            target_routing_key=target.routing_key,
            target_queue=target.queue,
            delay_seconds=target.delay_seconds,
            include_poisoned=bool(include_poisoned),
            allowed_statuses=selection.statuses,
            **options,
        )
        Activity.record(
            user,
            "job_created",
            detail=_creation_detail(job),
            via=options["via"],
            job=job,
            team=scope.acting_team if scope is not None else None,
        )
        transaction.on_commit(job.enqueue)
    return job


def dry_run(scope=None, **arguments):
    """How many messages a job would send where, sending nothing.

    Takes create_job's arguments (the job options are validated too, so a preview shows the
    errors the job would get) and returns ``[{"exchange", "routing_key", "count", "vhost",
    "via"}]``, biggest first: ``exchange``/``routing_key`` are where the messages arrive (the
    default exchange "" with the queue name as key for a queue), ``via`` the delay exchange
    they wait in first ("" when not delayed). Raises ValidationError as create_job.
    """
    arguments.pop("user", None)
    target, selection, _options = clean_job(**arguments)
    if scope is not None:
        # As create_job would refuse it (a viewer's preview: their teams').
        teams = None if scope.is_global else scope.team_ids(Role.OPERATOR) or scope.team_ids()
        check_job_target(scope, target, teams)
    groups = (
        selection.queryset(scope)
        .filter(scope.q() if scope is not None else Q())
        .values("vhost", "kind", "source_queue", "source_exchange", "routing_keys")
        .annotate(n=Count("id"))
    )
    totals = {}
    for row in groups:
        exchange, key = target.final(
            row["kind"], row["source_queue"], row["source_exchange"], row["routing_keys"]
        )
        via_exchange = target.route(exchange, key)[0] if target.delay_seconds else ""
        slot = (row["vhost"], exchange, key, via_exchange)
        totals[slot] = totals.get(slot, 0) + row["n"]
    return [
        {"exchange": e, "routing_key": k, "count": n, "vhost": v, "via": d}
        for (v, e, k, d), n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def describe_target(job):
    if job.target_queue:
        where = f"queue {job.target_queue}"
    elif job.target_exchange is not None:
        where = f"exchange {job.target_exchange or '(default)'} key {job.target_routing_key or ''}"
    else:
        where = "each message's default target"
    return f"{where}, after {job.delay_seconds}s" if job.delay_seconds else where


class NothingRecoverable(LookupError):
    """The audit run found nothing recoverable the caller may see (a 404)."""


class RecoverableGone(StateError):
    """Everything the run found recoverable has left the store (retention removed it)."""


def replay_recoverable(run, user, scope, via):
    """One bulk replay job (the job defaults: canary, breaker, each message's own target) of an
    audit run's recoverable messages still in the store (``AuditRun.recoverable_ids``); a team
    member's covers their team's windows only. Returns (job, how many); raises
    ``NothingRecoverable``, ``RecoverableGone``, or ``create_job``'s ValidationError."""
    within = None if scope.is_global else scope.audit_q()
    if not run.recoverable_evidence(within).exists():
        raise NothingRecoverable("this audit found nothing recoverable in your scope")
    ids = run.recoverable_ids(within)
    if not ids:
        raise RecoverableGone("no recoverable message of this audit is in the store any more")
    return create_job(user, message_ids=ids, via=via, scope=scope), len(ids)


def resume_job(job, user, via="console", team=None):
    """Resume a paused job (ReplayJob.resume), unless its creator lost the right to send it:
    the runner would stop it at once (recovery.replay.authority), so say why now (StateError:
    a 409). Someone who holds the right starts a new job for the rest."""
    refusal = job_authority(job).refusal
    if refusal:
        raise StateError(f"job #{job.pk} cannot be resumed: {refusal}")
    return job.resume(user, via=via, team=team)


# ---- keeping them running -------------------------------------------------------------------


def resume_stalled_jobs():
    """Celery beat: enqueue again the jobs whose runner died (its lease went stale) or whose task
    never started; release claims ended jobs still hold. Returns the ids enqueued."""
    now = timezone.now()
    lease = timedelta(seconds=settings.REPLAY_LEASE_SECONDS)
    stale = now - lease
    not_recently_enqueued = Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale)
    crashed = Q(state=ReplayJob.State.RUNNING) & (
        Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=stale)
    )
    forgotten = Q(state=ReplayJob.State.QUEUED) & (
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - lease * QUEUED_PATIENCE_LEASES)
    )
    enqueued = []
    for job in ReplayJob.objects.filter((crashed & not_recently_enqueued) | forgotten):
        log.warning("replay job %s (%s) has no live runner; enqueueing it again", job.pk, job.state)
        if job.enqueue():
            enqueued.append(job.pk)
    ReplayJob.release_orphaned_claims()
    return enqueued
