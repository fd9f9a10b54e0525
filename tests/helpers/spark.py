"""Builders for tiny, exact audit fixtures (the Spark session is tests/spark/conftest.py's)."""

from datetime import UTC, datetime, timedelta

from pyspark.sql import types as T

from spark.schema import HOUR_MS, LOG_PROVENANCE, epoch_ms

DAY = datetime(2026, 3, 1, tzinfo=UTC)


DAY_MS = epoch_ms(DAY)


LATER = DAY + timedelta(days=3)  # every window of DAY is FINAL by then


BINDINGS = [
    {"exchange": "orders", "routing_key": "order.*", "consumer_group": "billing", "queue": "bq"}
]


def at(hour: int, minute: int = 0, second: int = 0) -> int:
    """Epoch ms of DAY at hh:mm:ss (hour may pass 23 into the next day)."""
    return DAY_MS + hour * HOUR_MS + minute * 60_000 + second * 1000


def publish(
    message_id, ts, attempt=1, outcome="ack", exchange="orders", key="order.created", producer="p1"
):
    return {
        "v": 1,
        "ts": ts,
        "producer": producer,
        "message_id": message_id,
        "exchange": exchange,
        "routing_key": key,
        "attempt": attempt,
        "outcome": outcome,
        "confirm_ms": 3,
        "size": 100,
    }


def consume(
    message_id, ts, group="billing", redelivered=False, outcome="ack", consumer="c1", queue="bq"
):
    return {
        "v": 1,
        "ts": ts,
        "consumer_group": group,
        "consumer": consumer,
        "queue": queue,
        "message_id": message_id,
        "redelivered": redelivered,
        "outcome": outcome,
        "handle_ms": 2,
    }


def dead_letter(
    store_id,
    message_id,
    collected_ms,
    reason="rejected",
    replay_count=0,
    kind="dead_letter",
    queue="bq",
):
    collected = datetime.fromtimestamp(collected_ms / 1000, UTC)
    return {
        "id": store_id,
        "kind": kind,
        "reason": reason,
        "status": "replayed" if replay_count else "pending",
        "message_id": message_id,
        "source_exchange": "orders",
        "source_queue": queue,
        "routing_key": "order.created",
        "collected_at": collected,
        "replay_count": replay_count,
        "last_replayed_at": collected + timedelta(minutes=1) if replay_count else None,
    }


def log_frame(spark, schema, rows):
    """Parsed-log rows as ``read_logs`` yields them; each line's file is its ts's hour."""
    full = T.StructType([*schema.fields, *LOG_PROVENANCE.fields])
    data = []
    for row in rows:
        hour = row["ts"] // HOUR_MS * HOUR_MS
        data.append((*[row.get(f) for f in schema.fieldNames()], hour, False))
    return spark.createDataFrame(data, full)
