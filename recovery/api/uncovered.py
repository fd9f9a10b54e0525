"""uncovered-queues: the queues and exchanges whose dead letters Lazarus cannot see, and the
vhosts it could not look at (recovery/broker/coverage.py)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.permissions import requires
from recovery.broker.coverage import uncovered_everywhere
from recovery.models import Role

UNCOVERED_KINDS = ("queue", "exchange")


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
