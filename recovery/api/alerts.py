"""alert-rules, alert-channels, uncovered-queues: what Lazarus watches, who it tells, and what
it cannot see. Everyone reads rules and channels (a channel's target only admins; its errors
with URLs cut to scheme and host for the rest); admins create, change, mute and delete rules,
and create, change, disable, delete channels and rotate their secret (shown once, in the answer
that made it). Definitions of the kinds and their params: docs/alerts.md and
recovery/alerts/params.py."""

import copy
import datetime

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.alerts.params import params_problems, target_problems, vhost_problem
from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import StrictCharField, StrictIntegerField
from recovery.api.permissions import RolePermission, requires
from recovery.api.teams import StrictTeamField
from recovery.broker.coverage import uncovered_everywhere
from recovery.masking.policy import mask_for_display
from recovery.models import Activity, AlertRule, NotificationChannel, Role, Team, has_role, scope_of
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
        required=False, allow_null=True, min_value=60, max_value=7 * 24 * 3600
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
    for_seconds = StrictIntegerField(required=False, min_value=0, max_value=7 * 24 * 3600)
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


class NewestFirst(StrictCursorPagination):
    ordering = ("id",)


class AdminWrites(RolePermission):
    """Viewers read; creating, changing and deleting takes an admin."""

    def has_permission(self, request, view):
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            self.required = Role.ADMIN
        return super().has_permission(request, view)


@extend_schema(summary="Alert rules and their state (admins create)")
class AlertRuleList(generics.ListCreateAPIView):
    serializer_class = AlertRuleSerializer
    pagination_class = NewestFirst
    permission_classes = [AdminWrites]
    team_scoped = True

    def get_queryset(self):
        return scope_of(self.request).owned(AlertRule.objects.prefetch_related("channels"))

    def perform_create(self, serializer):
        rule = serializer.save()
        Activity.record(
            self.request.user,
            "alert_rule_created",
            detail={"id": rule.pk, "name": rule.name},
            via="api",
            team=scope_of(self.request).acting_team,
        )


@extend_schema_view(
    get=extend_schema(summary="One alert rule"),
    patch=extend_schema(summary="Change an alert rule (admin): only the fields sent"),
    delete=extend_schema(summary="Delete an alert rule with its history (admin)"),
)
class AlertRuleDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = AlertRuleSerializer
    permission_classes = [AdminWrites]
    team_scoped = True
    # PATCH only: a PUT that forgot a field would reset it.
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return scope_of(self.request).owned(AlertRule.objects.prefetch_related("channels"))

    def perform_update(self, serializer):
        changed = sorted(set(self.request.data) & set(serializer.validated_data))
        rule = serializer.save()
        Activity.record(
            self.request.user,
            "alert_rule_changed",
            detail={"id": rule.pk, "name": rule.name, "fields": changed},
            via="api",
            team=scope_of(self.request).acting_team,
        )

    def perform_destroy(self, rule):
        Activity.record(
            self.request.user,
            "alert_rule_deleted",
            detail={"id": rule.pk, "name": rule.name},
            via="api",
            team=scope_of(self.request).acting_team,
        )
        rule.delete()


class MuteSerializer(serializers.Serializer):
    minutes = StrictIntegerField(min_value=1, max_value=30 * 24 * 60, help_text="how long")


