"""Turn one delivery from a recovery queue into one recovery-store row, and store batches.

Which recovery queue a delivery came from says what happened to it:

- ``dead_letters`` (fed by the DLX): the broker dead-lettered it. ``x-death`` says in which queue,
  why (``rejected|expired|maxlen|delivery_limit``) and how often; the most recent death is first.
- ``unrouted`` (the alternate exchange): nothing was bound for it. The delivery still carries the
  exchange it was published to and its routing key.
- ``parked``: one of the three above dead-lettered it past a delivery limit (docs/decisions.md
  "Delivery limit"). The ``x-death`` entry naming our queue is taken off, and the delivery is
  stored as if it came from that queue: the same row, and the same fingerprint, as before.
- ``returns``: the client library handed it over after a ``basic.return``, a nack or no confirm;
  its ``x-recovery-*`` headers (docs/design.md "Broker topology") say which and where it was going.

``delivery_to_row`` is pure (it is called for every message, so it is written for speed: one JSON
encoding of the headers serves both the fingerprint and the COPY). ``store_rows`` writes a batch
with one COPY into a temporary table and one ``INSERT … ON CONFLICT DO NOTHING``: the collector is
at-least-once, the unique fingerprint makes the store exactly-once.
"""

import datetime
import hashlib
import json
import re
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import NamedTuple

from recovery.client import headers as header_codec
from recovery.client.outbox import PROPERTY_NAMES
from recovery.dead_letters import (
    DELIVERY_SCOPED_HEADERS,
    FIRST_DEATH_HEADERS,
    LAST_DEATH_HEADERS,
    REPLAY_COUNT,
    REPLAY_ORIGIN,
    exception_message,
    exception_type,
    label_message,
)
from recovery.dead_letters import header_text as _text
from recovery.errors import UnstorableDelivery

DEAD_LETTERS, UNROUTED, RETURNS, PARKED = "dead_letters", "unrouted", "returns", "parked"

# RabbitMQ 4.x hands an AMQP 1.0 message id (or correlation id) that AMQP 0-9-1 cannot carry
# (binary, or a string longer than 255 bytes) as a header instead of the property.
AMQP10_ID_HEADERS = {"message_id": "x-message-id", "correlation_id": "x-correlation-id"}

# x-recovery-kind -> the reason when x-recovery-reason is missing or unknown.
RETURN_KINDS = {"returned": "no_route", "nacked": "nack", "unconfirmed": "timeout"}
REASONS = frozenset(
    ("rejected", "expired", "maxlen", "delivery_limit", "no_route", "nack", "timeout")
)


class StoreRow(NamedTuple):
    """One recovery_message row, in COPY column order; JSON columns are already JSON text."""

    kind: str
    vhost: str
    source_queue: str
    source_exchange: str
    routing_keys: str
    reason: str
    death_count: int
    first_death_at: datetime.datetime | None
    last_death_at: datetime.datetime | None
    message_id: str
    correlation_id: str
    properties: str
    headers: str
    body: bytes
    body_size: int
    content_type: str
    content_encoding: str
    fingerprint: str
    group_key: str
    group_label: str
    status: str
    status_reason: str
    replay_count: int
    origin_id: int | None


ROW_COLUMNS = StoreRow._fields


def _as_datetime(value):
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    return None


def _as_int(value, default=0):
    if type(value) is int:
        return value
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def x_death_summary(x_death):
    """Queue, exchange, routing keys, reason, total count and first/last time of an x-death list.

    RabbitMQ keeps one entry per (queue, reason), most recent first; the message goes back to the
    queue of its most recent death. Anything malformed (a producer can forge x-death) is skipped.
    """
    if not isinstance(x_death, list):
        return None
    latest = None
    count = 0
    first_at = last_at = None
    for entry in x_death:  # one loop: this runs for every dead letter collected
        if not isinstance(entry, dict):
            continue
        if latest is None:
            latest = entry
        n = entry.get("count")
        n = n if type(n) is int else _as_int(n, 1)
        if n > 0:
            count += n
        moment = entry.get("time")
        if type(moment) is not datetime.datetime:
            moment = _as_datetime(moment)
            if moment is None:
                continue
        elif moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        if first_at is None or moment < first_at:
            first_at = moment
        if last_at is None or moment > last_at:
            last_at = moment
    if latest is None:
        return None
    routing_keys = latest.get("routing-keys") or []
    if not isinstance(routing_keys, list):
        routing_keys = [routing_keys]
    return {
        "queue": _text(latest.get("queue")),
        "exchange": _text(latest.get("exchange")),
        "routing_keys": [_text(k) for k in routing_keys],
        "reason": _text(latest.get("reason")),
        "count": count,
        "first_at": first_at,
        "last_at": last_at,
    }


_NUMBERS = re.compile(r"\d+")


def _group(where, reason, exc_type, exc_message):
    exc_message = label_message(exc_message)
    label = " · ".join(part for part in (where, reason, exc_type[:200], exc_message) if part)
    return hashlib.sha1(label.encode()).hexdigest(), label


