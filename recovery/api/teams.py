"""teams (admin): teams, their scopes and their members, so other teams' automation can be set
up through the API as well as the console. Scopes are globs (``recovery.access.teams``); a bad
pattern is a 400 naming the field."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers

from recovery.api.bases import Logged, StrictModelSerializer, StrictTeamField
from recovery.models import Membership, Team, TeamScope


class TeamScopeSerializer(StrictModelSerializer):
    team = StrictTeamField(queryset=Team.objects.all())

    class Meta:
        model = TeamScope
        fields = ["id", "team", "vhost", "queue_pattern", "exchange_pattern"]

    def validate(self, attrs):
        scope = TeamScope(**{**self._current(), **attrs})
        try:
            scope.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"non_field_errors": exc.messages}) from None
        return attrs

    def _current(self):
        if self.instance is None:
            return {}
        fields = ("team", "vhost", "queue_pattern", "exchange_pattern")
        return {name: getattr(self.instance, name) for name in fields}


class MembershipSerializer(StrictModelSerializer):
    team = StrictTeamField(queryset=Team.objects.all())
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all(), help_text="username"
    )
    role = serializers.ChoiceField(choices=Membership.TeamRole.choices, required=False)

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "bodies", "unmask", "export"]
        extra_kwargs = {
            "bodies": {"help_text": "Reads bodies in this team (false: metadata only)."},
            "unmask": {"help_text": "May unmask this team's messages (break-glass, a reason)."},
            "export": {"help_text": "May export this team's messages (JSON Lines, masked)."},
        }


class TeamSerializer(StrictModelSerializer):
    scopes = TeamScopeSerializer(many=True, read_only=True)
    members = MembershipSerializer(source="memberships", many=True, read_only=True)

    class Meta:
        model = Team
        fields = ["id", "name", "created_at", "scopes", "members"]
        read_only_fields = ["created_at"]


@extend_schema_view(
    get=extend_schema(summary="Teams, with their scopes and members (admin)"),
    post=extend_schema(summary="Create a team (admin)"),
)
class TeamList(Logged, generics.ListCreateAPIView):
    serializer_class = TeamSerializer
    queryset = Team.objects.prefetch_related("scopes", "memberships__user")
    noun = "team"


@extend_schema_view(
    get=extend_schema(summary="One team (admin)"),
    put=extend_schema(summary="Rename a team (admin)"),
    patch=extend_schema(summary="Rename a team (admin)"),
    delete=extend_schema(summary="Delete a team, its scopes and memberships (admin)"),
)
class TeamDetail(Logged, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = TeamSerializer
    queryset = Team.objects.prefetch_related("scopes", "memberships__user")
    noun = "team"


@extend_schema_view(
    get=extend_schema(summary="Team scopes (admin)"),
    post=extend_schema(
        summary="Add a scope to a team (admin)",
        description="A vhost and glob patterns (`*` any run of characters, `?` one, the rest "
        "literal, matched against the whole name): a message is in scope when its vhost is "
        "this one and its source queue matches `queue_pattern` or its source exchange matches "
        "`exchange_pattern`. An empty pattern matches nothing; name at least one.",
    ),
)
class TeamScopeList(Logged, generics.ListCreateAPIView):
    serializer_class = TeamScopeSerializer
    queryset = TeamScope.objects.all()
    noun = "team_scope"


@extend_schema_view(
    get=extend_schema(summary="One team scope (admin)"),
    put=extend_schema(summary="Change a team scope (admin)"),
    patch=extend_schema(summary="Change a team scope (admin)"),
    delete=extend_schema(summary="Remove a team scope (admin)"),
)
class TeamScopeDetail(Logged, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = TeamScopeSerializer
    queryset = TeamScope.objects.all()
    noun = "team_scope"


@extend_schema_view(
    get=extend_schema(summary="Team memberships (admin)"),
    post=extend_schema(
        summary="Add a user to a team with a role (admin)",
        description="From then on the user has only their team roles, over their teams' "
        "scopes (their global role no longer applies). Admins stay global.",
    ),
)
class MembershipList(Logged, generics.ListCreateAPIView):
    serializer_class = MembershipSerializer
    queryset = Membership.objects.select_related("user")
    noun = "membership"


@extend_schema_view(
    get=extend_schema(summary="One membership (admin)"),
    put=extend_schema(summary="Change a member's role (admin)"),
    patch=extend_schema(summary="Change a member's role (admin)"),
    delete=extend_schema(summary="Remove a user from a team (admin)"),
)
class MembershipDetail(Logged, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = MembershipSerializer
    queryset = Membership.objects.select_related("user")
    noun = "membership"
