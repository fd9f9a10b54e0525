import base64

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.models import Message, ReplayAttempt


class MessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Message
        fields = [
            "id",
            "kind",
            "vhost",
            "source_queue",
            "source_exchange",
            "routing_keys",
            "reason",
            "death_count",
            "first_death_at",
            "last_death_at",
            "message_id",
            "correlation_id",
            "content_type",
            "content_encoding",
            "body_size",
            "group_key",
            "status",
            "status_reason",
            "replay_count",
            "origin",
            "collected_at",
            "last_replayed_at",
        ]
        read_only_fields = fields


class MessageDetailSerializer(MessageSerializer):
    properties = serializers.JSONField(read_only=True)
    headers = serializers.JSONField(
        read_only=True,
        help_text="AMQP headers. Values JSON cannot carry are tagged: "
        '{"$t": "decimal|timestamp|bytes|float|table", "v": ...}.',
    )
    body_base64 = serializers.SerializerMethodField()
    body_text = serializers.SerializerMethodField()

    class Meta(MessageSerializer.Meta):
        fields = [
            *MessageSerializer.Meta.fields,
            "properties",
            "headers",
            "body_base64",
            "body_text",
            "group_label",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_body_base64(self, obj):
        return base64.b64encode(obj.body_bytes).decode("ascii")

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_body_text(self, obj):
        try:
            return obj.body_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return None


class ReplayRequestSerializer(serializers.Serializer):
    exchange = serializers.CharField(required=False, allow_blank=True, max_length=255)
    routing_key = serializers.CharField(required=False, allow_blank=True, max_length=255)
    queue = serializers.CharField(
        required=False, max_length=255, help_text="Shortcut: publish to this queue via ''."
    )

    def validate(self, attrs):
        if "queue" in attrs and ("exchange" in attrs or "routing_key" in attrs):
            raise serializers.ValidationError(
                {"queue": "Give either queue, or exchange + routing_key, not both."}
            )
        if ("exchange" in attrs) != ("routing_key" in attrs):
            missing = "routing_key" if "exchange" in attrs else "exchange"
            raise serializers.ValidationError({missing: "Required together with the other."})
        return attrs

    def target(self):
        data = self.validated_data
        if "queue" in data:
            return "", data["queue"]
        return data.get("exchange"), data.get("routing_key")


class ReplayAttemptSerializer(serializers.ModelSerializer):
    message = MessageSerializer(read_only=True)

    class Meta:
        model = ReplayAttempt
        fields = [
            "id",
            "exchange",
            "routing_key",
            "outcome",
            "detail",
            "edited",
            "created_at",
            "message",
        ]