def failure_group(where, reason, headers):
    """(key, label) grouping messages that failed the same way: where, reason, exception."""
    exc_type = exception_type(headers)
    exc_message = exception_message(headers)
    return _group(where or "(unknown)", reason, exc_type, exc_message)


def properties_to_json(properties):
    values = {}
    for name in PROPERTY_NAMES:
        value = getattr(properties, name, None)
        if value is not None:
            values[name] = value if type(value) is int else header_codec.to_json(value)
    return values


def fingerprint_of(vhost, queue, properties_text, headers_text, body):
    """Identity of a delivery's content: equal for a redelivery of it, different otherwise."""
    digest = hashlib.sha256(f"{vhost}\x00{queue}\x00{properties_text}\x00{headers_text}".encode())
    digest.update(b"\x00")
    digest.update(body)
    return digest.hexdigest()


# Keys in the order they came off the wire: a redelivery is the same stored message, encoded by
# the broker the same way, so it produces the same text (and fingerprint) without sorting.
# The output of ``json.JSONEncoder(separators=(",", ":")).encode``, from one C encoder made once
# (``encode`` builds a new one per call; CPython always has it); values are JSON-safe already
# (headers.to_json), there is no cycle to check for.
_encoder = c_make_encoder(
    None, json.JSONEncoder().default, encode_basestring_ascii, None, ":", ",", False, False, True
)


def _dumps(value):
    return "".join(_encoder(value, 0))


def _dead_letter_origin(headers, routing_key):
    """Where a dead letter came from: x-death, or what a republishing framework left."""
    death = x_death_summary(headers.get("x-death"))
    if death is not None:
        return death, death["reason"], death["queue"], death["exchange"], death["routing_keys"]
    # Published to the DLX by hand or by a framework (Spring's RepublishMessageRecoverer keeps
    # x-original-*): no broker death to read. The routing key it arrived with is usually the
    # queue it came from, which makes the default replay target (default exchange) right.
    exchange = _text(headers.get("x-original-exchange"))
    key = _text(headers.get("x-original-routingKey") or routing_key)
    return None, "unknown", "", exchange, [key]


def _route_label(exchange, routing_key):
    return f"{exchange or '(default exchange)'} → {_NUMBERS.sub('#', routing_key)}"


class _Origin(NamedTuple):
    kind: str
    reason: str
    source_queue: str
    source_exchange: str
    routing_keys: list
    where: str  # what the failure group is named after: the queue, else exchange + route
    death_count: int
    first_at: datetime.datetime | None
    last_at: datetime.datetime | None


def _origin(source, headers, exchange, routing_key) -> _Origin:
    """Where a delivery failed and why, from the recovery queue it came from and its headers."""
    death = first_at = None
    death_count = 0
    if source == DEAD_LETTERS:
        kind = "dead_letter"
        death, reason, source_queue, source_exchange, routing_keys = _dead_letter_origin(
            headers, routing_key
        )
        # x-death may name no routing key at all (forged, or an empty list): still a message.
        where = source_queue or _route_label(
            source_exchange, routing_keys[0] if routing_keys else ""
        )
    elif source == RETURNS:
        kind = _text(headers.get("x-recovery-kind"))
        if kind not in RETURN_KINDS:
            kind, reason = "returned", "unknown"  # not handed over by our client library
        else:
            reason = _text(headers.get("x-recovery-reason"))
            reason = reason if reason in REASONS else RETURN_KINDS[kind]
        source_queue = ""
        source_exchange = _text(headers.get("x-recovery-exchange"))
        routing_keys = [_text(headers.get("x-recovery-routing-key"))]
        death_count = max(_as_int(headers.get("x-recovery-attempts"), 0), 0)
        first_at = _as_datetime(headers.get("x-recovery-first-attempt-at"))
        where = _route_label(source_exchange, routing_keys[0])
    else:
        # Caught by the alternate exchange: the delivery names the exchange it was published to
        # and its routing key. An earlier death, if any, is kept as history.
        kind, reason = "unroutable", "no_route"
        death = x_death_summary(headers.get("x-death"))
        source_queue, source_exchange, routing_keys = "", _text(exchange), [_text(routing_key)]
        where = _route_label(source_exchange, routing_keys[0])

    if reason not in REASONS:
        reason = "unknown"
    if death is not None:
        death_count, first_at = death["count"], death["first_at"]
    return _Origin(
        kind,
        reason,
        source_queue,
        source_exchange,
        routing_keys,
        where,
        death_count,
        first_at,
        death["last_at"] if death else None,
    )


class Unparked(NamedTuple):
    headers: dict
    queue: str  # the recovery queue it was parked from
    exchange: str  # the exchange and routing key it had arrived there with
    routing_key: str


