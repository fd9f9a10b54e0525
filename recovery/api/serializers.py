import base64

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.api.params import StrictCharField, StrictIntegerChoiceField
from recovery.broker.codec import json_headers_problem
from recovery.models import DIED_AGAIN, Message, ReplayAttempt, Status
from recovery.models.decoders import readable
from recovery.replay.options import QUEUE_OR_EXCHANGE, names_queue_and_exchange

# What a message's `state` can be (named MessageStateEnum in the schema).
MESSAGE_STATES = [*Status.values, DIED_AGAIN]


class MessageSerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField()
    died_again_copy = serializers.SerializerMethodField()

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
            "state",
            "died_again_copy",
            "status_reason",
            "discarded_at",
            "replay_count",
            "origin",
            "collected_at",
            "last_replayed_at",
        ]
        read_only_fields = fields

    @extend_schema_field(
        serializers.ChoiceField(
            choices=MESSAGE_STATES,
            help_text="The status, except that a replayed message whose latest replay was "
            "dead-lettered again (and collected) is `died_again`.",
        )
    )
    def get_state(self, obj):
        return obj.state

    @extend_schema_field(
        serializers.IntegerField(
            allow_null=True,
            help_text="When `state` is `died_again`: the id of the new copy the collector stored.",
        )
    )
    def get_died_again_copy(self, obj):
        return obj.died_again_copy_id


class MessageDetailSerializer(MessageSerializer):
    properties = serializers.JSONField(read_only=True)
    headers = serializers.SerializerMethodField(
        help_text="AMQP headers (masked: the masking rules' headers read [masked]). Values "
        'JSON cannot carry are tagged: {"$t": "decimal|timestamp|bytes|float|table", "v": ...}.',
    )
    masked = serializers.SerializerMethodField(
        help_text="Whether masking rules changed what headers and body show here (the stored "
        "bytes are unchanged; a replay sends them)."
    )
    body_withheld = serializers.SerializerMethodField(
        help_text="Why the body fields are null: the caller sees metadata only; else null."
    )
    body_base64 = serializers.SerializerMethodField()
    body_text = serializers.SerializerMethodField()
    group_label = serializers.SerializerMethodField(
        help_text="queue · reason · exception (masked as the headers it was made from)."
    )
    transient = serializers.BooleanField(
        source="is_transient",
        read_only=True,
        help_text="Published without delivery_mode 2: a replay publishes it transient too.",
    )
    app_retries = serializers.SerializerMethodField()

    class Meta(MessageSerializer.Meta):
        fields = [
            *MessageSerializer.Meta.fields,
            "properties",
            "headers",
            "masked",
            "body_withheld",
            "body_base64",
            "body_text",
            "group_label",
            "transient",
            "app_retries",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {"header": {"type": "string"}, "count": {"type": "integer"}},
            "description": "The application's own retry counter, if the message carries one "
            "(from RabbitMQ 3.13 death_count restarts when an application republishes).",
        }
    )
    def get_app_retries(self, obj):
        found = obj.app_retry_count
        return {"header": found[0], "count": found[1]} if found else None

    # The caller's recovery.masking.View of the message (set by the view: masking and whether
    # bodies are shown at all); a KeyError without it rather than an unmasked answer.
    def _view(self):
        return self.context["view"]

    @extend_schema_field(serializers.JSONField())
    def get_headers(self, obj):
        return self._view().masker.headers(obj.headers)

    @extend_schema_field(serializers.CharField())
    def get_group_label(self, obj):
        return self._view().masker.label(obj.group_label, obj.headers)

    @extend_schema_field(serializers.BooleanField())
    def get_masked(self, obj):
        return self._view().masked

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_body_withheld(self, obj):
        return None if self._view().bodies else "metadata only: the caller may not read bodies"

    def _body(self, obj):
        view = self._view()
        if not view.bodies:
            return None
        return view.masker.stored(obj.body_bytes, readable(obj) if view.masked else None)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_body_base64(self, obj):
        body = self._body(obj)
        return None if body is None else base64.b64encode(body).decode("ascii")

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_body_text(self, obj):
        body = self._body(obj)
        try:
            return None if body is None else body.decode("utf-8")
        except UnicodeDecodeError:
            return None


class TargetSerializer(serializers.Serializer):
    """Where to publish: a queue (through the default exchange) or an exchange + routing key.

    Omit all three for the default target (docs/design.md "Replay semantics").
    """

    exchange = StrictCharField(required=False, allow_blank=True, max_length=255)
    routing_key = StrictCharField(required=False, allow_blank=True, max_length=255)
    queue = StrictCharField(
        required=False, max_length=255, help_text="Shortcut: publish to this queue via ''."
    )

    def validate(self, attrs):
        if names_queue_and_exchange(
            attrs.get("queue"), attrs.get("exchange"), attrs.get("routing_key")
        ):
            raise serializers.ValidationError({"queue": QUEUE_OR_EXCHANGE})
        if ("exchange" in attrs) != ("routing_key" in attrs):
            missing = "routing_key" if "exchange" in attrs else "exchange"
            raise serializers.ValidationError({missing: "Required together with the other."})
        return attrs

    def target(self):
        """(exchange, routing_key, queue); all None for the default target."""
        data = self.validated_data
        return data.get("exchange"), data.get("routing_key"), data.get("queue")


class ReplayRequestSerializer(TargetSerializer):
    delay_seconds = StrictIntegerChoiceField(
        choices=settings.REPLAY_DELAYS,
        required=False,
        help_text="Delayed retry: publish through a TTL queue of this many seconds (one of the "
        "setting REPLAY_DELAYS).",
    )
    headers = serializers.DictField(
        required=False,
        help_text="Edit: replace the headers with these (tagged JSON, as in the message detail). "
        "Lazarus still strips x-death and adds its x-recovery-* headers.",
    )
    body_base64 = StrictCharField(required=False, help_text="Edit: the new body, base64.")
    body_text = StrictCharField(
        required=False, allow_blank=True, trim_whitespace=False, help_text="Edit: new body, UTF-8."
    )

    def validate_headers(self, value):
        # Decode and AMQP-encode now: a header pika cannot encode (or nested too deep, or larger
        # than a frame) must be a 400 here, not a failure halfway through a publish.
        problem = json_headers_problem(value)
        if problem is not None:
            raise serializers.ValidationError(f"Not AMQP-encodable tagged-JSON headers: {problem}")
        return value

    def validate_body_base64(self, value):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:  # binascii.Error, or non-ASCII text
            raise serializers.ValidationError("Not valid base64.") from None

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "body_base64" in attrs and "body_text" in attrs:
            raise serializers.ValidationError(
                {"body_text": "Give either body_base64 or body_text, not both."}
            )
        return attrs

    def edits(self):
        """(headers_json or None, body bytes or None)."""
        data = self.validated_data
        body = data.get("body_base64")
        if "body_text" in data:
            body = data["body_text"].encode("utf-8")
        return data.get("headers"), body


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
