"""Make pika keep float header values (AMQP field types 'f' float and 'd' double).

pika 1.x decodes 'f'/'d' header values to *int* (it wraps them in ``long()``: 1.5 arrives as 1)
and refuses to encode a float at all (UnsupportedAMQPFieldException). Java, .NET and Go clients
send doubles, and Lazarus must store them and replay them exactly, so this module corrects both
directions of pika's table codec. ``install()`` is idempotent; the Django app and the client
library call it.
"""

import struct

import pika.data

_original_encode_value = pika.data.encode_value
_original_decode_value = pika.data.decode_value


def encode_value(pieces, value):
    if isinstance(value, float):
        pieces.append(struct.pack(">cd", b"d", value))
        return 9
    return _original_encode_value(pieces, value)


def decode_value(encoded, offset):
    kind = encoded[offset : offset + 1]
    if kind == b"d":
        return struct.unpack_from(">d", encoded, offset + 1)[0], offset + 9
    if kind == b"f":
        return struct.unpack_from(">f", encoded, offset + 1)[0], offset + 5
    return _original_decode_value(encoded, offset)


def install():
    pika.data.encode_value = encode_value
    pika.data.decode_value = decode_value
