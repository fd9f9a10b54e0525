"""The logs' small facts: everything the audit needs from the logs besides their lines.

One aggregate per log (``log_summary``) counts lines per process, file hour, malformed flag and a
few keys. It is as small as processes x hours x keys, so the job collects it on the driver and
derives the rest from it in small local frames: which groups a routing key is bound to
(``expected_groups``), which queue belongs to which group (``queue_groups``), input gaps
(``input_gaps``, ``gap_windows``) and malformed lines per hour (``malformed_hours``).
Definitions: the docstring of ``spark/transforms.py``.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark.schema import HOUR_MS


def log_summary(logs: DataFrame, process: str, *keys: Column) -> DataFrame:
    """Line counts per (process, file hour, malformed, keys...)."""
    return logs.groupBy(F.col(process).alias("process"), "file_hour_ms", "malformed", *keys).agg(
        F.count(F.lit(1)).alias("lines")
    )


def published_keys(producer_summary: DataFrame) -> DataFrame:
    """Every (exchange, routing_key) of a valid producer line (a superset of first attempts')."""
    return producer_summary.where(~F.col("malformed")).select("exchange", "routing_key").distinct()


def expected_groups(keys: DataFrame, bindings: DataFrame) -> DataFrame:
    """(exchange, routing_key) -> sorted array of the consumer groups bound to receive it.

    Matches the distinct keys only, so the regex join stays as small as the key space.
    """
    matched = keys.join(
        F.broadcast(bindings.select("exchange", "pattern_regex", "consumer_group")),
        on=[
            keys["exchange"] == bindings["exchange"],
            F.regexp_like(keys["routing_key"], bindings["pattern_regex"]),
        ],
        how="inner",
    )
    return matched.groupBy(keys["exchange"], keys["routing_key"]).agg(
        F.array_sort(F.collect_set("consumer_group")).alias("expected_groups")
    )


def queue_groups(consumer_summary: DataFrame, bindings: DataFrame) -> DataFrame:
    """The set of (queue, consumer_group) pairs known from the consumer logs and the bindings."""
    logged = consumer_summary.where(~F.col("malformed") & F.col("queue").isNotNull()).select(
        "queue", "consumer_group"
    )
    configured = bindings.where(F.col("queue").isNotNull()).select("queue", "consumer_group")
    return logged.unionByName(configured).distinct()


def process_hours(summary: DataFrame, source: str) -> DataFrame:
    """(source, process, consumer_group, hour_ms) for every hour a process wrote a log file."""
    group = F.col("consumer_group") if "consumer_group" in summary.columns else F.lit(None)
    return (
        summary.where(F.col("process").isNotNull())
        .select(
            F.lit(source).alias("source"),
            "process",
            group.cast("string").alias("consumer_group"),
            F.col("file_hour_ms").alias("hour_ms"),
        )
        .distinct()
    )


def input_gaps(hours: DataFrame, first_hour_ms: int, end_hour_ms: int) -> DataFrame:
    """Hours in [first, end) where a process's log has a hole: a file the hour before, none in
    the hour, and a file again later. A process that stops for good (shutdown, scale-in) leaves
    no hole; its unconsumed messages are reported as what they look like."""
    keys = ["source", "process", "consumer_group"]
    following = hours.select(*keys, (F.col("hour_ms") + HOUR_MS).alias("hour_ms"))
    present = hours.select(*[F.col(k).alias(f"present_{k}") for k in [*keys, "hour_ms"]])
    last = hours.groupBy(*[F.col(k).alias(f"last_{k}") for k in keys]).agg(
        F.max("hour_ms").alias("last_hour_ms")
    )
    missing = following.join(
        present,
        on=[F.col(k).eqNullSafe(F.col(f"present_{k}")) for k in [*keys, "hour_ms"]],
        how="left_anti",
    )
    resumed = missing.join(
        last, on=[F.col(k).eqNullSafe(F.col(f"last_{k}")) for k in keys], how="inner"
    ).where(F.col("hour_ms") < F.col("last_hour_ms"))
    return resumed.where(
        (F.col("hour_ms") >= first_hour_ms) & (F.col("hour_ms") < end_hour_ms)
    ).select(*keys, "hour_ms")


def gap_windows(gaps: DataFrame, grace_ms: int) -> DataFrame:
    """(window_ms, consumer_group) whose pairs an input gap hides; a null group = every group."""
    producer = gaps.where(F.col("source") == "producer").select(
        F.col("hour_ms").alias("window_ms"), F.lit(None).cast("string").alias("consumer_group")
    )
    # A consumer gap at hour H hides deliveries of every window W with W <= H < W + 1h + grace.
    hours_back = (HOUR_MS + grace_ms - 1) // HOUR_MS
    earliest = F.col("hour_ms") - F.lit(hours_back * HOUR_MS)
    consumer = gaps.where(F.col("source") == "consumer").select(
        F.explode(F.sequence(earliest.cast("long"), "hour_ms", F.lit(HOUR_MS))).alias("window_ms"),
        "consumer_group",
    )
    return producer.unionByName(consumer).distinct()


def malformed_hours(summary: DataFrame, day_start_ms: int) -> DataFrame:
    """(window_ms, lines): malformed lines per file hour of the audited day."""
    return (
        summary.where(
            F.col("malformed")
            & (F.col("file_hour_ms") >= day_start_ms)
            & (F.col("file_hour_ms") < day_start_ms + 24 * HOUR_MS)
        )
        .groupBy(F.col("file_hour_ms").alias("window_ms"))
        .agg(F.sum("lines").alias("lines"))
    )
