"""Roll classified pairs up into the audit's outputs: windows, totals and the evidence tables.

Definitions of every metric are in the docstring of ``spark/transforms.py``. The final ``select``
of each function is the output's schema contract (``WINDOW_COLUMNS`` etc. name it).
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.schema import HOUR_MS

COUNT_METRICS = (
    "publish_attempts",
    "distinct_published",
    "producer_retries",
    "confirmed",
    "nacked",
    "returned",
    "unconfirmed",
    "expected_confirmed",
    "delivered_unique",
    "dead_lettered",
    "dead_lettered_rejected",
    "dead_lettered_expired",
    "dead_lettered_maxlen",
    "dead_lettered_delivery_limit",
    "recovered",
    "lost",
    "unverified",
    "pending",
    "dup_msgs",
    "dup_deliveries",
    "dup_producer_retry",
    "dup_broker_redelivery",
    "dup_consumer_reprocessing",
    "late_deliveries",
    "orphan_consumptions",
    "clock_skew",
    "malformed_lines",
    "input_gaps",
)
LATENCY_METRICS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")
RATIO_METRICS = ("loss_ppm", "within_sla_share")
METRICS = (*COUNT_METRICS, "loss_ppm", *LATENCY_METRICS, "within_sla_share")
PRODUCER_METRICS = COUNT_METRICS[:7]
# Known only once a window is FINAL: null in PROVISIONAL windows.
FINAL_ONLY = ("lost", "unverified", "loss_ppm")

WINDOW_KEYS = ("window_start", "window_end", "status", "exchange", "consumer_group")


def _metric_types() -> dict[str, T.DataType]:
    types = {m: T.LongType() for m in (*COUNT_METRICS, *LATENCY_METRICS)}
    types.update({m: T.DoubleType() for m in RATIO_METRICS})
    return types


METRIC_TYPES = _metric_types()


def _dup_total() -> Column:
    return (
        F.col("dup_producer_retry")
        + F.col("dup_broker_redelivery")
        + F.col("dup_consumer_reprocessing")
    )


def _is_final(grace_ms: int, now_ms: int) -> Column:
    return F.col("window_ms") + HOUR_MS + grace_ms <= F.lit(now_ms)


def _producer_counts(scope: Column) -> list[Column]:
    state = F.col("publish_state")
    return [
        F.sum(F.when(scope, F.col("attempts")).otherwise(0)).alias("publish_attempts"),
        F.count_if(scope).alias("distinct_published"),
        F.sum(F.when(scope, F.col("attempts") - 1).otherwise(0)).alias("producer_retries"),
        *[
            F.count_if(scope & (state == name)).alias(alias)
            for name, alias in [
                ("confirmed", "confirmed"),
                ("nacked", "nacked"),
                ("returned", "returned"),
                ("unconfirmed", "unconfirmed"),
            ]
        ],
    ]


def _pair_counts(final: Column, sla_ms: int) -> list[Column]:
    """Aggregates over pairs; ``final`` says whether a pair's window is FINAL."""
    unaccounted = F.col("unaccounted")
    latency = F.col("latency_ms")
    on_clock = F.when(latency >= 0, latency)
    quantiles = F.percentile_approx(on_clock, [0.5, 0.95, 0.99], 10_000)
    return [
        F.count_if(F.col("expected") & (F.col("publish_state") == "confirmed")).alias(
            "expected_confirmed"
        ),
        F.count_if("consumed").alias("delivered_unique"),
        F.count_if("dead_lettered").alias("dead_lettered"),
        *[
            F.count_if(F.col("dead_letter_reason") == reason).alias(f"dead_lettered_{reason}")
            for reason in ("rejected", "expired", "maxlen", "delivery_limit")
        ],
        F.count_if("recovered").alias("recovered"),
        F.count_if(unaccounted & final & ~F.col("in_input_gap")).alias("lost"),
        F.count_if(unaccounted & final & F.col("in_input_gap")).alias("unverified"),
        F.count_if(unaccounted & ~final).alias("pending"),
        F.count_if(_dup_total() > 0).alias("dup_msgs"),
        F.sum(_dup_total()).alias("dup_deliveries"),
        F.sum("dup_producer_retry").alias("dup_producer_retry"),
        F.sum("dup_broker_redelivery").alias("dup_broker_redelivery"),
        F.sum("dup_consumer_reprocessing").alias("dup_consumer_reprocessing"),
        F.sum("late_deliveries").alias("late_deliveries"),
        F.count_if(latency < 0).alias("clock_skew"),
        quantiles[0].alias("latency_p50_ms"),
        quantiles[1].alias("latency_p95_ms"),
        quantiles[2].alias("latency_p99_ms"),
        F.max(on_clock).alias("latency_max_ms"),
        F.try_divide(F.count_if(on_clock <= sla_ms), F.count(on_clock)).alias("within_sla_share"),
    ]


def _loss_ppm() -> Column:
    return F.try_divide(F.col("lost") * F.lit(1_000_000.0), F.col("expected_confirmed"))


def _contract(frame: DataFrame) -> DataFrame:
    return frame.select(
        F.timestamp_millis("window_ms").alias("window_start"),
        F.timestamp_millis(F.col("window_ms") + HOUR_MS).alias("window_end"),
        "status",
        "exchange",
        "consumer_group",
        *[F.col(m).cast(METRIC_TYPES[m]).alias(m) for m in METRICS],
    )


