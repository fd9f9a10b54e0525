"""decoder-rules (admin): how a queue's bodies are read when their properties do not say (JSON,
MessagePack, protobuf from an uploaded FileDescriptorSet, Avro from a schema or a registry), so
a team can keep them beside the code that writes those bodies. Checked as the console's form
checks them: the schema must load (a ``400`` naming ``descriptor_set_base64``, ``avro_schema``
or ``registry_url``), and every change is an activity row as the console logs it."""

import base64
import binascii
import copy

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers

from recovery.api.bases import Logged, StrictModelSerializer
from recovery.api.params import StrictCharField, StrictIntegerField
from recovery.models import DecoderRule
from recovery.models.decoders import SCHEMA_MAX_BYTES


class DescriptorSetField(StrictCharField):
    """The FileDescriptorSet's bytes as base64 (``protoc --include_imports
    --descriptor_set_out``)."""

    def to_internal_value(self, data):
        text = super().to_internal_value(data)
        if not text:
            return None
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise serializers.ValidationError("not base64") from None
        if len(raw) > SCHEMA_MAX_BYTES:
            raise serializers.ValidationError(f"larger than {SCHEMA_MAX_BYTES} bytes")
        return raw

    def to_representation(self, value):
        return base64.b64encode(bytes(value)).decode("ascii") if value else ""


class DecoderRuleSerializer(StrictModelSerializer):
    decoder = serializers.ChoiceField(choices=DecoderRule.Decoder.choices)
    descriptor_set_base64 = DescriptorSetField(
        source="descriptor_set",
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="protobuf: the FileDescriptorSet, base64 (protoc --include_imports "
        "--descriptor_set_out=orders.desc orders.proto).",
    )
    avro_schema = StrictCharField(
        required=False, allow_blank=True, max_length=SCHEMA_MAX_BYTES, help_text="avro: JSON."
    )
    position = StrictIntegerField(
        required=False, help_text="Rules are tried in this order (then by id)."
    )
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = DecoderRule
        fields = [
            "id",
            "name",
            "position",
            "vhost",
            "queue_pattern",
            "exchange_pattern",
            "content_encoding",
            "decoder",
            "descriptor_set_base64",
            "protobuf_type",
            "avro_schema",
            "registry_url",
            "created_by",
            "created_at",
        ]
        read_only_fields = ["created_by", "created_at"]
        validators = []  # the model's, in validate()

    def validate(self, attrs):
        rule = copy.copy(self.instance) if self.instance is not None else DecoderRule()
        for name, value in attrs.items():
            setattr(rule, name, value)
        try:
            rule.full_clean(exclude=["created_by", "created_at"])
        except DjangoValidationError as exc:
            errors = exc.message_dict
            if NON_FIELD_ERRORS in errors:
                errors["non_field_errors"] = errors.pop(NON_FIELD_ERRORS)
            if "descriptor_set" in errors:
                errors["descriptor_set_base64"] = errors.pop("descriptor_set")
            raise serializers.ValidationError(errors) from None
        return attrs


class _DecoderRules(Logged):
    # Logged as the console logs the same change (console/views/decoders.py).
    serializer_class = DecoderRuleSerializer
    queryset = DecoderRule.objects.select_related("created_by")
    noun = "decoder_rule"
    records_creator = True


@extend_schema_view(
    get=extend_schema(summary="Decoder rules (admin)"),
    post=extend_schema(
        summary="Add a decoder rule (admin)",
        description="Applies from the next read on; messages indexed for search before it "
        "keep their search text until `manage.py index_search --all` runs again.",
    ),
)
class DecoderRuleList(_DecoderRules, generics.ListCreateAPIView):
    pass


@extend_schema_view(
    get=extend_schema(summary="One decoder rule (admin)"),
    put=extend_schema(summary="Change a decoder rule (admin)"),
    patch=extend_schema(summary="Change a decoder rule (admin)"),
    delete=extend_schema(summary="Remove a decoder rule (admin)"),
)
class DecoderRuleDetail(_DecoderRules, generics.RetrieveUpdateDestroyAPIView):
    pass
