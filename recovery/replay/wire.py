"""The wire format of a replay: the properties and body a stored message is published with.

Shared by the one-click path (``one``) and bulk jobs (``runner``, which reads rows, not models,
hence ``wire_from_columns``); ``claims`` has PostgreSQL drop ``STRIPPED_HEADERS`` before a bulk
job's rows reach Python.
"""

import datetime

import pika

from recovery.client import headers as header_codec
from recovery.dead_letters import (
    PREVIOUS_LIFE_HEADERS,
    REPLAY_COUNT,
    REPLAY_ORIGIN,
    REPLAYED_AT,
    REPLAYED_BY,
)

# The broker writes fresh ones if it dies again, and the store keeps the originals.
STRIPPED_HEADERS = PREVIOUS_LIFE_HEADERS

_STRIPPED = frozenset(STRIPPED_HEADERS)
_PLAIN = frozenset((str, int, bool, type(None)))  # JSON values that are their AMQP value


def wire_message(message, replayed_by="", headers_override=None, body_override=None):
    """(properties, body) to publish for a stored message.

    ``expiration`` is dropped: a per-message TTL that killed it once would kill it again.
    """
    return wire_from_columns(
        message.pk,
        message.properties,
        message.headers if headers_override is None else headers_override,
        message.body_bytes if body_override is None else body_override,
        message.replay_count,
        replayed_by,
    )


def wire_from_columns(pk, properties_json, headers_json, body, replay_count, replayed_by, now=None):
    """wire_message for raw column values (bulk replay reads rows, not models).

    Called for every message of a bulk job, so it skips decoding what it drops (x-death is
    the biggest header a dead letter has) and passes plain JSON values through as they are.
    """
    from_json = header_codec.from_json
    props = {
        name: value if type(value) is not dict else from_json(value)
        for name, value in properties_json.items()
        if name != "expiration"
    }
    key_from_json = header_codec.key_from_json
    headers = {
        key_from_json(name): value if type(value) in _PLAIN else from_json(value)
        for name, value in headers_json.items()
        if name not in _STRIPPED
    }
    headers[REPLAY_COUNT] = replay_count + 1
    headers[REPLAYED_AT] = now or datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    headers[REPLAYED_BY] = replayed_by or "lazarus"
    headers[REPLAY_ORIGIN] = pk
    return pika.BasicProperties(headers=headers, **props), bytes(body)