def window_metrics(
    pairs: DataFrame,
    orphans: DataFrame,
    malformed: DataFrame,
    gaps: DataFrame,
    day_start_ms: int,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
) -> DataFrame:
    """One row per window x exchange x consumer group, plus one per window with both keys null.

    The keyless rows exist for all 24 windows of the day and carry ``malformed_lines`` and
    ``input_gaps``; ``orphan_consumptions`` sit on rows with a null exchange and the group.
    """
    final = _is_final(grace_ms, now_ms)
    published = pairs.groupBy("window_ms", "exchange", "consumer_group").agg(
        *_producer_counts(F.lit(True)), *_pair_counts(final, sla_ms)
    )
    orphan_rows = orphans.groupBy("window_ms", "consumer_group").agg(
        F.count(F.lit(1)).alias("orphan_consumptions")
    )
    spark = pairs.sparkSession
    hours = spark.range(day_start_ms, day_start_ms + 24 * HOUR_MS, HOUR_MS).select(
        F.col("id").alias("window_ms")
    )
    malformed_by_hour = malformed.select("window_ms", F.col("lines").alias("malformed"))
    gaps_by_hour = gaps.groupBy(F.col("hour_ms").alias("window_ms")).agg(
        F.count(F.lit(1)).alias("gaps")
    )
    keyless = (
        hours.join(malformed_by_hour, on="window_ms", how="left")
        .join(gaps_by_hour, on="window_ms", how="left")
        .select(
            "window_ms",
            F.coalesce("malformed", F.lit(0)).alias("malformed_lines"),
            F.coalesce("gaps", F.lit(0)).alias("input_gaps"),
        )
    )
    rows = (
        published.unionByName(orphan_rows, allowMissingColumns=True)
        .unionByName(keyless, allowMissingColumns=True)
        .fillna(0, subset=list(COUNT_METRICS))
        .withColumn("status", F.when(final, "FINAL").otherwise("PROVISIONAL"))
        .withColumn("loss_ppm", _loss_ppm())
    )
    for name in FINAL_ONLY:
        rows = rows.withColumn(name, F.when(final, F.col(name)))
    return _contract(rows)


def totals(
    pairs: DataFrame,
    orphans: DataFrame,
    malformed: DataFrame,
    gaps: DataFrame,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
) -> DataFrame:
    """One row: every metric over the whole run, each message counted once.

    ``lost`` and ``loss_ppm`` cover the FINAL windows; ``status`` is FINAL when all windows are.
    """
    final = _is_final(grace_ms, now_ms)
    over_pairs = pairs.agg(
        *_producer_counts(F.col("primary")),
        *_pair_counts(final, sla_ms),
        F.count_if(~final).alias("provisional_pairs"),
        F.count_if(final & F.col("expected") & (F.col("publish_state") == "confirmed")).alias(
            "final_expected_confirmed"
        ),
    )
    side = (
        orphans.agg(F.count(F.lit(1)).alias("orphan_consumptions"))
        .crossJoin(malformed.agg(F.sum("lines").alias("malformed_lines")))
        .crossJoin(gaps.agg(F.count(F.lit(1)).alias("input_gaps")))
    )
    joined = over_pairs.crossJoin(side).fillna(0, subset=list(COUNT_METRICS))
    return joined.select(
        F.when(F.col("provisional_pairs") > 0, "PROVISIONAL").otherwise("FINAL").alias("status"),
        *[
            (
                F.try_divide(F.col("lost") * F.lit(1_000_000.0), F.col("final_expected_confirmed"))
                if m == "loss_ppm"
                else F.col(m)
            )
            .cast(METRIC_TYPES[m])
            .alias(m)
            for m in METRICS
        ],
    )


def lost_evidence(pairs: DataFrame, grace_ms: int, now_ms: int) -> DataFrame:
    """The unaccounted pairs of FINAL windows: ``lost``, or ``unverified`` in an input gap."""
    return pairs.where(F.col("unaccounted") & _is_final(grace_ms, now_ms)).select(
        F.timestamp_millis("window_ms").alias("window_start"),
        "exchange",
        "routing_key",
        "consumer_group",
        "message_id",
        F.col("attempts").cast("int").alias("attempts"),
        F.when(F.col("in_input_gap"), "unverified").otherwise("lost").alias("verdict"),
        "store_id",
    )


def duplicate_evidence(pairs: DataFrame) -> DataFrame:
    """One row per duplicated pair and cause, with the extra deliveries that cause explains."""
    causes = F.array(
        *[
            F.struct(F.lit(cause).alias("cause"), F.col(f"dup_{cause}").alias("extra"))
            for cause in ("producer_retry", "broker_redelivery", "consumer_reprocessing")
        ]
    )
    return (
        pairs.where(_dup_total() > 0)
        .select("*", F.explode(causes).alias("c"))
        .where(F.col("c.extra") > 0)
        .select(
            F.timestamp_millis("window_ms").alias("window_start"),
            "exchange",
            "consumer_group",
            "message_id",
            F.col("c.cause").alias("cause"),
            F.col("c.extra").cast("long").alias("extra_deliveries"),
            F.col("deliveries").cast("long").alias("deliveries"),
            "store_id",
        )
    )


def orphan_evidence(orphans: DataFrame) -> DataFrame:
    return orphans.select(
        F.timestamp_millis("window_ms").alias("window_start"),
        "consumer_group",
        "consumer",
        "message_id",
        F.timestamp_millis("ts").alias("consumed_at"),
    )


def gap_evidence(gaps: DataFrame) -> DataFrame:
    return gaps.select(
        F.timestamp_millis("hour_ms").alias("window_start"),
        "source",
        "process",
        "consumer_group",
    )
