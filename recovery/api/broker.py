"""broker: the broker's health (nodes against their alarm limits, alarms, blocked connections,
the recovery queues) and its own tally of what it dead-lettered or dropped against the store.
What cannot be seen is said (``health.error``, ``tally.unreadable``, ``tally.stale``)."""

import datetime

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.permissions import requires
from recovery.broker.health import broker_health
from recovery.models import BrokerTally, Role


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    running = serializers.BooleanField()
    mem_used = serializers.IntegerField(allow_null=True)
    mem_limit = serializers.IntegerField(allow_null=True)
    mem_percent = serializers.FloatField(allow_null=True)
    mem_alarm = serializers.BooleanField(allow_null=True, help_text="null: not reported")
    disk_free = serializers.IntegerField(allow_null=True)
    disk_free_limit = serializers.IntegerField(allow_null=True)
    disk_free_alarm = serializers.BooleanField(allow_null=True, help_text="null: not reported")
    fd_used = serializers.IntegerField(allow_null=True)
    fd_total = serializers.IntegerField(allow_null=True)
    fd_percent = serializers.FloatField(allow_null=True)
    sockets_used = serializers.IntegerField(allow_null=True)
    sockets_total = serializers.IntegerField(allow_null=True)
    uptime_seconds = serializers.IntegerField(allow_null=True)


class RecoveryQueueSerializer(serializers.Serializer):
    vhost = serializers.CharField()
    name = serializers.CharField()
    # null: the management API left it out (statistics disabled): unknown, never 0.
    messages = serializers.IntegerField(allow_null=True, help_text="null: unknown")
    ready = serializers.IntegerField(allow_null=True, help_text="null: unknown")
    unacked = serializers.IntegerField(allow_null=True, help_text="null: unknown")
    consumers = serializers.IntegerField(allow_null=True, help_text="null: unknown")
    publish_rate = serializers.FloatField(allow_null=True)
    deliver_rate = serializers.FloatField(allow_null=True)
    delivery_limit = serializers.CharField(
        help_text='the effective delivery limit: "unlimited", a number, or "unknown"'
    )
    limit_problem = serializers.CharField(help_text="what a limit means here, empty if none")


class BlockedSerializer(serializers.Serializer):
    name = serializers.CharField()
    user = serializers.CharField()
    vhost = serializers.CharField()
    state = serializers.CharField()
    client = serializers.CharField()


class HealthSerializer(serializers.Serializer):
    ok = serializers.BooleanField(help_text="no alarm, nothing blocked, every recovery queue seen")
    checked_at = serializers.FloatField(help_text="Unix time of the management API read")
    error = serializers.CharField(help_text="the management API did not answer: all unknown")
    unknown = serializers.ListField(
        child=serializers.CharField(), help_text="what the management API did not say"
    )
    alarms = serializers.ListField(child=serializers.CharField())
    nodes = NodeSerializer(many=True)
    blocked_connections = BlockedSerializer(many=True)
    queues = RecoveryQueueSerializer(many=True)
    missing_queues = serializers.ListField(child=serializers.CharField())


class TallyFiguresSerializer(serializers.Serializer):
    dead_lettered = serializers.IntegerField(allow_null=True)
    stored_dead_letters = serializers.IntegerField(allow_null=True)
    backlog_change = serializers.IntegerField(allow_null=True)
    gap = serializers.IntegerField(
        allow_null=True, help_text="dead-lettered − stored − backlog change"
    )
    discarded = serializers.IntegerField(allow_null=True, help_text="no dead-letter exchange")
    unroutable_dropped = serializers.IntegerField(allow_null=True)
    unroutable_returned = serializers.IntegerField(allow_null=True)


class TallyHourSerializer(TallyFiguresSerializer):
    hour = serializers.DateTimeField()
    samples = serializers.IntegerField()
    unreadable = serializers.IntegerField()


class TallySerializer(serializers.Serializer):
    newest_at = serializers.DateTimeField(allow_null=True)
    stale = serializers.BooleanField(help_text="no sample lately: beat is not sampling")
    unreadable = serializers.BooleanField(help_text="the newest sample could not read them")
    error = serializers.CharField()
    last_hour = TallyFiguresSerializer()
    hours = TallyHourSerializer(many=True)


class BrokerSerializer(serializers.Serializer):
    health = HealthSerializer()
    tally = TallySerializer()


@extend_schema(
    summary="The broker's health and its own tally of dead-lettered and dropped messages",
    responses=BrokerSerializer,
)
@api_view(["GET"])
@permission_classes([requires(Role.VIEWER)])
def broker(request):
    health = broker_health()
    state = BrokerTally.objects.state()
    newest = state["newest"]
    hours = BrokerTally.objects.by_hour(timezone.now() - datetime.timedelta(hours=24))
    return Response(
        {
            "health": health.as_dict(),
            "tally": {
                "newest_at": newest.taken_at if newest else None,
                "stale": state["stale"],
                "unreadable": state["unreadable"],
                "error": newest.error if newest else "",
                "last_hour": {k: v for k, v in state["hour"].items() if k != "unknown_intervals"},
                "hours": list(hours),
            },
        }
    )
