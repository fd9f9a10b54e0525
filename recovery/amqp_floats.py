"""Make pika keep float header values (AMQP field types 'f' float and 'd' double).

pika 1.x decodes 'f'/'d' header values to *int* (it wraps them in ``long()``: 1.5 arrives as 1)
and refuses to encode a float at all (UnsupportedAMQPFieldException). Java, .NET and Go clients
send doubles, and Lazarus must store them and replay them exactly, so this module corrects both
directions of pika's table codec. ``install()`` is idempotent; the Django app and the client
library call it.

It also keeps a long string ('S') that is not UTF-8 a long string: pika decodes it to ``bytes``
and would re-encode it as a byte array ('x'); here it becomes ``headers.LongBytes`` and goes back
out as 'S'. And a timestamp ('T') too large for a datetime (a client sending milliseconds as
seconds) would make pika's decoder raise, killing the consumer's connection on every redelivery:
here it becomes ``headers.RawTimestamp`` and goes back out unchanged. Likewise a headers table
nested deeper than Python's recursion limit (a few hundred levels) would kill the connection on
every redelivery: it is kept undecoded (``headers.UndecodableHeaders``), and sent again byte for
byte.
"""

import struct
import threading

import pika.data

from recovery.headers import LongBytes, RawTimestamp, UndecodableHeaders, datetime_or_none

_original_encode_value = pika.data.encode_value
_original_decode_value = pika.data.decode_value
_original_encode_table = pika.data.encode_table
_original_decode_table = pika.data.decode_table
_table_depth = threading.local()


def encode_value(pieces, value):
    if isinstance(value, float):
        pieces.append(struct.pack(">cd", b"d", value))
        return 9
    if isinstance(value, LongBytes):
        pieces.append(struct.pack(">cI", b"S", len(value)))
        pieces.append(bytes(value))
        return 5 + len(value)
    if isinstance(value, RawTimestamp):
        pieces.append(struct.pack(">cQ", b"T", value))
        return 9
    return _original_encode_value(pieces, value)


def decode_value(encoded, offset):
    kind = encoded[offset : offset + 1]
    if kind == b"d":
        return struct.unpack_from(">d", encoded, offset + 1)[0], offset + 9
    if kind == b"f":
        return struct.unpack_from(">f", encoded, offset + 1)[0], offset + 5
    if kind == b"T":
        seconds = struct.unpack_from(">Q", encoded, offset + 1)[0]
        moment = datetime_or_none(seconds)
        return (RawTimestamp(seconds) if moment is None else moment), offset + 9
    value, end = _original_decode_value(encoded, offset)
    if kind == b"S" and type(value) is bytes:
        value = LongBytes(value)
    return value, end


def decode_table(encoded, offset):
    depth = getattr(_table_depth, "n", 0)
    _table_depth.n = depth + 1
    try:
        return _original_decode_table(encoded, offset)
    except RecursionError:
        if depth:
            raise  # only the outermost table (the headers) is kept raw
        size = struct.unpack_from(">I", encoded, offset)[0]
        raw = bytes(encoded[offset + 4 : offset + 4 + size])
        return UndecodableHeaders(raw), offset + 4 + size
    finally:
        _table_depth.n = depth


def encode_table(pieces, table):
    if not isinstance(table, UndecodableHeaders):
        return _original_encode_table(pieces, table)
    # Entries added since (e.g. x-quarantine-reason) first, then the original ones as received.
    length_index = len(pieces)
    pieces.append(b"")
    size = 0
    for key, value in table.items():
        size += pika.data.encode_short_string(pieces, key)
        size += encode_value(pieces, value)
    pieces.append(table.raw)
    size += len(table.raw)
    pieces[length_index] = struct.pack(">I", size)
    return size + 4


def install():
    pika.data.encode_value = encode_value
    pika.data.decode_value = decode_value
    pika.data.encode_table = encode_table
    pika.data.decode_table = decode_table
