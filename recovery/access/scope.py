"""What one caller may see and change: ``Scope``, and ``scope_of(request)``, once per request.

At the models floor: it queries the access models and the store, and knows a request only as an
object with ``user`` and ``auth`` (and a place to cache the Scope). The store's ``Message`` is
looked up in the app registry by label, as the access models' foreign keys name it: importing
``recovery.models`` from here would run it, and it imports this package (the models it registers).
"""

from django.apps import apps
from django.core.exceptions import FullResultSet, ValidationError
from django.db import connection
from django.db.models import Q

from recovery.access.models import (
    ALL_PRIVILEGES,
    ROLE_ORDER,
    ApiToken,
    Privilege,
    Role,
    global_privileges_of,
    global_role_of,
)
from recovery.access.teams import NOTHING, Membership, Team, TeamScope, at_least, name_q
from recovery.globs import glob_match


def _messages():
    return apps.get_model("recovery", "Message").objects


class Scope:
    """What one caller may see and change.

    ``teams`` is None for a global caller (roles as before teams; admins), else {team id: role}
    with each team's TeamScope rows loaded once. Every query goes through ``q()``: a global
    caller gets ``Q()`` (no filter), a team caller an OR of their teams' scopes, and a caller
    with no team left nothing (``NOTHING``)."""

    def __init__(self, role, teams=None, scopes=None, acting_team=None, privileges=None):
        self.role = role
        self.teams = teams
        self.scopes = scopes or {}
        self.acting_team = acting_team
        # Global: a frozenset of Privilege; team: {team id: frozenset}. None: from the role
        # (admins all, others bodies only).
        if privileges is None and teams is None:
            privileges = ALL_PRIVILEGES if role == Role.ADMIN else frozenset({Privilege.BODIES})
        self.privileges = privileges if privileges is not None else {}

    @classmethod
    def of(cls, user, team_id=None):
        """``user``'s scope; with ``team_id`` (a team token, a team's job) only that team's,
        with the user's current role in it (none if they left it)."""
        if not user or not user.is_authenticated or not user.is_active:
            return cls(None, teams={})
        role = global_role_of(user)
        if role == Role.ADMIN and team_id is None:
            return cls(role)  # an admin's token acting as a team is narrowed like anyone's
        memberships = Membership.objects.filter(user=user).select_related("team")
        if team_id is not None:
            memberships = memberships.filter(team_id=team_id)
        memberships = list(memberships)
        teams = {m.team_id: Role(m.role) for m in memberships}
        if team_id is None and not teams:
            return cls(role, privileges=global_privileges_of(user, role))
        acting = Team.objects.filter(pk=team_id).first() if team_id is not None else None
        scopes = {}
        for scope in TeamScope.objects.filter(team_id__in=teams):
            scopes.setdefault(scope.team_id, []).append(scope)
        best = max(teams.values(), key=ROLE_ORDER.index, default=None)
        privileges = {m.team_id: m.privileges() for m in memberships}
        return cls(best, teams=teams, scopes=scopes, acting_team=acting, privileges=privileges)

    @property
    def is_global(self):
        return self.teams is None

    def has_role(self, minimum):
        return at_least(self.role, minimum)

    def team_ids(self, minimum=Role.VIEWER):
        if self.teams is None:
            return None
        return [team for team, role in self.teams.items() if at_least(role, minimum)]

    def q(self, minimum=Role.VIEWER):
        """Over any model with vhost, source_queue and source_exchange columns (messages and
        the count tables alike)."""
        if self.teams is None:
            return Q() if self.has_role(minimum) else NOTHING
        combined = NOTHING
        for team in self.team_ids(minimum):
            for scope in self.scopes.get(team, []):
                combined |= scope.q()
        return combined

    def allows(self, vhost, queue, exchange, minimum=Role.VIEWER):
        if self.teams is None:
            return self.has_role(minimum)
        return any(
            scope.matches(vhost, queue, exchange)
            for team in self.team_ids(minimum)
            for scope in self.scopes.get(team, [])
        )

    def audit_q(self, with_exchange=True):
        """Over audit windows and evidence (``exchange``, ``consumer_group`` columns; input
        gaps have only the group): a team sees the rows of the exchanges its exchange patterns
        match and of the consumer groups (one queue each) its queue patterns match. The audit
        reads logs, which carry no vhost: the patterns alone decide."""
        if self.teams is None:
            return Q()
        combined = NOTHING
        for team in self.team_ids():
            for scope in self.scopes.get(team, []):
                if scope.queue_pattern:
                    combined |= name_q("consumer_group", scope.queue_pattern)
                if scope.exchange_pattern and with_exchange:
                    combined |= name_q("exchange", scope.exchange_pattern)
        return combined

    def history_q(self):
        """Over the message history (``vhost``, ``queue``: it keeps no exchange): a team sees
        the rows of the queues its queue patterns match. A row of a message that came through an
        exchange (no queue) is seen by global callers only: failing closed."""
        if self.teams is None:
            return Q()
        combined = NOTHING
        for team in self.team_ids():
            for scope in self.scopes.get(team, []):
                if scope.queue_pattern:
                    combined |= Q(vhost=scope.vhost) & name_q("queue", scope.queue_pattern)
        return combined

    def _privileged_teams(self, privilege):
        return [team for team in self.team_ids() if privilege in self.privileges.get(team, ())]

    def may(self, privilege, message=None):
        """Whether the caller holds ``privilege`` (recovery.access.models.Privilege): for
        ``message``, through a team whose scope holds it; without, anywhere."""
        if self.teams is None:
            return self.has_role(Role.VIEWER) and privilege in self.privileges
        teams = self._privileged_teams(privilege)
        if message is None:
            return bool(teams)
        return any(
            scope.matches(message.vhost, message.source_queue, message.source_exchange)
            for team in teams
            for scope in self.scopes.get(team, [])
        )

    def privilege_q(self, privilege):
        """The messages over which the caller holds ``privilege`` (a Q, as ``q()``)."""
        if self.teams is None:
            return Q() if self.may(privilege) else NOTHING
        combined = NOTHING
        for team in self._privileged_teams(privilege):
            for scope in self.scopes.get(team, []):
                combined |= scope.q()
        return combined

    def where_sql(self, minimum=Role.VIEWER):
        """``q()`` over recovery_message as (SQL, params), for the raw queries."""
        query = _messages().filter(self.q(minimum)).query
        try:
            return query.get_compiler(connection=connection).compile(query.where)
        except FullResultSet:
            return "true", ()

    def messages(self, queryset=None, minimum=Role.VIEWER):
        queryset = _messages().all() if queryset is None else queryset
        return queryset.filter(self.q(minimum))

    def jobs(self, queryset, minimum=Role.VIEWER):
        """Of the ReplayJob ``queryset``, those a team caller sees: their teams' jobs."""
        if self.teams is None:
            return queryset
        return queryset.filter(team_id__in=self.team_ids(minimum))

    def job_team(self):
        """The team a job made by this caller belongs to: the token's team, or the caller's
        only operator team; None for a global caller. A caller operating for several teams
        must act through a team token (ValidationError)."""
        if self.teams is None:
            return None
        if self.acting_team is not None:
            return self.acting_team.pk
        teams = self.team_ids(Role.OPERATOR)
        if len(teams) != 1:
            raise ValidationError(
                "You operate for several teams: start the job with an API token acting as one."
            )
        return teams[0]

    @staticmethod
    def covers(team_id, vhost, queue, exchange):
        """Whether every name given (queue, exchange: "" = not given) is in one of the team's
        scopes of ``vhost`` (an alert rule's names: a glob ``*`` covers "" too, so each name
        given must match its own pattern)."""
        scopes = TeamScope.objects.filter(team_id=team_id, vhost=vhost)
        return any(
            (not queue or (s.queue_pattern and glob_match(s.queue_pattern, queue)))
            and (not exchange or (s.exchange_pattern and glob_match(s.exchange_pattern, exchange)))
            for s in scopes
        )

    def owned(self, queryset):
        """Of alert rules or channels (a ``team`` column), those a caller sees: a team
        caller their teams' own."""
        if self.teams is None:
            return queryset
        return queryset.filter(team__in=self.team_ids())

    @classmethod
    def of_job(cls, job):
        """Whom a job runs for, re-checked when it runs: everything for a job a global caller
        made (team None); its team's scope, as its creator operates there now, otherwise."""
        if job.team_id is None:
            return cls(Role.ADMIN)
        return cls.of(job.created_by, team_id=job.team_id)

    def activity(self, queryset):
        """Activity rows of messages and jobs in scope; nothing else (role changes, tokens)."""
        if self.teams is None:
            return queryset
        return queryset.filter(
            Q(message__in=_messages().filter(self.q()).values("pk"))
            | Q(message__isnull=True, job__team__in=self.team_ids())
        )


def scope_of(request):
    """The caller's Scope, once per request: its API token's (acting as a team or as its user)
    or its session user's."""
    cached = getattr(request, "_lazarus_scope", None)
    if cached is not None:
        return cached
    token = getattr(request, "auth", None)
    team_id = token.team_id if isinstance(token, ApiToken) else None
    scope = Scope.of(request.user, team_id)
    request._lazarus_scope = scope
    return scope


def team_scoped(view):
    """Marks a view as reading and writing through ``Scope``: only marked views answer team
    callers (the others refuse them: a route added without scoping fails closed). On an
    ``@api_view`` function, put it above the decorator."""
    view.team_scoped = True
    view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
    if view_class is not None:
        view_class.team_scoped = True
    return view
