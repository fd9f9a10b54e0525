"""AMQP header values <-> JSON, without losing what a value means.

JSON has strings, numbers, booleans, null, objects and arrays. AMQP tables also carry decimals,
timestamps, byte arrays and a float/int distinction a consumer may care about. Those are stored as
tagged objects ``{"$t": TYPE, "v": VALUE}`` so that a replay puts the same values back on the wire,
while plain strings, ints and booleans stay plain (searchable with ordinary JSON operators).

A user table that happens to contain the key ``"$t"`` is wrapped as ``{"$t": "table", "v": {...}}``
so it cannot be mistaken for a tag.

AMQP has two kinds of octet strings: long strings ('S', text by convention) and byte arrays ('x').
pika hands a long string that is not valid UTF-8 over as ``bytes``, the same type as a byte array,
and would send it back as a byte array. ``LongBytes`` marks such a value (``recovery.broker.codec``
decodes and encodes it as 'S') so a Java or .NET consumer gets back the type it was sent.
"""

import base64
import datetime
import decimal
import math
from collections.abc import Iterable
from typing import Any

TAG = "$t"


class LongBytes(bytes):
    """An AMQP long string ('S') whose octets are not UTF-8 (pika would make it a byte array)."""


class RawTimestamp(int):
    """An AMQP timestamp ('T') too large for a datetime (e.g. milliseconds sent as seconds)."""


# Tables and arrays nested deeper than this are not decoded (``recovery.broker.codec`` keeps
# them raw and the collector quarantines the message with its reason) and are refused by the API
# and the console's edit form. One number for both doors, so whatever the store holds can be
# encoded again: pika's encoder recurses about three frames per level, so a few hundred levels
# overflow Python's stack on the way out even where they decoded on the way in. No real
# producer nests headers this deep (x-death is three levels).
MAX_HEADER_DEPTH = 64


def nesting_depth(value):
    """How deep tables (dicts) and arrays (lists) nest in a value; iterative, any depth."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


class UndecodableHeaders(dict):
    """A headers table nested too deep to decode: its raw entries, sent again as they came.

    Items set on it are encoded before the raw entries (``recovery.broker.codec``).
    """

    def __init__(self, raw):
        super().__init__()
        self.raw = raw


def datetime_or_none(seconds):
    try:
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return None


_DATETIME = datetime.datetime
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _timestamp_json(value):
    # == int(value.replace(tzinfo=UTC).timestamp()) for a naive (UTC) one, without the copy.
    seconds = (value - _EPOCH if value.tzinfo is None else value - _EPOCH_UTC).total_seconds()
    return {TAG: "timestamp", "v": int(seconds)}


def to_json(value):
    """One AMQP (pika or py-amqp decoded) value -> a JSON-safe value."""
    # Fast path for the types pika produces (the collector converts every header of every
    # message); subclasses and other libraries' types fall through to the general case.
    kind = type(value)
    if kind is str:
        # PostgreSQL's jsonb cannot hold U+0000; keep such a string as its NUL-separated parts.
        return value if "\x00" not in value else {TAG: "str0", "v": value.split("\x00")}
    if kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        table = _table_to_json(value)
        return {TAG: "table", "v": table} if TAG in table else table
    if kind is list:
        return [to_json(item) for item in value]
    if kind is _DATETIME:
        return _timestamp_json(value)
    return _other_to_json(value)


# A header *name* is an AMQP short string: octets, UTF-8 by convention. One that is not UTF-8
# (pika hands it over as bytes) is stored as this prefix + base64 of its octets, and sent back as
# those octets; a text name that happens to start with the prefix is stored the same way (its
# UTF-8 octets), so every name round-trips exactly.
BYTES_KEY_PREFIX = "$b64:"


def key_to_json(key):
    if type(key) is str and not key.startswith(BYTES_KEY_PREFIX):
        return key
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    return BYTES_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def key_from_json(key):
    if not key.startswith(BYTES_KEY_PREFIX):
        return key
    raw = base64.b64decode(key[len(BYTES_KEY_PREFIX) :])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _table_to_json(table):
    """A table's entries -> JSON; plain strings and ints, the common case, without a call each."""
    result = {}
    for key, value in table.items():
        kind = type(value)
        if kind is str:
            if "\x00" in value:
                value = {TAG: "str0", "v": value.split("\x00")}
        elif not (kind is int or kind is bool or value is None):
            value = to_json(value)
        result[key if type(key) is str and key[:1] != "$" else key_to_json(key)] = value
    return result


def _other_to_json(value):
    if isinstance(value, str):
        return to_json(str(value))
    if isinstance(value, RawTimestamp):
        return {TAG: "timestamp", "v": int(value)}
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return {TAG: "float", "v": repr(value)}
        return {TAG: "float", "v": value}
    if isinstance(value, decimal.Decimal):
        return {TAG: "decimal", "v": str(value)}
    if isinstance(value, datetime.datetime):
        return _timestamp_json(value)
    if isinstance(value, LongBytes):
        return {TAG: "lstr", "v": base64.b64encode(value).decode("ascii")}
    if isinstance(value, bytes | bytearray | memoryview):
        return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        table = _table_to_json(value)
        if TAG in table:
            return {TAG: "table", "v": table}
        return table
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    # Anything else a client library invents: keep its text, say what it was.
    return {TAG: "repr", "v": repr(value), "type": type(value).__name__}


def from_json(value):
    """Inverse of to_json: JSON -> values pika encodes with the same AMQP field types."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {key_from_json(k): from_json(v) for k, v in value.items()}
    raw: Any = value.get("v")
    if tag == "float":
        return float(raw)
    if tag == "decimal":
        return decimal.Decimal(raw)
    if tag == "timestamp":
        moment = datetime_or_none(raw)
        return RawTimestamp(raw) if moment is None else moment.replace(tzinfo=None)
    if tag == "bytes":
        return base64.b64decode(raw)
    if tag == "lstr":
        return LongBytes(base64.b64decode(raw))
    if tag == "str0":
        return "\x00".join(raw)
    if tag == "table":
        return {key_from_json(k): from_json(v) for k, v in raw.items()}
    if tag == "repr":
        return raw
    raise ValueError(f"unknown header tag {tag!r}")


def headers_to_json(headers):
    return _table_to_json(headers) if headers else {}


def headers_from_json(data):
    return {key_from_json(k): from_json(v) for k, v in (data or {}).items()}


def plain(value):
    """A tagged JSON value as something readable for display (timestamps as ISO, bytes as text)."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {k: plain(v) for k, v in value.items()}
    if tag == "timestamp":
        moment = datetime_or_none(value["v"])
        return f"{value['v']} (out of range)" if moment is None else moment.isoformat()
    if tag in ("bytes", "lstr"):
        raw = base64.b64decode(value["v"])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + raw.hex()
    if tag == "table":
        return {k: plain(v) for k, v in value["v"].items()}
    if tag == "str0":
        return "\x00".join(value["v"])
    return value["v"]
