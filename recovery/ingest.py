"""Turn one AMQP delivery from a recovery queue into one recovery-store row, and store batches.

Pure functions (``delivery_to_row``, ``x_death_summary``, ``fingerprint_of``) plus ``store_rows``,
which writes a batch with one COPY into a temporary table and one ``INSERT … ON CONFLICT DO
NOTHING``: the collector is at-least-once, the unique fingerprint makes the store exactly-once.
"""

import datetime
import hashlib
import json
import re

from recovery import headers as header_codec

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

# Headers the broker adds per delivery of *our* recovery queue; they differ between a delivery
# and its redelivery, so they must not take part in the fingerprint.
DELIVERY_SCOPED_HEADERS = ("x-delivery-count",)

# Headers frameworks use to say why a consumer gave up (Spring AMQP, our client, common custom).
EXCEPTION_TYPE_HEADERS = ("x-exception-type", "x-exception-class", "exception-type")
EXCEPTION_MESSAGE_HEADERS = ("x-exception-message", "x-exception", "exception-message")

RETURN_KINDS = {"returned": "no_route", "nacked": "nack", "unconfirmed": "timeout"}

ROW_COLUMNS = (
    "kind",
    "vhost",
    "source_queue",
    "source_exchange",
    "routing_keys",
    "reason",
    "death_count",
    "first_death_at",
    "last_death_at",
    "message_id",
    "correlation_id",
    "properties",
    "headers",
    "body",
    "body_size",
    "content_type",
    "content_encoding",
    "fingerprint",
    "group_key",
    "group_label",
    "status",
    "status_reason",
    "replay_count",
    "origin_id",
)


def _as_text(value):
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _as_datetime(value):
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if isinstance(value, int | float):
        return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
    return None


def _as_int(value, default=0):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def x_death_summary(x_death):
    """Queue, exchange, routing keys, reason, total count and first/last time of an x-death list.

    RabbitMQ keeps x-death most-recent-first, one entry per (queue, reason); the message is to be
    replayed to the queue of its most recent death.
    """
    entries = [e for e in (x_death or []) if isinstance(e, dict)]
    if not entries:
        return None
    latest = entries[0]
    times = [t for t in (_as_datetime(e.get("time")) for e in entries) if t is not None]
    routing_keys = latest.get("routing-keys") or []
    if not isinstance(routing_keys, list):
        routing_keys = [routing_keys]
    return {
        "queue": _as_text(latest.get("queue")),
        "exchange": _as_text(latest.get("exchange")),
        "routing_keys": [_as_text(k) for k in routing_keys],
        "reason": _as_text(latest.get("reason")) or "unknown",
        "count": sum(_as_int(e.get("count"), 1) for e in entries),
        "first_at": min(times) if times else None,
        "last_at": max(times) if times else None,
    }


def fingerprint_of(vhost, queue, properties_json, headers_json, body):
    stable_headers = {k: v for k, v in headers_json.items() if k not in DELIVERY_SCOPED_HEADERS}
    digest = hashlib.sha256()
    digest.update(
        json.dumps([vhost, queue, properties_json, stable_headers], sort_keys=True).encode()
    )
    digest.update(b"\x00")
    digest.update(body)
    return digest.hexdigest()


_NUMBERS = re.compile(r"\d+")


def failure_group(queue, reason, headers):
    """Key + label grouping messages that failed the same way (queue, reason, exception)."""
    exc_type = next((_as_text(headers[h]) for h in EXCEPTION_TYPE_HEADERS if h in headers), "")
    exc_message = next(
        (_as_text(headers[h]) for h in EXCEPTION_MESSAGE_HEADERS if h in headers), ""
    )
    # Ids and counts inside an exception message would make every message its own group.
    exc_message = _NUMBERS.sub("#", exc_message.splitlines()[0] if exc_message else "")[:200]
    label = " · ".join(
        part for part in (queue or "(no queue)", reason, exc_type, exc_message) if part
    )
    return hashlib.sha1(label.encode()).hexdigest(), label


def properties_to_json(properties):
    return {
        name: header_codec.to_json(getattr(properties, name, None))
        for name in PROPERTY_NAMES
        if getattr(properties, name, None) is not None
    }


