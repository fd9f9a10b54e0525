"""A session-scoped local Spark and builders for tiny, exact audit fixtures."""

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.audit import audit_frames
from spark.schema import (
    CONSUMER_LOG_SCHEMA,
    PRODUCER_LOG_SCHEMA,
    STORE_EXPORT_SCHEMA,
    epoch_ms,
)
from tests.helpers.spark import BINDINGS, DAY_MS, LATER, log_frame

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """A test here that needs the Spark session (the ``spark`` fixture, or ``audit`` over it)
    is ``slow``: starting the JVM takes seconds and each audit a dozen jobs. The rest (the
    rules the audit computes on the driver: segments, provenance, topic patterns, the latency
    histogram's spread, the names the console shares with the job) runs in the quick loop.
    A few audits stay in the quick loop all the same (marked ``quick``): one per rule family
    (lost with its evidence, recovered, a broker redelivery, an orphan, an input gap, a missing
    log, an unclaimed message), so a change that breaks an audit rule fails there first.
    (A conftest's hook sees every test of the session: only this directory's are marked.)"""
    for item in items:
        needs_session = "spark" in getattr(item, "fixturenames", ())
        if item.path.is_relative_to(HERE) and needs_session and "quick" not in item.keywords:
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
