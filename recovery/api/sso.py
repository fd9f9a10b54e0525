"""sso-mappings (admin): which provider group gives which global role, or which role in which
team (recovery.access.sso; docs/security.md, "Single sign-on"), so the mappings can be kept
with the rest of a company's identity set-up rather than typed into the console. Applied at each
user's next sign-in; checked as the console's form checks them (a global role or a team with a
role, never both or neither; a group mapped twice the same way is a 400) and logged as it logs
them."""

import copy

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers

from recovery.api.bases import (
    Logged,
    StrictModelSerializer,
    StrictTeamField,
)
from recovery.models import GroupMapping, Membership, Role, Team


class GroupMappingSerializer(StrictModelSerializer):
    team = StrictTeamField(
        queryset=Team.objects.all(),
        allow_null=True,
        required=False,
        help_text="With `team_role`: the role this group gives in that team. Null: `role` is "
        "a global role.",
    )
    role = serializers.ChoiceField(
        choices=Role.choices, allow_blank=True, required=False, help_text="A global role."
    )
    team_role = serializers.ChoiceField(
        choices=Membership.TeamRole.choices, allow_blank=True, required=False
    )

    class Meta:
        model = GroupMapping
        fields = ["id", "group", "role", "team", "team_role", "created_at"]
        read_only_fields = ["created_at"]
        extra_kwargs = {
            "group": {"help_text": "A value of the groups claim, exactly (case included)."}
        }
        validators = []  # the model's constraints, checked in validate() with its messages

    def validate(self, attrs):
        # A copy of the stored mapping (not a new one with its id) so that its own row is no
        # duplicate of it.
        mapping = copy.copy(self.instance) if self.instance is not None else GroupMapping()
        for name, value in attrs.items():
            setattr(mapping, name, value)
        try:
            mapping.full_clean(exclude=["created_at"])
        except DjangoValidationError as exc:
            errors = exc.message_dict
            if NON_FIELD_ERRORS in errors:
                errors["non_field_errors"] = errors.pop(NON_FIELD_ERRORS)
            raise serializers.ValidationError(errors) from None
        return attrs


class _Mappings(Logged):
    # Logged as the console logs the same change (console/views/sso_mappings.py).
    serializer_class = GroupMappingSerializer
    queryset = GroupMapping.objects.select_related("team")
    noun = "sso_mapping"


@extend_schema_view(
    get=extend_schema(summary="Sign-in group mappings (admin)"),
    post=extend_schema(
        summary="Map a provider group to a role (admin)",
        description="A global `role`, or a `team` with a `team_role`. Applied at each user's "
        "next sign-in, where the strongest mapped role wins.",
    ),
)
class GroupMappingList(_Mappings, generics.ListCreateAPIView):
    pass


@extend_schema_view(
    get=extend_schema(summary="One sign-in group mapping (admin)"),
    put=extend_schema(summary="Change a sign-in group mapping (admin)"),
    patch=extend_schema(summary="Change a sign-in group mapping (admin)"),
    delete=extend_schema(summary="Remove a sign-in group mapping (admin)"),
)
class GroupMappingDetail(_Mappings, generics.RetrieveUpdateDestroyAPIView):
    pass
