"""What the alert-rules and alert-channels API takes and answers; the enums named in the
schema (console/settings.py SPECTACULAR ENUM_NAME_OVERRIDES)."""

import copy
import datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.alerts.params import (
    FOR_SECONDS_MAX,
    MUTE_MINUTES_MAX,
    REMIND_SECONDS_MAX,
    params_problems,
    target_problems,
    vhost_problem,
)
from recovery.api.bases import StrictTeamField
from recovery.api.params import StrictCharField, StrictIntegerField
from recovery.masking.policy import mask_for_display
from recovery.models import AlertRule, NotificationChannel, Role, Team, has_role
from recovery.models.masking import MaskingRules


@extend_schema_field({"type": "boolean"})
class JsonBooleanField(serializers.Field):
    """true or false, as JSON booleans (DRF alone takes "yes", 1 and "on")."""

    default_error_messages = {"invalid": "Use true or false."}

    def to_internal_value(self, value):
        if isinstance(value, bool):
            return value
        self.fail("invalid")

    def to_representation(self, value):
        return value


def _scope_field(max_length):
    return StrictCharField(required=False, allow_blank=True, max_length=max_length)


class AlertRuleSerializer(serializers.ModelSerializer):
    name = StrictCharField(max_length=200)
    vhost = _scope_field(255)
    queue = _scope_field(255)
    exchange = _scope_field(255)
    group_key = _scope_field(64)
    enabled = JsonBooleanField(required=False)
    remind_every_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=60, max_value=REMIND_SECONDS_MAX
    )
    channels = serializers.PrimaryKeyRelatedField(
        many=True, queryset=NotificationChannel.objects.all(), required=False
    )
    team = StrictTeamField(
        queryset=Team.objects.all(),
        required=False,
        allow_null=True,
        help_text="A team's rule (its members see it): it must watch a message kind, a vhost "
        "and a queue or exchange inside the team's scopes, and notify only the team's channels. "
        "null: a rule for users in no team.",
    )
    for_seconds = StrictIntegerField(required=False, min_value=0, max_value=FOR_SECONDS_MAX)
    params = serializers.DictField(
        required=False,
        help_text="the kind's parameters (docs/alerts.md); unknown names and values of the "
        "wrong type or out of range are refused",
    )
    state = serializers.ChoiceField(
        source="current_state",
        choices=AlertRule.State.choices,
        read_only=True,
        help_text="ok, firing, or unknown: its check raised (last_error), or it has not been "
        "evaluated lately (beat stopped); unknown is never reported as ok (docs/alerts.md)",
    )
    unknown_reason = serializers.CharField(
        read_only=True, help_text='why the state is unknown ("" when it is known)'
    )
    last_known_state = serializers.ChoiceField(
        choices=AlertRule.State.choices[:2],  # ALERT_KNOWN_STATES (defined below)
        read_only=True,
        help_text="what the last check that could look decided (while unknown: what it was)",
    )

    class Meta:
        model = AlertRule
        fields = [
            "id",
            "name",
            "kind",
            "params",
            "vhost",
            "queue",
            "exchange",
            "group_key",
            "for_seconds",
            "remind_every_seconds",
            "enabled",
            "muted_until",
            "channels",
            "team",
            "state",
            "unknown_reason",
            "last_known_state",
            "state_since",
            "last_evaluated_at",
            "last_value",
            "last_summary",
            "last_items",
            "last_error",
        ]
        read_only_fields = [
            "id",
            "state",
            "unknown_reason",
            "last_known_state",
            "state_since",
            "last_evaluated_at",
            "last_value",
            "last_summary",
            "last_items",
            "last_error",
        ]

    def to_internal_value(self, data):
        # DRF would take any iterable (a JSON object too) as the list of channel ids.
        if isinstance(data, dict) and "channels" in data and not isinstance(data["channels"], list):
            raise serializers.ValidationError({"channels": ["a list of channel ids"]})
        return super().to_internal_value(data)

    def validate_vhost(self, vhost):
        problem = vhost_problem(vhost)
        if problem:
            raise serializers.ValidationError(problem)
        return vhost

    def validate(self, attrs):
        # A PATCH of the kind alone checks the saved params against the new kind.
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        params = attrs.get("params", getattr(self.instance, "params", {}))
        problems = params_problems(kind, params)
        if problems:
            raise serializers.ValidationError({"params": problems})
        fields = ("kind", "vhost", "queue", "exchange")
        rule = AlertRule(
            team=attrs.get("team", getattr(self.instance, "team", None)),
            **{name: attrs.get(name, getattr(self.instance, name, "")) for name in fields},
        )
        if "channels" in attrs:
            channels = attrs["channels"]
        else:
            channels = list(self.instance.channels.all()) if self.instance else []
        problems = rule.team_problems(channels)
        if problems:
            raise serializers.ValidationError(problems)
        return attrs

    def to_representation(self, rule):
        data = super().to_representation(rule)
        data["remind_every_seconds"] = (
            int(rule.remind_every.total_seconds()) if rule.remind_every else None
        )
        # Free text as the console shows it: masked (loaded once for a page of rules).
        if "masking" not in self.context:
            self.context["masking"] = MaskingRules.load()
        shown = copy.copy(rule)
        mask_for_display([shown], masking=self.context["masking"])
        for name in ("last_summary", "last_error", "last_items"):
            data[name] = getattr(shown, name)
        return data

    @staticmethod
    def _remind_every(validated):
        if "remind_every_seconds" in validated:
            seconds = validated.pop("remind_every_seconds")
            validated["remind_every"] = datetime.timedelta(seconds=seconds) if seconds else None

    def create(self, validated):
        self._remind_every(validated)
        return super().create(validated)

    def update(self, rule, validated):
        self._remind_every(validated)
        return super().update(rule, validated)


