"""Teams: who may see and change which messages (docs/security.md, "Teams").

A team is a name plus scopes (a vhost and glob patterns over queue and exchange names); a user
belongs to teams with a role per team. ``Scope`` is the one place the rest of Lazarus asks what a
caller (a user, or an API token acting as one of its user's teams) may read or write: a ``Q``
over the columns every message and count row share (vhost, source_queue, source_exchange), and
the same test in Python for one name.

Upgrade path: a user in no team keeps their global role and sees everything, exactly as before
teams existed; a user in any team has only their teams' roles over their teams' scopes. Admins
(the admin role, superusers) are global whatever their memberships.
"""

from django.conf import settings
from django.core.exceptions import FullResultSet, ValidationError
from django.db import connection, models
from django.db.models import Q

from recovery.globs import glob_match
from recovery.models.access import (
    ACTING_TEAM,
    ALL_PRIVILEGES,
    ROLE_ORDER,
    ApiToken,
    Privilege,
    Role,
    global_privileges_of,
    global_role_of,
)
from recovery.models.store import Message

PATTERN_MAX_LENGTH = 255
# Matches no row, and (unlike pk__in=[]) compiles to SQL: the raw queries embed it.
NOTHING = Q(pk__isnull=True)


def glob_to_regex(pattern):
    """An anchored regular expression, the same for PostgreSQL (``~``) and Python ``re``.

    Globs: ``*`` any run of characters (none included), ``?`` one character, everything else
    literal. Non-alphanumeric characters are escaped with a backslash, which both dialects read
    as the literal character (alphanumerics are never escaped: ``\\d`` would be a class)."""
    out = []
    for char in pattern:
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char.isascii() and char.isalnum():
            out.append(char)
        else:
            out.append("\\" + char)
    return "^" + "".join(out) + "$"


def _name_q(column, pattern):
    """A glob without wildcards is an equality, which the (column, collected_at) indexes
    serve; any other is an anchored regex (``~``)."""
    if "*" not in pattern and "?" not in pattern:
        return Q(**{column: pattern})
    return Q(**{f"{column}__regex": glob_to_regex(pattern)})


