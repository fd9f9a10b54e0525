"""Who may do what: roles, privileges, API tokens (hashed), and the activity log of what was done.

At the models floor: nothing here imports ``recovery.models`` (which imports this module to
register its models); the store's models are named by label, ``"recovery.Message"``.
"""

import hashlib
import secrets

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


ROLE_ORDER = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]


def global_role_of(user):
    """The strongest global role (auth groups; superusers are admins); None when none."""
    if not user or not user.is_authenticated:
        return None
    if user.is_superuser:
        return Role.ADMIN
    names = set(user.groups.values_list("name", flat=True))
    for role in reversed(ROLE_ORDER):
        if role.value in names:
            return role
    return None


class Privilege(models.TextChoices):
    """What a role alone does not say (docs/security.md, "Private data"): reading bodies (a
    "metadata only" viewer has not), break-glass unmasking, exporting. Per team on each
    Membership; for users in no team, auth groups: ``metadata-only`` takes bodies away,
    ``unmask`` and ``export`` give those. Admins have all three."""

    BODIES = "bodies"
    UNMASK = "unmask"
    EXPORT = "export"


METADATA_ONLY_GROUP = "metadata-only"
ALL_PRIVILEGES = frozenset(Privilege)


def global_privileges_of(user, role=None):
    """The privileges of a user in no team (or an admin): from their auth groups."""
    if role == Role.ADMIN or (user is not None and user.is_superuser):
        return ALL_PRIVILEGES
    if not user or not user.is_authenticated:
        return frozenset()
    names = set(user.groups.values_list("name", flat=True))
    granted = {p for p in (Privilege.UNMASK, Privilege.EXPORT) if p.value in names}
    if METADATA_ONLY_GROUP not in names:
        granted.add(Privilege.BODIES)
    return frozenset(granted)


def set_privileges(user, bodies=True, unmask=False, export=False):
    """A user's global privileges (auth groups; see Privilege)."""
    wanted = {METADATA_ONLY_GROUP: not bodies, "unmask": unmask, "export": export}
    for name, on in wanted.items():
        group = Group.objects.get_or_create(name=name)[0]
        if on:
            user.groups.add(group)
        else:
            user.groups.remove(group)


def set_role(user, role):
    role = Role(role)
    groups = [Group.objects.get_or_create(name=r.value)[0] for r in ROLE_ORDER]
    user.groups.remove(*groups)
    user.groups.add(next(g for g in groups if g.name == role.value))


def describe(target):
    """What an activity row keeps of the object an action changed: its own ``activity_detail()``
    when it has one (a rule's pattern and team), else its name and id; nothing without one."""
    if target is None:
        return {}
    if hasattr(target, "activity_detail"):
        return target.activity_detail()
    return {"what": str(target), "id": target.pk}


class Activity(models.Model):
    """Who did what: every replay, edit, discard, job and role change."""

    # No database foreign keys (db_constraint=False): a bulk replay logs a row per message, and
    # PostgreSQL would check each reference of each row with a locking query of its own (see
    # recovery.models.replay.LOG_REFERENCE). Django still applies on_delete.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
    )
    action = models.CharField(max_length=32)
    message = models.ForeignKey(
        "recovery.Message",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="activity",
        db_constraint=False,
    )
    job = models.ForeignKey(
        "recovery.ReplayJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
    )
    detail = models.JSONField(default=dict, blank=True)
    via = models.CharField(max_length=8, default="console")  # console | api | system
    # The team the API token that did it acts as; null: it acted as its user.
    acting_team = models.ForeignKey(
        "recovery.Team",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    @classmethod
    def entry(
        cls,
        user,
        action,
        target=None,
        detail=None,
        *,
        via,
        team=None,
        message=None,
        job=None,
        at=None,
    ):
        """An unsaved row, for ``record_many``; see ``record``."""
        return cls(
            user=user,
            action=action,
            via=via,
            message_id=getattr(message, "pk", message),
            job_id=getattr(job, "pk", job),
            acting_team_id=getattr(team, "pk", team),
            detail={**describe(target), **(detail or {})},
            created_at=at or timezone.now(),
        )

    @classmethod
    def record(cls, user, action, target=None, detail=None, **fields):
        """The one way to log an action. ``user`` did ``action`` (None: the system) ``via``
        console, api or system; ``team`` is the team the API token acts as (the caller's
        ``Scope.acting_team``; None: as its user), told by the caller because a model reads no
        request. ``message``, ``job``: what it was done to (instances or ids); ``at``: when
        (now). The detail is one shape: what ``target`` (a changed rule, team, user...) says of
        itself (``describe``), then ``detail``'s keys."""
        row = cls.entry(user, action, target, detail, **fields)
        row.save()
        return row

    @classmethod
    def record_many(cls, rows):
        """Rows from ``entry`` in one INSERT (a bulk action logs one row per message)."""
        return cls.objects.bulk_create(rows)

    class Meta:
        app_label = "recovery"
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "activity"
        # The activity page filters by action (one row per replayed message: millions).
        indexes = [models.Index(fields=["action", "-created_at"], name="activity_action_newest")]


def hash_token(raw):
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """An API token. Only its SHA-256 is stored; the key is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    # A token acting as one of its user's teams sees and changes that team's scope only, with
    # the user's role in that team (narrower, never wider); null: it acts as its user.
    team = models.ForeignKey(
        "recovery.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="tokens"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=8)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "recovery"

    @classmethod
    def issue(cls, user, name="", team=None):
        if team is not None and not user.memberships.filter(team=team).exists():
            raise ValueError(f"{user.get_username()} is not in team {team}")
        raw = "lz_" + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, team=team, prefix=raw[:8], digest=hash_token(raw)
        )
        return token, raw

    @classmethod
    def authenticate(cls, raw):
        token = (
            cls.objects.select_related("user", "team")
            .filter(digest=hash_token(raw), revoked_at__isnull=True, user__is_active=True)
            .first()
        )
        if token is not None:
            cls.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token

    def revoke(self):
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
