"""Private data: masking rules, and the break-glass unmasks that lift them for a while
(docs/security.md, "Private data"). The masking itself is recovery.masking."""

import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

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

    def clean(self):
        from recovery.masking import compile_rule

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
    message = models.ForeignKey(
        "recovery.Message", on_delete=models.CASCADE, related_name="+", db_constraint=False
    )
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user", "message", "-expires_at"], name="unmask_active")]

    @classmethod
    def grant(cls, user, message, reason, via="console", now=None):
        from recovery.models.access import Activity

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
        Activity.objects.create(
            user=user,
            action="unmask",
            message=message,
            via=via,
            detail={
                "message": message.pk,
                "reason": unmask.reason,
                "until": unmask.expires_at.isoformat(),
            },
            created_at=now,
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
