"""Make pika keep float header values (AMQP field types 'f' float and 'd' double).

pika 1.x decodes 'f'/'d' header values to *int* (it wraps them in ``long()``: 1.5 arrives as 1)
and refuses to encode a float at all (UnsupportedAMQPFieldException). Java, .NET and Go clients
send doubles, and Lazarus must store them and replay them exactly, so this module corrects both
directions of pika's table codec. ``install()`` is idempotent; the Django app calls it when it
starts (``recovery.apps``), so every Lazarus process has it: the console, the workers, the
management commands. The client library does not (it imports nothing else of Lazarus) and leaves
a producer's pika as it is; the give-ups its outbox parks are sent on by a Lazarus worker
(``recovery.collector.tasks``), where it is installed.

It also keeps a long string ('S') that is not UTF-8 a long string: pika decodes it to ``bytes``
and would re-encode it as a byte array ('x'); here it becomes ``headers.LongBytes`` and goes back
out as 'S'. And a timestamp ('T') too large for a datetime (a client sending milliseconds as
seconds) would make pika's decoder raise, killing the consumer's connection on every redelivery:
here it becomes ``headers.RawTimestamp`` and goes back out unchanged. Likewise a headers table
nested deeper than ``headers.MAX_HEADER_DEPTH`` (or than Python's recursion limit) would kill
the connection on every redelivery: it is kept undecoded (``headers.UndecodableHeaders``), and
sent again byte for byte.

``unpublishable(properties)`` says, before a replay publishes, why properties cannot go on the
wire (they do not encode, or they exceed a frame): such a message is failed with that reason, not
retried as if the broker were away.

The decoding side is a complete table decoder of its own, not a wrapper: it is the collector's
hottest code (every header of every drained message) and runs at about twice pika's speed.
"""

import decimal
import struct

import pika.data
import pika.exceptions
import pika.spec
from pika.compat import long

from recovery.client.headers import (
    MAX_HEADER_DEPTH,
    LongBytes,
    RawTimestamp,
    UndecodableHeaders,
    datetime_or_none,
    headers_from_json,
    nesting_depth,
)

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


class _TooDeep(Exception):
    pass


def _value(encoded, offset, depth=0):
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
        return _table(encoded, offset, depth + 1)
    if kind == 65:  # A: array
        if depth >= MAX_HEADER_DEPTH:
            raise _TooDeep
        end = offset + 4 + _u32(encoded, offset)[0]
        offset += 4
        items = []
        while offset < end:
            item, offset = _value(encoded, offset, depth + 1)
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


def _table(encoded, offset, depth=1):
    if depth > MAX_HEADER_DEPTH:
        raise _TooDeep
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
        result[key], offset = _value(encoded, key_end, depth)
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
    except (_TooDeep, RecursionError):
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


# A content header frame: type, channel, size (7 bytes), end marker (1); its payload: class id,
# weight, body size, property flags (14 bytes) before the properties.
_CONTENT_HEADER_OVERHEAD = 8 + 14
# RabbitMQ's default frame_max (and pika's); a content header must fit in one frame.
DEFAULT_FRAME_MAX = 131072


def unpublishable(properties, frame_max=DEFAULT_FRAME_MAX):
    """Why ``properties`` cannot be published (a reason for the operator), or None if they can."""
    headers = properties.headers
    if isinstance(headers, dict) and not isinstance(headers, UndecodableHeaders):
        depth = nesting_depth(headers)
        if depth > MAX_HEADER_DEPTH:
            return f"headers nested {depth} levels deep; at most {MAX_HEADER_DEPTH} can be sent"
    try:
        size = sum(len(piece) for piece in properties.encode())
    except Exception as exc:  # whatever pika's encoder raises, the message cannot be sent
        return f"the message's properties cannot be encoded: {type(exc).__name__}: {exc}"[:500]
    if size + _CONTENT_HEADER_OVERHEAD > frame_max:
        return (
            f"headers and properties take {size} bytes; the broker's frame size is {frame_max} "
            "bytes and they must fit in one frame"
        )
    return None


def json_headers_problem(headers_json):
    """Why tagged-JSON headers (an edit from the API or the console) cannot be sent, or None.

    The same rules as a replay (``unpublishable``), checked before anything is decoded deeply:
    a tag wraps each level in at most one more object, so twice the limit is a safe first cut.
    """
    if nesting_depth(headers_json) > 2 * MAX_HEADER_DEPTH:
        return f"headers nested too deep; at most {MAX_HEADER_DEPTH} levels can be sent"
    try:
        headers = headers_from_json(headers_json)
    except Exception as exc:  # any failure to decode an edit is bad input, said as such
        return f"not tagged-JSON headers: {type(exc).__name__}: {exc}"[:500]
    return unpublishable(pika.spec.BasicProperties(headers=headers))


def install():
    pika.data.encode_value = encode_value
    pika.data.decode_value = decode_value
    pika.data.encode_table = encode_table
    pika.data.decode_table = decode_table
