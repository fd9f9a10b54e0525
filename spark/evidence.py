"""The audit's evidence: the ids behind its counts (lost, unclaimed, duplicated, orphan lines,
input gaps), one row per message, pair or cause, read from the rollup (``spark/rollup.py``)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.metrics import DUP_CAUSES
from spark.schema import HOUR_MS


def lost_evidence(rolled: DataFrame, provenance: DataFrame, day_start_ms: int) -> DataFrame:
    """The unaccounted pairs of FINAL windows: ``lost``, or ``unverified`` in an input gap, and
    ``expected_by``: the strongest source of the group's expectation over the window
    (``provenance``: ``log_facts.PROVENANCE_COLUMNS``; configured, bound, observed).

    The source is looked up per (key, group, window) on the small side, for the day's windows
    (every pair's window is its message's first hour, in the audited day): the lost rows, as
    many as the day's messages on a day a log is missing, take one broadcast equi-join each
    and are never grouped."""
    lost = rolled.where("evidence.lost").selectExpr(
        "window_ms",
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "consumer_group",
        "evidence.message_id",
        "CAST(evidence.attempts AS int) AS attempts",
        "CASE WHEN in_input_gap THEN 'unverified' ELSE 'lost' END AS verdict",
        "evidence.store_id",
    )
    sources = "array('configured', 'bound', 'observed')"
    windows = provenance.sparkSession.range(24).selectExpr(
        f"{day_start_ms} + id * {HOUR_MS} AS window_ms"
    )
    by_window = (
        provenance.join(
            windows,
            (F.col("from_ms") < F.col("window_ms") + HOUR_MS)
            & (F.col("window_ms") < F.col("until_ms")),
        )
        .groupBy("exchange", "routing_key", "consumer_group", "window_ms")
        .agg(
            F.expr(
                f"element_at({sources}, CAST(min(array_position({sources}, source)) AS int)) "
                "AS expected_by"
            )
        )
    )
    return lost.join(
        F.broadcast(by_window),
        on=["exchange", "routing_key", "consumer_group", "window_ms"],
        how="left",
    ).select(*[c for c in lost.columns if c != "window_ms"], "expected_by")


def unclaimed_evidence(rolled: DataFrame) -> DataFrame:
    """The confirmed messages no group was expected to receive."""
    return rolled.where("evidence.unclaimed").selectExpr(
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "evidence.message_id",
        "CAST(evidence.attempts AS int) AS attempts",
        "evidence.store_id",
    )


def duplicate_evidence(rolled: DataFrame) -> DataFrame:
    """One row per duplicated pair and cause, with the extra deliveries that cause explains."""
    causes = ", ".join(
        f"named_struct('cause', '{cause}', 'extra', evidence.dup_{cause})" for cause in DUP_CAUSES
    )
    return (
        rolled.where(
            "NOT orphan AND evidence IS NOT NULL AND greatest("
            + ", ".join(f"evidence.dup_{cause}" for cause in DUP_CAUSES)
            + ") > 0"
        )  # lost and unclaimed rows need not be exploded to be dropped
        .selectExpr("*", f"explode(array({causes})) AS c")
        .where("c.extra > 0")
        .selectExpr(
            "timestamp_millis(window_ms) AS window_start",
            "exchange",
            "consumer_group",
            "evidence.message_id",
            "c.cause AS cause",
            "CAST(c.extra AS bigint) AS extra_deliveries",
            "CAST(evidence.deliveries AS bigint) AS deliveries",
            "evidence.store_id",
        )
    )


def orphan_evidence(rolled: DataFrame) -> DataFrame:
    """One row per orphan line (identical lines once each)."""
    return (
        rolled.where("orphan")
        .selectExpr("*", "explode(array_repeat(0, CAST(lines AS int)))")
        .selectExpr(
            "timestamp_millis(window_ms) AS window_start",
            "consumer_group",
            "evidence.orphan_consumer AS consumer",
            "evidence.message_id",
            "timestamp_millis(evidence.orphan_ts) AS consumed_at",
        )
    )


def gap_evidence(gaps: DataFrame) -> DataFrame:
    return gaps.selectExpr(
        "timestamp_millis(hour_ms) AS window_start", "source", "process", "consumer_group"
    )
