"""A session-scoped local Spark and builders for tiny, exact audit fixtures."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from spark.audit import audit_frames
from spark.schema import (
    CONSUMER_LOG_SCHEMA,
    HOUR_MS,
    LOG_PROVENANCE,
    PRODUCER_LOG_SCHEMA,
    STORE_EXPORT_SCHEMA,
    epoch_ms,
)

DAY = datetime(2026, 3, 1, tzinfo=UTC)
DAY_MS = epoch_ms(DAY)
LATER = DAY + timedelta(days=3)  # every window of DAY is FINAL by then
BINDINGS = [
    {"exchange": "orders", "routing_key": "order.*", "consumer_group": "billing", "queue": "bq"}
]


HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """A test here that needs the Spark session (the ``spark`` fixture, or ``audit`` over it)
    is ``slow``: starting the JVM takes seconds and each audit a dozen jobs. The rest (the
    rules the audit computes on the driver: segments, provenance, topic patterns, the latency
    histogram's spread, the names the console shares with the job) runs in the quick loop.
    (A conftest's hook sees every test of the session: only this directory's are marked.)"""
    for item in items:
        if item.path.is_relative_to(HERE) and "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def spark():
    session = (
        SparkSession.builder.master("local[1]")
        .appName("lazarus-tests")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    yield session
    session.stop()


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


@pytest.fixture
def audit(spark):
    """Run the audit over in-memory rows; returns (totals dict, outputs)."""

    def run(
        producers=(),
        consumers=(),
        store=(),
        bindings=BINDINGS,
        now=LATER,
        grace_minutes=60,
        sla_ms=5000,
    ):
        outputs = audit_frames(
            log_frame(spark, PRODUCER_LOG_SCHEMA, producers),
            log_frame(spark, CONSUMER_LOG_SCHEMA, consumers),
            spark.createDataFrame(list(store), STORE_EXPORT_SCHEMA),
            bindings,
            DAY_MS,
            grace_minutes * 60_000,
            sla_ms,
            epoch_ms(now),
        )
        return outputs["totals"].first().asDict(), outputs

    yield run
    spark.catalog.clearCache()