def unpark(headers, names=None) -> Unparked:
    """A parked delivery as it was in the recovery queue it was parked from: its headers, that
    queue, and the exchange and routing key it arrived there with (the death names them; the
    delivery itself names the parking exchange). Raises UnstorableDelivery when no death names
    one of ours (published to the parking exchange by hand: nothing says what it is)."""
    from recovery.broker.topology import Names

    names = names or Names.from_settings()
    ours = set(names.limited_queues)
    deaths = headers.get("x-death")
    deaths = deaths if isinstance(deaths, list) else []
    parked_from = next(
        (d for d in deaths if isinstance(d, dict) and _text(d.get("queue")) in ours), None
    )
    if parked_from is None:
        raise UnstorableDelivery("in the parking queue without a death in a recovery queue")
    queue = _text(parked_from.get("queue"))
    headers = dict(headers)
    rest = [d for d in deaths if d is not parked_from]
    if rest:
        headers["x-death"] = rest
    else:
        headers.pop("x-death", None)
    # Added by the broker as it parked it, when it had not died before (or, 3.13+, always).
    for names_of_death in (FIRST_DEATH_HEADERS, LAST_DEATH_HEADERS):
        if _text(headers.get(names_of_death[0])) == queue:
            for name in names_of_death:
                headers.pop(name, None)
    keys = parked_from.get("routing-keys")
    key = keys[0] if isinstance(keys, list) and keys else ""
    return Unparked(headers, queue, _text(parked_from.get("exchange")), _text(key))


def delivery_to_row(
    vhost, queue, exchange, routing_key, properties, body, *, source=None, poison_threshold=3
):
    """A delivery from one of the recovery queues -> a StoreRow.

    ``queue`` is the recovery queue it was consumed from and ``source`` which one it is
    (DEAD_LETTERS, UNROUTED, RETURNS or PARKED; looked up in the settings when not given).
    """
    source = source or source_of(queue)
    headers = properties.headers
    if headers is None:
        headers = {}
    elif isinstance(headers, header_codec.UndecodableHeaders):  # an empty dict: check first
        raise UnstorableDelivery(
            f"headers nested too deep to decode ({len(headers.raw)} B table, kept as received)"
        )
    if source == PARKED:
        headers, queue, exchange, routing_key = unpark(headers)
        source = source_of(queue)
    body = bytes(body or b"")
    headers_json = header_codec.headers_to_json(headers)
    properties_json = properties_to_json(properties)
    origin = _origin(source, headers, exchange, routing_key)
    reason = origin.reason

    for name in DELIVERY_SCOPED_HEADERS:
        headers_json.pop(name, None)
    headers_text = _dumps(headers_json)
    properties_text = _dumps(properties_json)

    replay_count = max(_as_int(headers.get(REPLAY_COUNT), 0), 0)
    origin_id = _as_int(headers.get(REPLAY_ORIGIN), 0) or None
    if origin_id is not None and not 0 < origin_id < 2**63:
        origin_id = None
    group_key, group_label = failure_group(origin.where, reason, headers)
    return StoreRow(
        kind=origin.kind,
        vhost=vhost,
        source_queue=origin.source_queue,
        source_exchange=origin.source_exchange,
        routing_keys=_dumps(origin.routing_keys),
        reason=reason,
        death_count=min(origin.death_count, 2**31 - 1),
        first_death_at=origin.first_at,
        last_death_at=origin.last_at,
        message_id=_id_text(properties.message_id, headers, "message_id"),
        correlation_id=_id_text(properties.correlation_id, headers, "correlation_id"),
        properties=properties_text,
        headers=headers_text,
        body=body,
        body_size=len(body),
        content_type=_text(properties.content_type, 255),
        content_encoding=_text(properties.content_encoding, 255),
        fingerprint=fingerprint_of(vhost, queue, properties_text, headers_text, body),
        group_key=group_key,
        group_label=group_label,
        # A message that keeps coming back after replays is poison: bulk replays skip it.
        status="poisoned" if origin_id and replay_count >= poison_threshold else "pending",
        status_reason="",
        replay_count=min(replay_count, 2**31 - 1),
        origin_id=origin_id,
    )


def _id_text(value, headers, name):
    """The id property, or the header RabbitMQ 4.x put it in (AMQP 1.0): a binary id that is
    not UTF-8 text is kept as ``hex:<its hex digits>``."""
    if value is None:
        value = headers.get(AMQP10_ID_HEADERS[name])
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                value = "hex:" + value.hex()
    return _text(value, 255)


def source_of(queue, names=None):
    """Which recovery source a queue is (DEAD_LETTERS, UNROUTED, RETURNS or PARKED)."""
    from recovery.broker.topology import Names

    names = names or Names.from_settings()
    sources = {
        names.dead_letters: DEAD_LETTERS,
        names.unrouted: UNROUTED,
        names.returns: RETURNS,
        names.parked: PARKED,
    }
    try:
        return sources[queue]
    except KeyError:
        raise ValueError(f"{queue!r} is not one of the recovery source queues") from None
