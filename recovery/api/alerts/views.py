"""The alert-rules and alert-channels views (recovery/api/alerts/__init__.py says who may do
what)."""

import datetime

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.alerts.serializers import (
    AlertRuleSerializer,
    ChannelSerializer,
    ChannelWithSecretSerializer,
    ChannelWriteSerializer,
    MuteSerializer,
)
from recovery.api.bases import ByIdCursorPagination
from recovery.api.permissions import AdminOnly, RolePermission
from recovery.models import Activity, AlertRule, NotificationChannel, Role, scope_of


class AdminWrites(RolePermission):
    """Viewers read; creating, changing and deleting takes an admin."""

    def has_permission(self, request, view):
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            self.required = Role.ADMIN
        return super().has_permission(request, view)


@extend_schema(summary="Alert rules and their state (admins create)")
class AlertRuleList(generics.ListCreateAPIView):
    serializer_class = AlertRuleSerializer
    pagination_class = ByIdCursorPagination
    permission_classes = [AdminWrites]
    team_scoped = True

    def get_queryset(self):
        return scope_of(self.request).owned(AlertRule.objects.prefetch_related("channels"))

    def perform_create(self, serializer):
        rule = serializer.save()
        _record(self.request, "alert_rule_created", rule)


def _record(request, action, target, detail=None):
    """An activity row of an alert rule's or channel's change through the API: the object says
    what it keeps of itself (``activity_detail``), as the console's row of the same change does."""
    Activity.record(
        request.user, action, target, detail, via="api", team=scope_of(request).acting_team
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
        _record(self.request, "alert_rule_changed", rule, {"fields": changed})

    def perform_destroy(self, rule):
        _record(self.request, "alert_rule_deleted", rule)
        rule.delete()


@extend_schema(
    summary="Mute an alert rule for a while (admin)",
    request=MuteSerializer,
    responses=AlertRuleSerializer,
    description="A muted rule keeps its state and history and notifies nobody until then.",
)
@api_view(["POST"])
@permission_classes([AdminOnly])
def mute_rule(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    body = MuteSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    minutes = body.validated_data["minutes"]
    rule.muted_until = timezone.now() + datetime.timedelta(minutes=minutes)
    rule.save(update_fields=["muted_until"])
    _record(request, "alert_rule_muted", rule, {"minutes": minutes})
    return Response(AlertRuleSerializer(rule, context={"request": request}).data)


@extend_schema(summary="Unmute an alert rule (admin)", request=None, responses=AlertRuleSerializer)
@api_view(["POST"])
@permission_classes([AdminOnly])
def unmute_rule(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    rule.muted_until = None
    rule.save(update_fields=["muted_until"])
    _record(request, "alert_rule_muted", rule, {"minutes": 0})
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
    pagination_class = ByIdCursorPagination
    permission_classes = [AdminWrites]
    team_scoped = True

    def get_queryset(self):
        return scope_of(self.request).owned(NotificationChannel.objects.all())

    def create(self, request, *args, **kwargs):
        body = ChannelWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        channel = body.save()
        _record(request, "channel_created", channel)
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
        _record(request, "channel_changed", channel, {"fields": changed})
        return Response(ChannelSerializer(channel, context={"request": request}).data)

    def perform_destroy(self, channel):
        _record(self.request, "channel_deleted", channel)
        channel.delete()


@extend_schema(
    summary="Rotate a channel's signing secret (admin); the answer shows it once",
    request=None,
    responses=ChannelWithSecretSerializer,
    description="The old secret stops signing at once: receivers must switch to the new one.",
)
@api_view(["POST"])
@permission_classes([AdminOnly])
def rotate_channel_secret(request, pk):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    channel.rotate_secret()
    _record(request, "channel_secret_rotated", channel)
    return Response(ChannelWithSecretSerializer(channel, context={"request": request}).data)
