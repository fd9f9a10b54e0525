"""Decoder rules: an admin says how a queue's bodies are to be read when their properties do not
(a protobuf queue whose messages say application/octet-stream, an Avro topic behind a schema
registry). ``decode_message`` and ``readable`` apply the first rule that matches a message."""

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from recovery.bodies import decode_with
from recovery.bodies.decode import (
    BYTE_LAYERS,
    JSON,
    MSGPACK,
    DecodeError,
    encodings,
    needs_decoding,
)


def glob_regex(pattern):
    """``*`` any run of characters, ``?`` one, everything else itself; anchored."""
    return (
        "^"
        + "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        + "$"
    )


def glob_like(pattern):
    """The same glob as a SQL LIKE pattern (escape character backslash)."""
    out = []
    for c in pattern:
        if c in "%_\\":
            out.append("\\" + c)
        else:
            out.append({"*": "%", "?": "_"}.get(c, c))
    return "".join(out)


def _glob_match(pattern, name):
    return not pattern or re.match(glob_regex(pattern), name or "", re.DOTALL) is not None


# A FileDescriptorSet or an Avro schema larger than this is refused (the console's form and the
# API): a rule is configuration, not a store.
SCHEMA_MAX_BYTES = 4 * 1024 * 1024


class DecoderRule(models.Model):
    class Decoder(models.TextChoices):
        JSON = "json", "JSON"
        MSGPACK = "msgpack", "MessagePack"
        PROTOBUF = "protobuf", "Protocol Buffers (uploaded descriptor set)"
        AVRO = "avro", "Avro (uploaded schema)"
        AVRO_REGISTRY = "avro_registry", "Avro (Confluent-compatible schema registry)"

    name = models.CharField(max_length=100, unique=True)
    # Rules are tried in this order (then by id); the first that matches decides.
    position = models.IntegerField(default=100)
    vhost = models.CharField(max_length=255, blank=True, default="", help_text="Empty: any.")
    queue_pattern = models.CharField(
        max_length=255, blank=True, default="", help_text="Glob on the source queue: * and ?."
    )
    exchange_pattern = models.CharField(
        max_length=255, blank=True, default="", help_text="Glob on the source exchange."
    )
    content_encoding = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="Byte layers when the message names none, as content_encoding writes them "
        "(e.g. 'gzip', 'zstd, base64').",
    )
    decoder = models.CharField(max_length=16, choices=Decoder.choices)
    descriptor_set = models.BinaryField(null=True, blank=True)
    protobuf_type = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="Fully qualified message type; empty: the message's own `type` property.",
    )
    avro_schema = models.TextField(blank=True, default="")
    registry_url = models.URLField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self):
        return self.name

    def activity_detail(self):
        """What an activity row keeps of a change to this rule (console and API alike)."""
        return {"rule": self.name, "decoder": self.decoder, "queue_pattern": self.queue_pattern}

    def clean(self):
        errors = {}
        unknown = [layer for layer in encodings(self.content_encoding) if layer not in BYTE_LAYERS]
        if unknown:
            errors["content_encoding"] = f"unknown layer(s): {', '.join(unknown)}"
        if not (self.vhost or self.queue_pattern or self.exchange_pattern):
            errors["queue_pattern"] = "Name a vhost, a queue pattern or an exchange pattern."
        try:
            self.check_document()
        except DecodeError as exc:
            field = {
                self.Decoder.PROTOBUF: "descriptor_set",
                self.Decoder.AVRO: "avro_schema",
                self.Decoder.AVRO_REGISTRY: "registry_url",
            }.get(self.decoder, "decoder")
            errors[field] = str(exc)
        if errors:
            raise ValidationError(errors)

    def check_document(self):
        """Raise DecodeError if the rule's schema does not load (a form error, never a 500)."""
        from recovery.bodies import schemas

        if self.decoder == self.Decoder.PROTOBUF:
            if not self.descriptor_set:
                raise DecodeError("upload a FileDescriptorSet (protoc --descriptor_set_out)")
            pool = schemas.descriptor_pool_from(self.descriptor_set)
            if self.protobuf_type:
                schemas.ProtobufDocument(pool, self.protobuf_type)
        elif self.decoder == self.Decoder.AVRO:
            schemas.parse_avro_schema(self.avro_schema)
        elif self.decoder == self.Decoder.AVRO_REGISTRY and not self.registry_url:
            raise DecodeError("give the schema registry's URL")

    def matches(self, vhost, queue, exchange):
        return (
            (not self.vhost or self.vhost == vhost)
            and _glob_match(self.queue_pattern, queue)
            and _glob_match(self.exchange_pattern, exchange)
        )

    def sql(self):
        """This rule's match as SQL over recovery_message (for the search indexer): (sql, args)."""
        parts, args = [], []
        if self.vhost:
            parts.append("vhost = %s")
            args.append(self.vhost)
        if self.queue_pattern:
            parts.append("source_queue LIKE %s")
            args.append(glob_like(self.queue_pattern))
        if self.exchange_pattern:
            parts.append("source_exchange LIKE %s")
            args.append(glob_like(self.exchange_pattern))
        return "(" + " AND ".join(parts or ["true"]) + ")", args

    def document(self, message_type=""):
        """The Document this rule reads bodies with (DecodeError if it cannot be built)."""
        from recovery.bodies import schemas

        if self.decoder == self.Decoder.JSON:
            return JSON
        if self.decoder == self.Decoder.MSGPACK:
            return MSGPACK
        if self.decoder == self.Decoder.PROTOBUF:
            type_name = self.protobuf_type or message_type
            if not type_name:
                raise DecodeError(
                    "the rule names no message type and the message has no `type` property"
                )
            return schemas.protobuf_document(bytes(self.descriptor_set), type_name)
        if self.decoder == self.Decoder.AVRO:
            return schemas.avro_document(self.avro_schema)
        return schemas.RegistryAvroDocument(self.registry_url, settings.SCHEMA_REGISTRY_TIMEOUT)

    @classmethod
    def first_match(cls, vhost, queue, exchange, rules=None):
        rules = list(cls.objects.all()) if rules is None else rules
        return next((r for r in rules if r.matches(vhost, queue, exchange)), None)


def decode_message(message, rules=None, limit=None, partial=False):
    """The chain for a stored message: its properties, and the first decoder rule that matches
    its vhost, queue and exchange (``rules``: already loaded, e.g. once per indexer batch)."""
    rule = DecoderRule.first_match(
        message.vhost, message.source_queue, message.source_exchange, rules
    )
    return _decode_with_rule(rule, message, limit, partial)


def readable(message, rules=None, limit=None, body=None):
    """The decoded form for the console: ``decode_message``'s answer when the message's
    properties or a decoder rule name a chain, else None (the raw views say it all). Reads the
    rules once. ``body``: other bytes read as this message's are (an edited copy of it)."""
    rule = DecoderRule.first_match(
        message.vhost, message.source_queue, message.source_exchange, rules
    )
    if rule is None and not needs_decoding(message.content_type, message.content_encoding):
        return None
    return _decode_with_rule(rule, message, limit, body=body)


def _decode_with_rule(rule, message, limit=None, partial=False, body=None):
    return decode_with(
        rule,
        message.body_bytes if body is None else bytes(body),
        message.content_type,
        message.content_encoding,
        (message.properties or {}).get("type") or "",
        limit=limit,
        partial=partial,
    )
