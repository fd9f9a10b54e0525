"""Bodies an operator can read: compressed and binary bodies decoded for the console, the API
and the search index (recovery.bodies.decode has the chain and its limits)."""

from django.conf import settings

from recovery.bodies.decode import Decoded, DecodeError, decode, encode, needs_decoding

__all__ = ["Decoded", "DecodeError", "decode", "decode_message", "encode", "needs_decoding"]


def decode_message(message, limit=None):
    """The decoder chain a stored message's properties name, applied to its body."""
    return decode(
        message.body_bytes,
        message.content_type,
        message.content_encoding,
        limit=limit or settings.BODY_DECODE_LIMIT,
    )