def validate_pattern(value):
    """A bad pattern is a form (or API 400) error, never a 500."""
    if len(value) > PATTERN_MAX_LENGTH:
        raise ValidationError(f"at most {PATTERN_MAX_LENGTH} characters")
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise ValidationError("control characters are not allowed in a pattern")


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class TeamScope(models.Model):
    """One vhost and glob patterns: a message is in scope when its vhost is this one and its
    source queue matches ``queue_pattern`` or its source exchange matches ``exchange_pattern``.
    An empty pattern matches nothing (a scope names at least one)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="scopes")
    vhost = models.CharField(max_length=255, default="/", validators=[validate_pattern])
    queue_pattern = models.CharField(
        max_length=PATTERN_MAX_LENGTH, blank=True, default="", validators=[validate_pattern]
    )
    exchange_pattern = models.CharField(
        max_length=PATTERN_MAX_LENGTH, blank=True, default="", validators=[validate_pattern]
    )

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.vhost} queue={self.queue_pattern!r} exchange={self.exchange_pattern!r}"

    def clean(self):
        if not self.queue_pattern and not self.exchange_pattern:
            raise ValidationError("a scope names a queue pattern, an exchange pattern or both")

    def q(self):
        names = NOTHING
        if self.queue_pattern:
            names |= _name_q("source_queue", self.queue_pattern)
        if self.exchange_pattern:
            names |= _name_q("source_exchange", self.exchange_pattern)
        return Q(vhost=self.vhost) & names

    def matches(self, vhost, queue, exchange):
        if vhost != self.vhost:
            return False
        return bool(
            (self.queue_pattern and glob_match(self.queue_pattern, queue))
            or (self.exchange_pattern and glob_match(self.exchange_pattern, exchange))
        )


class Membership(models.Model):
    class TeamRole(models.TextChoices):
        VIEWER = "viewer"
        OPERATOR = "operator"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=TeamRole.choices, default=TeamRole.VIEWER)
    # Privileges in this team (recovery.models.access.Privilege): reading bodies (off: "metadata
    # only"), break-glass unmasking, exporting.
    bodies = models.BooleanField(default=True)
    unmask = models.BooleanField(default=False)
    export = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_user_team")
        ]

    def save(self, *args, **kwargs):
        """Joining a team drops the user's global viewer/operator role (not admin): it no
        longer applies, and leaving every team (or the team's deletion) must not give them
        every message back. They have no role then until an admin sets one.

        Saving a membership also ends an admin's removal of this user from this team
        (MembershipRemoval): single sign-on never creates one while the removal stands, so a
        save here is an admin adding the member again (console or API)."""
        from django.contrib.auth.models import Group

        # On every save: a membership moved to another user (PUT) drops theirs as well.
        self.user.groups.remove(
            *Group.objects.filter(name__in=[Role.VIEWER.value, Role.OPERATOR.value])
        )
        if self.pk is not None:
            before = Membership.objects.filter(pk=self.pk).values("user_id", "team_id").first()
            if before and (before["user_id"], before["team_id"]) != (self.user_id, self.team_id):
                # Moving a membership (API PUT) takes its old user out of its old team.
                MembershipRemoval.record(before["user_id"], before["team_id"])
        super().save(*args, **kwargs)
        MembershipRemoval.objects.filter(user_id=self.user_id, team_id=self.team_id).delete()

    def delete(self, *args, **kwargs):
        """An admin removing a member (console Teams page, API DELETE: the only callers of a
        single membership's delete; sign-in and cascades delete through querysets) is
        remembered, so the provider's groups do not put them back at their next sign-in."""
        MembershipRemoval.record(self.user_id, self.team_id)
        return super().delete(*args, **kwargs)

    def privileges(self):
        return frozenset(p for p in Privilege if getattr(self, p.value))


class MembershipRemoval(models.Model):
    """An admin took ``user`` out of ``team``. Single sign-on respects it: the user's groups at
    the provider do not put them back in the team until an admin adds them again (which deletes
    this row, Membership.save). docs/security.md, "Single sign-on"."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership_removals"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="removals")
    # Who removed them is in the activity log (team_member_deleted, membership_deleted).
    removed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_removal_user_team")
        ]

    @classmethod
    def record(cls, user_id, team_id):
        cls.objects.update_or_create(user_id=user_id, team_id=team_id)


def role_of(user):
    """The strongest role a user holds: their global role while they are in no team, else the
    strongest of their team roles (admins and superusers are global whatever their teams)."""
    role = global_role_of(user)
    if role is None and (not user or not user.is_authenticated):
        return None
    if role == Role.ADMIN:
        return role
    team_roles = [
        Role(r) for r in Membership.objects.filter(user=user).values_list("role", flat=True)
    ]
    if not team_roles:
        return role
    return max(team_roles, key=ROLE_ORDER.index)


def has_role(user, minimum):
    return _at_least(role_of(user), minimum)


def _at_least(role, minimum):
    return role is not None and ROLE_ORDER.index(Role(role)) >= ROLE_ORDER.index(Role(minimum))


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
        return _at_least(self.role, minimum)

    def team_ids(self, minimum=Role.VIEWER):
        if self.teams is None:
            return None
        return [team for team, role in self.teams.items() if _at_least(role, minimum)]

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
                    combined |= _name_q("consumer_group", scope.queue_pattern)
                if scope.exchange_pattern and with_exchange:
                    combined |= _name_q("exchange", scope.exchange_pattern)
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
                    combined |= Q(vhost=scope.vhost) & _name_q("queue", scope.queue_pattern)
        return combined

    def _privileged_teams(self, privilege):
        return [team for team in self.team_ids() if privilege in self.privileges.get(team, ())]

    def may(self, privilege, message=None):
        """Whether the caller holds ``privilege`` (recovery.models.access.Privilege): for
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
        query = Message.objects.filter(self.q(minimum)).query
        try:
            return query.get_compiler(connection=connection).compile(query.where)
        except FullResultSet:
            return "true", ()

    def messages(self, queryset=None, minimum=Role.VIEWER):
        queryset = Message.objects.all() if queryset is None else queryset
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
            Q(message__in=Message.objects.filter(self.q()).values("pk"))
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
    ACTING_TEAM.set(team_id)
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