def delivery_to_row(vhost, queue, exchange, routing_key, properties, body, poison_threshold=3):
    """A delivery from one of the recovery queues -> a dict with ROW_COLUMNS.

    ``queue`` is the recovery queue it was consumed from; which one says what kind it is.
    """
    headers = dict(getattr(properties, "headers", None) or {})
    body = bytes(body or b"")
    headers_json = header_codec.headers_to_json(headers)
    properties_json = properties_to_json(properties)
    death = x_death_summary(headers.get("x-death"))
    recovery_kind = _as_text(headers.get("x-recovery-kind"))

    if death is not None:
        kind, reason = "dead_letter", death["reason"]
        source_queue, source_exchange = death["queue"], death["exchange"]
        routing_keys = death["routing_keys"] or [routing_key]
    elif recovery_kind in RETURN_KINDS:
        kind, reason = recovery_kind, RETURN_KINDS[recovery_kind]
        source_queue = ""
        source_exchange = _as_text(headers.get("x-recovery-exchange"))
        routing_keys = [_as_text(headers.get("x-recovery-routing-key", ""))]
    else:
        # Caught by the alternate exchange: the delivery still names the exchange it was
        # published to and its routing key.
        kind, reason = "unroutable", "no_route"
        source_queue, source_exchange, routing_keys = "", exchange, [routing_key]

    if reason not in (
        "rejected",
        "expired",
        "maxlen",
        "delivery_limit",
        "no_route",
        "nack",
        "timeout",
    ):
        reason = "unknown"
    replay_count = _as_int(headers.get("x-recovery-replay-count"), 0)
    origin_id = _as_int(headers.get("x-recovery-origin"), 0) or None
    group_key, group_label = failure_group(source_queue or source_exchange, reason, headers)
    return {
        "kind": kind,
        "vhost": vhost,
        "source_queue": source_queue,
        "source_exchange": source_exchange,
        "routing_keys": routing_keys,
        "reason": reason,
        "death_count": death["count"] if death else 0,
        "first_death_at": death["first_at"] if death else None,
        "last_death_at": death["last_at"] if death else None,
        "message_id": _as_text(getattr(properties, "message_id", None))[:255],
        "correlation_id": _as_text(getattr(properties, "correlation_id", None))[:255],
        "properties": properties_json,
        "headers": headers_json,
        "body": body,
        "body_size": len(body),
        "content_type": _as_text(getattr(properties, "content_type", None))[:255],
        "content_encoding": _as_text(getattr(properties, "content_encoding", None))[:255],
        "fingerprint": fingerprint_of(vhost, queue, properties_json, headers_json, body),
        "group_key": group_key,
        "group_label": group_label,
        # A message that keeps coming back after replays is poison: bulk replays skip it.
        "status": "poisoned" if origin_id and replay_count >= poison_threshold else "pending",
        "status_reason": "",
        "replay_count": replay_count,
        "origin_id": origin_id,
    }


_JSON_COLUMNS = {"routing_keys", "properties", "headers"}

_STAGE_SQL = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS recovery_message_stage ON COMMIT DELETE ROWS AS
SELECT {", ".join(ROW_COLUMNS)} FROM recovery_message WITH NO DATA
"""


def store_rows(conn, rows):
    """Write rows in one transaction; returns how many were new (the rest were redeliveries).

    The caller acks the deliveries only after this returns (the commit happened).
    """
    if not rows:
        return 0
    columns = ", ".join(ROW_COLUMNS)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_STAGE_SQL)
        with cur.copy(f"COPY recovery_message_stage ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(
                    [json.dumps(row[c]) if c in _JSON_COLUMNS else row[c] for c in ROW_COLUMNS]
                )
        # origin_id may point at a row retention already deleted: keep the link only if it exists.
        cur.execute(
            f"""
            INSERT INTO recovery_message ({columns}, collected_at, updated_at)
            SELECT {", ".join("o.id" if c == "origin_id" else f"s.{c}" for c in ROW_COLUMNS)},
                   now(), now()
            FROM recovery_message_stage s
            LEFT JOIN recovery_message o ON o.id = s.origin_id
            ON CONFLICT (fingerprint) DO NOTHING
            """
        )
        return cur.rowcount
