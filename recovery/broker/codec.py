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

The decoding side is a complete table decoder of its own, not a wrapper: it is the collector's
hottest code (every header of every drained message) and runs at about twice pika's speed.
"""

import decimal
import struct

import pika.data
import pika.exceptions
from pika.compat import long

from recovery.client.headers import LongBytes, RawTimestamp, UndecodableHeaders, datetime_or_none

_original_encode_value = pika.data.encode_value
_original_encode_table = pika.data.encode_table
# pika's own decoders, for the tests that hold ours against them.
PIKA_DECODERS = {"decode_value": pika.data.decode_value, "decode_table": pika.data.decode_table}


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


# The decoder is written out in full rather than wrapped around pika's: the collector decodes the
# headers of every message it drains, and pika's decoder (a chain of bytes comparisons and a
# struct format lookup per value) was the biggest single cost of a drain. Field types as in
# pika 1.4 (``pika.data.decode_value``), with the corrections above; ``tests/collector/
# test_units.py`` checks every type against pika's own decoder.
_u8 = struct.Struct(">B").unpack_from
_i8 = struct.Struct(">b").unpack_from
_i16 = struct.Struct(">h").unpack_from
_u16 = struct.Struct(">H").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i64 = struct.Struct(">q").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_f32 = struct.Struct(">f").unpack_from
_f64 = struct.Struct(">d").unpack_from
_decimal_parts = struct.Struct(">Bi").unpack_from
_TEN = decimal.Decimal(10)
# A drain decodes the same x-death second many times over: the last few timestamps, decoded.
_moments = {}


def _timestamp(seconds):
    moment = _moments.get(seconds)
    if moment is None:
        moment = datetime_or_none(seconds)
        moment = RawTimestamp(seconds) if moment is None else moment
        if len(_moments) >= 256:
            _moments.clear()
        _moments[seconds] = moment
    return moment


def _value(encoded, offset):
    kind = encoded[offset]
    offset += 1
    if kind == 83:  # S: long string (text by convention; bytes that are not UTF-8 stay 'S')
        end = offset + 4 + _u32(encoded, offset)[0]
        value = encoded[offset + 4 : end]
        try:
            return value.decode("utf8"), end
        except UnicodeDecodeError:
            return LongBytes(value), end
    if kind == 70:  # F: table
        return _table(encoded, offset)
    if kind == 65:  # A: array
        end = offset + 4 + _u32(encoded, offset)[0]
        offset += 4
        items = []
        while offset < end:
            item, offset = _value(encoded, offset)
            items.append(item)
        return items, offset
    if kind == 84:  # T: timestamp (seconds)
        return _timestamp(_u64(encoded, offset)[0]), offset + 8
    if kind == 108 or kind == 76:  # l, L: signed 64-bit (rabbitmq/rabbitmq-server#1093)
        # pika's long (an int) is what makes its encoder send the value back as 'l'.
        return long(_i64(encoded, offset)[0]), offset + 8
    if kind == 73:  # I: signed 32-bit
        return _i32(encoded, offset)[0], offset + 4
    if kind == 116:  # t: boolean
        return bool(encoded[offset]), offset + 1
    if kind == 100:  # d: double
        return _f64(encoded, offset)[0], offset + 8
    if kind == 102:  # f: float
        return _f32(encoded, offset)[0], offset + 4
    if kind == 86:  # V: void
        return None, offset
    if kind == 120:  # x: byte array
        end = offset + 4 + _u32(encoded, offset)[0]
        return bytes(encoded[offset + 4 : end]), end
    if kind == 105:  # i: unsigned 32-bit
        return _u32(encoded, offset)[0], offset + 4
    if kind == 98:  # b: signed 8-bit
        return _i8(encoded, offset)[0], offset + 1
    if kind == 66:  # B: unsigned 8-bit
        return _u8(encoded, offset)[0], offset + 1
    if kind == 85 or kind == 115:  # U, s: signed 16-bit (pika/pika#1205)
        return _i16(encoded, offset)[0], offset + 2
    if kind == 117:  # u: unsigned 16-bit
        return _u16(encoded, offset)[0], offset + 2
    if kind == 68:  # D: decimal (scale, signed 32-bit unscaled value)
        decimals, raw = _decimal_parts(encoded, offset)
        return decimal.Decimal(raw) * (_TEN**-decimals), offset + 5
    raise pika.exceptions.InvalidFieldTypeException(encoded[offset - 1 : offset])


def _table(encoded, offset):
    end = offset + 4 + _u32(encoded, offset)[0]
    offset += 4
    result = {}
    while offset < end:
        key_end = offset + 1 + encoded[offset]
        key = encoded[offset + 1 : key_end]
        try:  # noqa: SIM105 - contextlib.suppress costs more than the decode, per key
            key = key.decode("utf8")
        except UnicodeDecodeError:
            pass
        result[key], offset = _value(encoded, key_end)
    return result, offset


def decode_value(encoded, offset):
    if type(encoded) is not bytes:
        encoded = bytes(encoded)
    return _value(encoded, offset)


def decode_table(encoded, offset):
    """pika's ``decode_table``; a table nested too deep to decode is kept raw (see above)."""
    if type(encoded) is not bytes:
        encoded = bytes(encoded)
    try:
        return _table(encoded, offset)
    except RecursionError:
        size = _u32(encoded, offset)[0]
        raw = bytes(encoded[offset + 4 : offset + 4 + size])
        return UndecodableHeaders(raw), offset + 4 + size


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