@extend_schema(
    summary="Mute an alert rule for a while (admin)",
    request=MuteSerializer,
    responses=AlertRuleSerializer,
    description="A muted rule keeps its state and history and notifies nobody until then.",
)
@api_view(["POST"])
@permission_classes([requires(Role.ADMIN)])
def mute_rule(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    body = MuteSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    minutes = body.validated_data["minutes"]
    rule.muted_until = timezone.now() + datetime.timedelta(minutes=minutes)
    rule.save(update_fields=["muted_until"])
    Activity.record(
        request.user,
        "alert_rule_muted",
        detail={"id": rule.pk, "name": rule.name, "minutes": minutes},
        via="api",
        team=scope_of(request).acting_team,
    )
    return Response(AlertRuleSerializer(rule, context={"request": request}).data)


@extend_schema(summary="Unmute an alert rule (admin)", request=None, responses=AlertRuleSerializer)
@api_view(["POST"])
@permission_classes([requires(Role.ADMIN)])
def unmute_rule(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    rule.muted_until = None
    rule.save(update_fields=["muted_until"])
    Activity.record(
        request.user,
        "alert_rule_muted",
        detail={"id": rule.pk, "name": rule.name, "minutes": 0},
        via="api",
        team=scope_of(request).acting_team,
    )
    return Response(AlertRuleSerializer(rule, context={"request": request}).data)


@extend_schema_view(
    get=extend_schema(summary="Notification channels (target: admins only)"),
    post=extend_schema(
        summary="Create a notification channel (admin); the answer shows its secret once",
        request=ChannelWriteSerializer,
        responses={201: ChannelWithSecretSerializer},
    ),
)
class ChannelList(generics.ListCreateAPIView):
    serializer_class = ChannelSerializer
    pagination_class = NewestFirst
    permission_classes = [AdminWrites]
    team_scoped = True

    def get_queryset(self):
        return scope_of(self.request).owned(NotificationChannel.objects.all())

    def create(self, request, *args, **kwargs):
        body = ChannelWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        channel = body.save()
        Activity.record(
            request.user,
            "channel_created",
            detail={"id": channel.pk, "name": channel.name},
            via="api",
            team=scope_of(request).acting_team,
        )
        answer = ChannelWithSecretSerializer(channel, context={"request": request})
        return Response(answer.data, status=201)


@extend_schema_view(
    get=extend_schema(summary="One notification channel (target: admins only)"),
    patch=extend_schema(
        summary="Change a channel (admin): name, target, enabled (false: disabled)",
        request=ChannelWriteSerializer,
        responses=ChannelSerializer,
    ),
    delete=extend_schema(summary="Delete a channel with its notifications (admin)"),
)
class ChannelDetail(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ChannelSerializer
    permission_classes = [AdminWrites]
    team_scoped = True
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return scope_of(self.request).owned(NotificationChannel.objects.all())

    def update(self, request, *args, **kwargs):
        channel = self.get_object()
        body = ChannelWriteSerializer(channel, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        changed = sorted(set(body.validated_data))
        body.save()
        Activity.record(
            request.user,
            "channel_changed",
            detail={"id": channel.pk, "name": channel.name, "fields": changed},
            via="api",
            team=scope_of(request).acting_team,
        )
        return Response(ChannelSerializer(channel, context={"request": request}).data)

    def perform_destroy(self, channel):
        Activity.record(
            self.request.user,
            "channel_deleted",
            detail={"id": channel.pk, "name": channel.name},
            via="api",
            team=scope_of(self.request).acting_team,
        )
        channel.delete()


@extend_schema(
    summary="Rotate a channel's signing secret (admin); the answer shows it once",
    request=None,
    responses=ChannelWithSecretSerializer,
    description="The old secret stops signing at once: receivers must switch to the new one.",
)
@api_view(["POST"])
@permission_classes([requires(Role.ADMIN)])
def rotate_channel_secret(request, pk):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    channel.rotate_secret()
    Activity.record(
        request.user,
        "channel_secret_rotated",
        detail={"id": channel.pk, "name": channel.name},
        via="api",
        team=scope_of(request).acting_team,
    )
    return Response(ChannelWithSecretSerializer(channel, context={"request": request}).data)


UNCOVERED_KINDS = ("queue", "exchange")
AlertKind = AlertRule.Kind
ChannelKind = NotificationChannel.Kind
# A rule's state (ok, firing, unknown) and the last state a check decided (ok, firing): enums
# named in the schema (console/settings.py SPECTACULAR ENUM_NAME_OVERRIDES).
AlertRuleState = AlertRule.State
ALERT_KNOWN_STATES = AlertRule.State.choices[:2]


class UncoveredSerializer(serializers.Serializer):
    vhost = serializers.CharField()
    kind = serializers.ChoiceField(choices=UNCOVERED_KINDS)
    name = serializers.CharField()
    problem = serializers.ChoiceField(
        choices=[
            "no_dead_letter_exchange",
            "dead_letters_elsewhere",
            "dead_letters_at_most_once",
            "no_alternate_exchange",
            "recovery_delivery_limit",
            "delivery_limit_unknown",
        ]
    )
    detail = serializers.CharField()
    fix = serializers.CharField()
    policy = serializers.CharField(help_text="the queue's own policy that hides Lazarus's")


class UncoveredResponse(serializers.Serializer):
    results = UncoveredSerializer(many=True)
    unreachable = serializers.ListField(
        child=serializers.CharField(), help_text="vhosts it could not look at, with the error"
    )


@extend_schema(
    summary="Queues and exchanges Lazarus cannot collect from", responses=UncoveredResponse
)
@api_view(["GET"])
@permission_classes([requires(Role.VIEWER)])
def uncovered_queues(request):
    rows, unreachable = uncovered_everywhere()
    return Response({"results": [r.as_dict() for r in rows], "unreachable": unreachable})
