"""masking-rules (admin): what is hidden wherever message content is shown (docs/security.md,
"Private data"), so a team's automation can keep its rules beside its code, as the console's
Masking page does by hand. A rule that does not compile (a bad JSON path, a regular expression
the ``regex`` package refuses) is a 400 naming ``pattern``; every change is an activity row with
the same action names as the console's."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers

from recovery.api.bases import (
    Logged,
    StrictModelSerializer,
    StrictTeamField,
)
from recovery.models import MaskRule, Team


class MaskRuleSerializer(StrictModelSerializer):
    team = StrictTeamField(
        queryset=Team.objects.all(),
        allow_null=True,
        required=False,
        help_text="null: a global rule, applied to every message; else applied to the messages "
        "in that team's scopes, whoever looks at them.",
    )
    kind = serializers.ChoiceField(
        choices=MaskRule.Kind.choices,
        help_text="`header`: a header name (any case); `json_path`: a path into JSON bodies "
        "(`$.card.number`, `$.items[*].email`); `regex`: a regular expression over text.",
    )
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = MaskRule
        fields = ["id", "team", "kind", "pattern", "note", "created_by", "created_at"]
        read_only_fields = ["created_by", "created_at"]

    def validate(self, attrs):
        current = {}
        if self.instance is not None:
            current = {name: getattr(self.instance, name) for name in ("kind", "pattern")}
        rule = MaskRule(**{**current, **{k: attrs[k] for k in ("kind", "pattern") if k in attrs}})
        try:
            rule.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return attrs


class _MaskRules(Logged):
    # Logged as the console logs the same change (console/views/masking.py).
    serializer_class = MaskRuleSerializer
    queryset = MaskRule.objects.select_related("team", "created_by")
    noun = "mask_rule"
    records_creator = True


@extend_schema_view(
    get=extend_schema(summary="Masking rules, global and per team (admin)"),
    post=extend_schema(
        summary="Add a masking rule (admin)",
        description="Applies from the next request on, to every path that shows content: "
        "detail, decoded form, downloads, the API's bodies, exports, notifications, group "
        "labels and samples. The stored bytes are never changed (a replay sends them).",
    ),
)
class MaskRuleList(_MaskRules, generics.ListCreateAPIView):
    pass


@extend_schema_view(
    get=extend_schema(summary="One masking rule (admin)"),
    put=extend_schema(summary="Change a masking rule (admin)"),
    patch=extend_schema(summary="Change a masking rule (admin)"),
    delete=extend_schema(summary="Remove a masking rule (admin)"),
)
class MaskRuleDetail(_MaskRules, generics.RetrieveUpdateDestroyAPIView):
    pass
