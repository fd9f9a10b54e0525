"""Bodies an operator can read: compressed, binary and schema'd bodies decoded for the console,
the API and the search index (recovery.bodies.decode has the chain and its limits,
recovery.bodies.schemas the protobuf and Avro documents, recovery.models.DecoderRule the
admin's rules)."""

from django.conf import settings

from recovery.bodies.decode import Decoded, DecodeError, decode, encodings, needs_decoding

__all__ = [
    "DECODE_FIELDS",
    "Decoded",
    "DecodeError",
    "decode",
    "decode_message",
    "needs_decoding",
    "readable",
]

# The message fields that decide how its body decodes (and so how masking reads it): the
# decoder rules' vhost/queue/exchange, and the properties that name the encoding and type.
DECODE_FIELDS = (
    "vhost",
    "source_queue",
    "source_exchange",
    "content_type",
    "content_encoding",
    "properties",
)


def decode_message(message, rules=None, limit=None, partial=False):
    """The chain for a stored message: its properties, and the first decoder rule that matches
    its vhost, queue and exchange (``rules``: already loaded, e.g. once per indexer batch)."""
    from recovery.models import DecoderRule

    rule = DecoderRule.first_match(
        message.vhost, message.source_queue, message.source_exchange, rules
    )
    return _decode_with_rule(rule, message, limit, partial)


def decode_with(
    rule, body, content_type, content_encoding, message_type="", limit=None, partial=False
):
    limit = limit or settings.BODY_DECODE_LIMIT
    if rule is None:
        return decode(body, content_type, content_encoding, limit=limit, partial=partial)
    try:
        document = rule.document(message_type)
    except DecodeError as exc:
        return Decoded(chain=[], data=bytes(body), error=f"decoder rule {rule.name!r}: {exc}")
    return decode(
        body,
        content_type,
        content_encoding,
        limit=limit,
        partial=partial,
        document=document,
        layers=[] if encodings(content_encoding) else encodings(rule.content_encoding),
    )


def readable(message, rules=None, limit=None, body=None):
    """The decoded form for the console: ``decode_message``'s answer when the message's
    properties or a decoder rule name a chain, else None (the raw views say it all). Reads the
    rules once. ``body``: other bytes read as this message's are (an edited copy of it)."""
    from recovery.models import DecoderRule

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