def _is_admin(serializer) -> bool:
    request = serializer.context.get("request")
    return bool(request and has_role(request.user, Role.ADMIN))


class ChannelSerializer(serializers.ModelSerializer):
    failing = serializers.BooleanField(read_only=True)
    target = serializers.SerializerMethodField()
    last_error = serializers.SerializerMethodField()

    class Meta:
        model = NotificationChannel
        fields = [
            "id",
            "name",
            "kind",
            "target",
            "enabled",
            "failing",
            "consecutive_failures",
            "last_error",
            "last_success_at",
            "team",
        ]
        read_only_fields = fields

    def get_target(self, channel) -> str | None:
        """The URL or addresses; null unless the caller is an admin."""
        return channel.target if _is_admin(self) else None

    def get_last_error(self, channel) -> str:
        """The last failure; for non-admins with URLs cut to scheme and host."""
        return channel.last_error if _is_admin(self) else channel.public_error


class ChannelWriteSerializer(serializers.ModelSerializer):
    """What an admin sends to create (name, kind, target) or change (any but kind) a channel."""

    name = StrictCharField(max_length=200)
    target = StrictCharField(max_length=2000)
    enabled = JsonBooleanField(required=False)
    team = StrictTeamField(
        queryset=Team.objects.all(),
        required=False,
        allow_null=True,
        help_text="A team's channel (its members see it, never its target); null: for users "
        "in no team.",
    )

    class Meta:
        model = NotificationChannel
        fields = ["name", "kind", "target", "enabled", "team"]

    def validate(self, attrs):
        if self.instance is not None and "team" in attrs:
            # Every rule notifies channels of its own team only (global rules: global ones),
            # so a channel any other team's rule or a global rule uses stays where it is.
            team = attrs["team"]
            rules = self.instance.rules.all()
            others = rules.exclude(team=team) if team else rules.filter(team__isnull=False)
            if others.exists():
                raise serializers.ValidationError(
                    {"team": ["rules of another team (or global rules) notify this channel"]}
                )
        if self.instance is not None and attrs.get("kind", self.instance.kind) != (
            self.instance.kind
        ):
            raise serializers.ValidationError({"kind": ["cannot change: create a new channel"]})
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        if "target" in attrs or self.instance is None:
            attrs["target"] = attrs.get("target", "").strip()
            problems = target_problems(kind, attrs["target"])
            if problems:
                raise serializers.ValidationError({"target": problems})
        return attrs


class ChannelWithSecretSerializer(ChannelSerializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="the webhook signing secret: shown only in this answer (create, rotate)",
    )

    class Meta(ChannelSerializer.Meta):
        fields = [*ChannelSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class MuteSerializer(serializers.Serializer):
    minutes = StrictIntegerField(min_value=1, max_value=MUTE_MINUTES_MAX, help_text="how long")


AlertKind = AlertRule.Kind
ChannelKind = NotificationChannel.Kind
# A rule's state (ok, firing, unknown) and the last state a check decided (ok, firing): enums
# named in the schema (console/settings.py SPECTACULAR ENUM_NAME_OVERRIDES).
AlertRuleState = AlertRule.State
ALERT_KNOWN_STATES = AlertRule.State.choices[:2]
