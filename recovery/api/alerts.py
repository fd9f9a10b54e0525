"""alert-rules, alert-channels, uncovered-queues: what Lazarus watches, who it tells, and what
it cannot see. Everyone reads rules and channels (a channel's target and secret only admins);
admins create rules. Definitions of the kinds and their params: docs/alerts.md."""

import datetime

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import StrictCharField, StrictIntegerField
from recovery.api.permissions import RolePermission, requires
from recovery.broker.coverage import uncovered_everywhere
from recovery.models import Activity, AlertRule, NotificationChannel, Role, has_role


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
    for_seconds = StrictIntegerField(required=False, min_value=0, max_value=7 * 24 * 3600)
    params = serializers.DictField(required=False)

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
            "state",
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

    def to_representation(self, rule):
        data = super().to_representation(rule)
        data["remind_every_seconds"] = (
            int(rule.remind_every.total_seconds()) if rule.remind_every else None
        )
        return data

    def create(self, validated):
        seconds = validated.pop("remind_every_seconds", None)
        if seconds:
            validated["remind_every"] = datetime.timedelta(seconds=seconds)
        return super().create(validated)


class ChannelSerializer(serializers.ModelSerializer):
    failing = serializers.BooleanField(read_only=True)
    target = serializers.SerializerMethodField()

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
        ]
        read_only_fields = fields

    def get_target(self, channel) -> str | None:
        """The URL or addresses; null unless the caller is an admin."""
        request = self.context.get("request")
        return channel.target if request and has_role(request.user, Role.ADMIN) else None


class NewestFirst(StrictCursorPagination):
    ordering = ("id",)


class AdminWrites(RolePermission):
    """Viewers read; creating a rule takes an admin."""

    def has_permission(self, request, view):
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            self.required = Role.ADMIN
        return super().has_permission(request, view)


@extend_schema(summary="Alert rules and their state (admins create)")
class AlertRuleList(generics.ListCreateAPIView):
    serializer_class = AlertRuleSerializer
    pagination_class = NewestFirst
    permission_classes = [AdminWrites]
    queryset = AlertRule.objects.prefetch_related("channels")

    def perform_create(self, serializer):
        rule = serializer.save()
        Activity.objects.create(
            user=self.request.user,
            action="alert_rule_created",
            via="api",
            detail={"id": rule.pk, "name": rule.name},
        )


@extend_schema(summary="One alert rule")
class AlertRuleDetail(generics.RetrieveAPIView):
    serializer_class = AlertRuleSerializer
    queryset = AlertRule.objects.prefetch_related("channels")


@extend_schema(summary="Notification channels (target: admins only)")
class ChannelList(generics.ListAPIView):
    serializer_class = ChannelSerializer
    pagination_class = NewestFirst
    queryset = NotificationChannel.objects.all()


UNCOVERED_KINDS = ("queue", "exchange")
AlertKind = AlertRule.Kind
ChannelKind = NotificationChannel.Kind


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
