"""Whom a bulk job sends for, looked at again while it sends (docs/replay.md, "Who a job sends
for").

A job is made by a user with a right (operator, globally or in the job's team) over a selection
and a target. That right can go while the job waits or runs: the user is deactivated, demoted,
leaves the team, or the team's scopes change. So a runner does not trust what was true at
creation: it asks ``job_authority`` when it starts (a resume, a requeue, a takeover) and again
every ``AUTHORITY_CHECK_S`` while it runs, and checks each claimed message with ``ItemCheck``
against the answer. A job whose creator lost the right stops (cancelled, with the reason);
messages that left the scope, or that this creator may not send where the job sends, are
skipped, each with its reason, and counted.
"""

from dataclasses import dataclass

from recovery.models import Privilege, Role, Scope, Team
from recovery.models.masking import MaskingRules
from recovery.replay.targets import NEEDS_FULL_READ, Target, target_in_teams

# How stale the creator's rights may be when a claim is sent (seconds): each re-check is a few
# queries (the user, their groups, memberships, the team's scopes, the masking rules).
AUTHORITY_CHECK_S = 2.0

# Why an item is skipped (its detail; the activity row counts them by kind).
LEFT_SCOPE = "skipped: no longer in the team's scope"
TARGET_OUT_OF_SCOPE = "skipped: the job's target is not in the team's scopes in this vhost"
NOT_READABLE = f"skipped: {NEEDS_FULL_READ}"


@dataclass(frozen=True)
class Authority:
    """The creator's rights now: ``scope`` (their Scope in the job's team, or their own for a
    global job), and ``refusal``, why the job may not go on ("" while it may)."""

    scope: Scope
    refusal: str = ""


def job_authority(job):
    """The Authority of ``job``'s creator now (read afresh from the database).

    A job with no creator was made by the system (``create_job(None)``), or its creator was
    deleted: a team's job then stops (no one holds the right), a global one goes on as the
    system's."""
    from django.contrib.auth import get_user_model

    creator = get_user_model().objects.filter(pk=job.created_by_id).first()
    if creator is None:
        if job.team_id is not None:
            return Authority(Scope(None, teams={}), "stopped: its creator no longer exists")
        return Authority(Scope(Role.ADMIN))
    name = creator.get_username()
    if not creator.is_active:
        return Authority(Scope(None, teams={}), f"stopped: its creator {name} was deactivated")
    scope = Scope.of(creator, job.team_id)
    if job.team_id is None and not scope.is_global:
        return Authority(scope, f"stopped: its creator {name} no longer operates on every team")
    if not scope.has_role(Role.OPERATOR):
        where = f" in team {_team_name(job.team_id)}" if job.team_id is not None else ""
        return Authority(scope, f"stopped: its creator {name} is no longer an operator{where}")
    return Authority(scope)


def _team_name(team_id):
    return Team.objects.filter(pk=team_id).values_list("name", flat=True).first() or team_id


class ItemCheck:
    """Whether one claimed message may still be sent, for the Authority it was built with."""

    def __init__(self, job, authority):
        self.scope = authority.scope
        self.target = Target.of_job(job)
        self.team_ids = None if job.team_id is None else [job.team_id]
        self.global_scope = self.scope.is_global
        # Masking only matters when the job sends somewhere other than each message's own.
        self.rules = None if self.target.is_default else MaskingRules.load()
        self._target_in_vhost = {}

    def why_not(self, claimed):
        """Why ``claimed`` (recovery.replay.claims.Claimed) is skipped, or None to send it."""
        scope = self.scope
        if not self.global_scope and not scope.allows(
            claimed.vhost, claimed.source_queue, claimed.source_exchange, Role.OPERATOR
        ):
            return LEFT_SCOPE
        if self.rules is None:
            return None
        if not self._target_allowed(claimed.vhost):
            return TARGET_OUT_OF_SCOPE
        # As recovery.replay.targets.may_redirect for a View: bodies, and no masks or the
        # privilege to lift them (a bulk job never holds a break-glass unmask).
        if not scope.may(Privilege.BODIES, claimed):
            return NOT_READABLE
        if self.rules.masker_for(claimed) and not scope.may(Privilege.UNMASK, claimed):
            return NOT_READABLE
        return None

    def _target_allowed(self, vhost):
        allowed = self._target_in_vhost.get(vhost)
        if allowed is None:
            allowed = self._target_in_vhost[vhost] = target_in_teams(
                self.target, vhost, self.team_ids
            )
        return allowed
