"""Teams: who may see and change which messages (docs/security.md, "Teams").

A team is a name plus scopes (a vhost and glob patterns over queue and exchange names); a user
belongs to teams with a role per team. ``Scope`` (recovery.access.scope) is the one place the
rest of Lazarus asks what a caller (a user, or an API token acting as one of its user's teams)
may read or write: a ``Q`` over the columns every message and count row share (vhost,
source_queue, source_exchange), and the same test in Python for one name.

Upgrade path: a user in no team keeps their global role and sees everything, exactly as before
teams existed; a user in any team has only their teams' roles over their teams' scopes. Admins
(the admin role, superusers) are global whatever their memberships.
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from recovery.access.models import ROLE_ORDER, Privilege, Role, global_role_of
from recovery.globs import glob_match

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


def name_q(column, pattern):
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
        app_label = "recovery"
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
        app_label = "recovery"
        ordering = ["id"]

    def __str__(self):
        return f"{self.vhost} queue={self.queue_pattern!r} exchange={self.exchange_pattern!r}"

    def clean(self):
        if not self.queue_pattern and not self.exchange_pattern:
            raise ValidationError("a scope names a queue pattern, an exchange pattern or both")

    def q(self):
        names = NOTHING
        if self.queue_pattern:
            names |= name_q("source_queue", self.queue_pattern)
        if self.exchange_pattern:
            names |= name_q("source_exchange", self.exchange_pattern)
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
    # Privileges in this team (recovery.access.models.Privilege): reading bodies (off: "metadata
    # only"), break-glass unmasking, exporting.
    bodies = models.BooleanField(default=True)
    unmask = models.BooleanField(default=False)
    export = models.BooleanField(default=False)

    class Meta:
        app_label = "recovery"
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
        app_label = "recovery"
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
    return at_least(role_of(user), minimum)


def at_least(role, minimum):
    return role is not None and ROLE_ORDER.index(Role(role)) >= ROLE_ORDER.index(Role(minimum))
