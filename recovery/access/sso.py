"""Single sign-on: which identity-provider groups give which role and team, and who signed in
through the provider (docs/security.md, "Single sign-on").

A ``GroupMapping`` says: a user whose groups claim holds ``group`` gets either a global role
(viewer, operator, admin) or a role in one team. ``Grant.of(groups)`` is everything a list of
groups is mapped to; ``SsoIdentity.apply`` makes a user's global role and team memberships
exactly that grant, at every sign-in, so a group the provider no longer lists takes its role and
team away at the user's next sign-in. A grant of nothing is a refusal (``refuse``): the user's
roles, teams and API tokens are taken away then too.

Who owns what: the provider owns which teams a user is in and their role in each (its groups,
through the mappings); Lazarus owns each membership's privileges (bodies, unmask, export) and an
admin's removal of a member. So sign-in changes an existing membership's role only, creates a
missing one with the least privileges (metadata only: a mapping gives no privileges), and
leaves out a team an admin removed the user from (MembershipRemoval) until an admin adds them
again.
"""

from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from recovery.access.models import ROLE_ORDER, Activity, ApiToken, Role, global_role_of
from recovery.access.teams import Membership, MembershipRemoval, Team


class GroupMapping(models.Model):
    """One provider group (a value of the groups claim, matched exactly, case included) and what
    it gives: a global ``role``, or ``team`` with ``team_role``."""

    group = models.CharField(max_length=255)
    role = models.CharField(max_length=8, choices=Role.choices, blank=True, default="")
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="group_mappings"
    )
    team_role = models.CharField(
        max_length=8, choices=Membership.TeamRole.choices, blank=True, default=""
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "recovery"
        ordering = ["group", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["group", "team"],
                name="sso_mapping_group_team",
                violation_error_message="this group already gives a role in this team",
            ),
            models.UniqueConstraint(
                fields=["group"],
                condition=models.Q(team__isnull=True),
                name="sso_mapping_group_global",
                violation_error_message="this group already gives a global role",
            ),
        ]

    def __str__(self):
        if self.team_id:
            return f"{self.group} → {self.team_role} in team {self.team}"
        return f"{self.group} → {self.role} (global)"

    def activity_detail(self):
        """What an activity row keeps of a change to this mapping (console and API alike)."""
        return {"what": str(self), "id": self.pk}

    def clean(self):
        if not self.group.strip():
            raise ValidationError({"group": "name the provider's group"})
        if any(ord(char) < 32 or ord(char) == 127 for char in self.group):
            raise ValidationError({"group": "control characters are not allowed"})
        if self.team_id is None and not self.role:
            raise ValidationError("choose a global role, or a team and a role in it")
        if self.team_id is not None:
            if self.role:
                raise ValidationError("a mapping gives a global role or a team role, not both")
            if not self.team_role:
                raise ValidationError({"team_role": "choose the role in the team"})
        elif self.team_role:
            raise ValidationError({"team": "a team role needs a team"})


@dataclass
class Grant:
    """What a list of provider groups is mapped to: the strongest global role, and per team the
    strongest team role. ``groups`` are the mapped groups that gave it."""

    role: Role | None = None
    teams: dict[int, str] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, groups):
        grant = cls()
        for mapping in GroupMapping.objects.filter(group__in=list(groups)):
            if mapping.group not in grant.groups:
                grant.groups.append(mapping.group)
            if mapping.team_id is not None:
                held = grant.teams.get(mapping.team_id)
                if held is None or ROLE_ORDER.index(Role(mapping.team_role)) > ROLE_ORDER.index(
                    Role(held)
                ):
                    grant.teams[mapping.team_id] = mapping.team_role
            elif grant.role is None or ROLE_ORDER.index(Role(mapping.role)) > ROLE_ORDER.index(
                grant.role
            ):
                grant.role = Role(mapping.role)
        return grant

    @property
    def empty(self):
        return self.role is None and not self.teams

    def without_removals(self, user):
        """This grant less the teams an admin removed ``user`` from, and those teams' names."""
        removed = set(
            MembershipRemoval.objects.filter(user=user, team_id__in=list(self.teams)).values_list(
                "team_id", flat=True
            )
        )
        kept = {team: role for team, role in self.teams.items() if team not in removed}
        names = sorted(Team.objects.filter(pk__in=removed).values_list("name", flat=True))
        return Grant(role=self.role, teams=kept, groups=self.groups), names


def _roles_summary(user):
    teams = dict(
        Membership.objects.filter(user=user).values_list("team__name", "role").order_by("team")
    )
    role = global_role_of(user)
    return {"role": role.value if role else None, "teams": teams}


class SsoIdentity(models.Model):
    """The provider account (issuer + subject, which never change for one account) a Lazarus
    user signs in as; a user without one is a local (password) user."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    # The groups claim as the provider last sent it, and when.
    groups = models.JSONField(default=list, blank=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "recovery"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_subject")
        ]

    def __str__(self):
        return f"{self.subject} at {self.issuer}"

    @transaction.atomic
    def apply(self, grant):
        """Makes the user's global role and team memberships exactly ``grant`` (superuser and
        staff flags, and existing memberships' privileges, are left alone; the caller has taken
        the admin's removals out of ``grant``: Grant.without_removals). Logs a
        ``sso_roles_changed`` activity row when it changed anything. A user in any team has
        only their team roles (recovery.access.teams), so a global viewer or operator role next
        to a team is not given; global admin always is."""
        user = self.user
        before = _roles_summary(user)
        role_groups = [Group.objects.get_or_create(name=r.value)[0] for r in ROLE_ORDER]
        Membership.objects.filter(user=user).exclude(team_id__in=list(grant.teams)).delete()
        for team_id, team_role in grant.teams.items():
            membership = Membership.objects.filter(user=user, team_id=team_id).first()
            if membership is None:
                # Least privileges: an admin grants bodies, unmask or export (Teams page).
                Membership(
                    user=user, team_id=team_id, role=team_role, bodies=False, unmask=False
                ).save()
            elif membership.role != team_role:
                membership.role = team_role
                membership.save(update_fields=["role"])
        user.groups.remove(*role_groups)
        if grant.role == Role.ADMIN or (grant.role is not None and not grant.teams):
            user.groups.add(next(g for g in role_groups if g.name == grant.role.value))
        after = _roles_summary(user)
        if after != before:
            Activity.record(
                user,
                "sso_roles_changed",
                detail={"before": before, "after": after, "groups": grant.groups},
                via="system",
            )
        return after

    @transaction.atomic
    def refuse(self, reason):
        """The provider no longer maps this user: no role, no team, and their API tokens are
        revoked (a new token needs a new mapping and a new sign-in)."""
        user = self.user
        Membership.objects.filter(user=user).delete()
        user.groups.remove(*Group.objects.filter(name__in=[r.value for r in ROLE_ORDER]))
        revoked = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        return revoked


def log_refusal(username, reason, *, user=None, groups=None, revoked_tokens=0, **extra):
    """A refused sign-in in the activity log (the console's activity page, action
    ``login_refused``); ``extra`` (the provider account's subject, ...) is kept in the detail."""
    Activity.record(
        user,
        "login_refused",
        detail={
            "username": username,
            "reason": reason,
            "groups": list(groups or []),
            "revoked_tokens": revoked_tokens,
            **extra,
        },
        via="console",
    )
