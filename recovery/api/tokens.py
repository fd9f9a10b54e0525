"""tokens (admin): list and revoke API tokens; me: who a token acts as, with which role.

Tokens are created with ``manage.py create_api_token USER --role R`` (the key is printed once;
only its SHA-256 is stored). A token acts with its user's *current* role, exactly as that user
would in the console: changing the role changes every token of the user.
"""

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import StrictBooleanField, validated
from recovery.api.permissions import AdminOnly
from recovery.models import (
    Activity,
    ApiToken,
    Privilege,
    Role,
    Scope,
    Team,
    role_of,
    scope_of,
    team_scoped,
)


class TokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.get_username")
    team = serializers.CharField(
        source="team.name",
        allow_null=True,
        default=None,
        help_text="The team the token acts as (its user's role and scope there); null: it acts "
        "as its user.",
    )
    role = serializers.SerializerMethodField()
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "prefix",
            "name",
            "user",
            "team",
            "role",
            "active",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields

    def get_role(self, token) -> str | None:
        role = Scope.of(token.user, token.team_id).role if token.team_id else role_of(token.user)
        return role.value if role else None

    def get_active(self, token) -> bool:
        return token.revoked_at is None and token.user.is_active


class NewestTokenCursorPagination(StrictCursorPagination):
    ordering = ("-created_at", "-id")


class TokenFilterParams(serializers.Serializer):
    user = serializers.CharField(required=False, max_length=150, help_text="username")
    active = StrictBooleanField(
        required=False, help_text="only active (true) or revoked (false) tokens"
    )


@extend_schema(summary="API tokens (admin)", parameters=[TokenFilterParams])
class TokenList(generics.ListAPIView):
    serializer_class = TokenSerializer
    pagination_class = NewestTokenCursorPagination
    permission_classes = [AdminOnly]

    def get_queryset(self):
        params = validated(TokenFilterParams, self.request.query_params)
        tokens = ApiToken.objects.select_related("user", "team")
        if "user" in params:
            tokens = tokens.filter(user__username=params["user"])
        active = params.get("active")
        if active is True:
            tokens = tokens.filter(revoked_at__isnull=True, user__is_active=True)
        elif active is False:
            tokens = tokens.filter(revoked_at__isnull=False)
        return tokens


@extend_schema(
    summary="Revoke a token (admin)",
    request=None,
    responses=TokenSerializer,
    description="Effective at once, in every process. Revoking a revoked token changes nothing.",
)
@api_view(["POST"])
@permission_classes([AdminOnly])
def revoke_token(request, pk):
    token = get_object_or_404(ApiToken.objects.select_related("user"), pk=pk)
    if token.revoked_at is None:
        token.revoke()
        Activity.record(
            request.user,
            "token_revoked",
            detail={"token": token.prefix, "owner": token.user.get_username()},
            via="api",
        )
    return Response(TokenSerializer(token).data)


class MeSerializer(serializers.Serializer):
    user = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)
    token = serializers.CharField(allow_null=True, help_text="Prefix of the token in use.")
    team = serializers.CharField(
        allow_null=True, help_text="The team the token acts as; null: the user's own scope."
    )
    teams = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The teams whose scope this caller sees; null: every message (a global role).",
    )
    privileges = serializers.ListField(
        child=serializers.ChoiceField(choices=Privilege.choices),
        help_text="bodies (else metadata only), unmask, export: held globally or in at least "
        "one of the teams (docs/security.md, 'Private data').",
    )
    now = serializers.DateTimeField(help_text="Server time (UTC).")


@extend_schema(summary="Who this token acts as", responses=MeSerializer)
@team_scoped
@api_view(["GET"])
def me(request):
    token = request.auth if isinstance(request.auth, ApiToken) else None
    scope = scope_of(request)
    teams = scope.team_ids()
    return Response(
        MeSerializer(
            {
                "user": request.user.get_username(),
                "role": scope.role.value,
                "token": token.prefix if token else None,
                "team": scope.acting_team.name if scope.acting_team else None,
                "teams": None
                if teams is None
                else list(Team.objects.filter(pk__in=teams).values_list("name", flat=True)),
                "privileges": [p.value for p in Privilege if scope.may(p)],
                "now": timezone.now(),
            }
        ).data
    )
