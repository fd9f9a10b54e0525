"""Private data: masking rules, the break-glass unmasks that lift them for a while, and every
rule compiled once (``MaskingRules``). The engine is recovery.masking.engine; what one caller
may see of one message is recovery.masking.policy (docs/security.md, "Private data")."""

import dataclasses
import datetime
import logging

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from recovery.access.models import Activity
from recovery.masking.engine import NO_MASKING, compile_rule, masker_of

log = logging.getLogger(__name__)
# What a rule that no longer compiles is replaced by: everything.
CATCH_ALL = r"(?s).+"

PATTERN_MAX_LENGTH = 500


class MaskRule(models.Model):
    """One thing to hide wherever a message's content is shown: a header (by name, any case),
    a JSON path into JSON bodies (``$.card.number``, ``$.items[*].email``), or a regular
    expression over text bodies. ``team`` None: a global rule, applied to every message; else
    applied to the messages in that team's scopes, whoever looks at them."""

    class Kind(models.TextChoices):
        HEADER = "header", "header name"
        JSON_PATH = "json_path", "JSON path"
        REGEX = "regex", "regular expression"

    team = models.ForeignKey(
        "recovery.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="mask_rules"
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    pattern = models.CharField(max_length=PATTERN_MAX_LENGTH)
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "kind", "id"]

    def __str__(self):
        return f"{self.get_kind_display()} {self.pattern!r}"

    def activity_detail(self):
        """What an activity row keeps of a change to this rule (console and API alike)."""
        return {
            "rule": self.pk,
            "kind": self.kind,
            "pattern": self.pattern,
            "team": self.team.name if self.team else "",
        }

    def clean(self):
        if any(ord(char) < 32 and char not in "\t" for char in self.pattern):
            raise ValidationError({"pattern": "control characters are not allowed"})
        try:
            compile_rule(self.kind, self.pattern)
        except ValueError as exc:
            raise ValidationError({"pattern": str(exc)}) from None


class Unmask(models.Model):
    """A break-glass unmask: ``user`` reads ``message`` unmasked until ``expires_at``, for the
    reason they gave. Logged as an ``unmask`` activity row as well (who, which, why)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    # DO_NOTHING: retention's deletes stay as they were; an unmask of a deleted message is
    # inert (it expires, and there is nothing left to show).
    message = models.ForeignKey(
        "recovery.Message", on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user", "message", "-expires_at"], name="unmask_active")]

    @classmethod
    def grant(cls, user, message, reason, via="console", now=None, team=None):
        reason = (reason or "").strip()
        if not reason:
            raise ValidationError({"reason": "say why you need the unmasked content"})
        now = now or timezone.now()
        unmask = cls.objects.create(
            user=user,
            message=message,
            reason=reason[:500],
            created_at=now,
            expires_at=now + datetime.timedelta(seconds=settings.UNMASK_SECONDS),
        )
        Activity.record(
            user,
            "unmask",
            detail={
                "message": message.pk,
                "reason": unmask.reason,
                "until": unmask.expires_at.isoformat(),
            },
            via=via,
            message=message,
            team=team,
            at=now,
        )
        return unmask

    @classmethod
    def active(cls, user, message_id, now=None):
        """The user's unexpired unmask of that message, or None."""
        if user is None or not user.is_authenticated:
            return None
        return (
            cls.objects.filter(
                user=user, message_id=message_id, expires_at__gt=now or timezone.now()
            )
            .order_by("-expires_at")
            .first()
        )


@dataclasses.dataclass
class MaskingRules:
    """Every rule, compiled once: the global ones and each team's with its scopes."""

    global_rules: list
    team_rules: dict  # team id -> (scopes, rules)
    # (vhost, queue, exchange) -> Masker: a page of rows from a few queues compiles a few.
    _maskers: dict = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def load(cls):
        from recovery.access.teams import TeamScope

        global_rules, by_team = [], {}
        for rule in MaskRule.objects.all():
            try:
                compiled = (rule.kind, compile_rule(rule.kind, rule.pattern))
            except ValueError as exc:
                # Saved past the form (by hand, an older regex version): failing closed, it
                # masks whole bodies rather than none, and says so in the log.
                log.error(
                    "masking rule %s cannot be applied (%s): masking whole bodies", rule.pk, exc
                )
                compiled = ("regex", compile_rule("regex", CATCH_ALL))
            if rule.team_id is None:
                global_rules.append(compiled)
            else:
                by_team.setdefault(rule.team_id, []).append(compiled)
        scopes = {}
        for scope in TeamScope.objects.filter(team_id__in=by_team):
            scopes.setdefault(scope.team_id, []).append(scope)
        team_rules = {team: (scopes.get(team, []), rules) for team, rules in by_team.items()}
        return cls(global_rules, team_rules)

    def __bool__(self):
        return bool(self.global_rules or self.team_rules)

    def rules_for(self, vhost, queue, exchange):
        rules = list(self.global_rules)
        for scopes, team_rules in self.team_rules.values():
            if any(scope.matches(vhost, queue, exchange) for scope in scopes):
                rules += team_rules
        return rules

    def masker_for(self, message):
        if not self:
            return NO_MASKING
        where = (message.vhost, message.source_queue, message.source_exchange)
        masker = self._maskers.get(where)
        if masker is None:
            masker = self._maskers[where] = masker_of(self.rules_for(*where))
        return masker

    def team_masker(self, team_id):
        """For text that belongs to no one message: the global rules and ``team_id``'s; with
        no team, every team's too (the text may come from any of them)."""
        rules = list(self.global_rules)
        for team, (_scopes, team_rules) in self.team_rules.items():
            if team_id is None or team == team_id:
                rules += team_rules
        return masker_of(rules)

    def notification_payload(self, body, team_id):
        """A notification's free text (summary, items, error) through the rules' regular
        expressions: a job's reason or a check's item can quote message content. A team's
        rule: the global rules and its team's; a global one: every rule (it may cover any
        team)."""
        masker = self.team_masker(team_id)
        if not masker:
            return body
        body = {**body}
        for key in ("summary", "error"):
            if isinstance(body.get(key), str):
                body[key] = masker.free_text(body[key])
        body["items"] = [
            masker.free_text(item) if isinstance(item, str) else item
            for item in body["items"] or []
        ]
        return body
