"""Bodies an operator can read: compressed, binary and schema'd bodies decoded for the console,
the API and the search index (recovery.bodies.decode has the chain and its limits,
recovery.bodies.schemas the protobuf and Avro documents). No models: the admin's rules and
their application to a stored message (``readable``, ``decode_message``) are
recovery.models.decoders."""

from django.conf import settings

from recovery.bodies.decode import Decoded, DecodeError, decode, encodings, needs_decoding

__all__ = [
    "DECODE_FIELDS",
    "Decoded",
    "DecodeError",
    "decode",
    "needs_decoding",
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
