"""Roll classified pairs up into the audit's outputs: windows, totals and the evidence tables.

Definitions of every metric are in the docstring of ``spark/transforms.py``. The final ``select``
of each output function is the output's schema contract.

The pairs are rolled up ONCE (``rollup``): additive counts per window x exchange x group x
primary x latency, plus one row per pair or orphan line the evidence lists. Every output reads
that frame, so the job persists it instead of the pairs; it is small (latencies are whole
milliseconds, evidence is the exception). Latency percentiles are exact nearest-rank values
(the latency at rank ceil(p x n) of the n non-negative ones) read off the latency histogram.
"""

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.ids import Ids
from spark.schema import HOUR_MS
from spark.transforms import DEAD_LETTER_REASONS, PUBLISH_STATES

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


QUANTILES = ((0.5, "latency_p50_ms"), (0.95, "latency_p95_ms"), (0.99, "latency_p99_ms"))
DUP_CAUSES = ("producer_retry", "broker_redelivery", "consumer_reprocessing")


def _dup_total() -> Column:
    return sum((F.col(f"dup_{cause}") for cause in DUP_CAUSES[1:]), F.col("dup_producer_retry"))


def _is_final(grace_ms: int, now_ms: int) -> Column:
    return F.col("window_ms") + HOUR_MS + grace_ms <= F.lit(now_ms)


def rollup(facts: DataFrame, grace_ms: int, now_ms: int) -> DataFrame:
    """Classified pairs and orphan lines (``transforms.mark_gaps``) -> additive counts per
    (window_ms, exchange_id, gid, primary, orphan, latency_ms, evidence). ``evidence`` is null
    except on the pairs and lines the evidence tables list, which keep a row each."""
    pair = ~F.col("orphan")
    listed_lost = pair & F.col("unaccounted") & _is_final(grace_ms, now_ms)
    evidence = F.when(
        listed_lost | (pair & (_dup_total() > 0)) | F.col("orphan"),
        F.struct(
            "message_id",
            "key_id",
            "attempts",
            "store_id",
            "deliveries",
            "in_input_gap",
            listed_lost.alias("lost"),
            *[f"dup_{cause}" for cause in DUP_CAUSES],
            "orphan_consumer",
            "orphan_ts",
        ),
    )
    unaccounted, gap = F.col("unaccounted"), F.col("in_input_gap")
    reason = F.col("dead_letter_reason")
    confirmed = F.col("state") == PUBLISH_STATES.index("confirmed")
    return facts.groupBy(
        "window_ms",
        "exchange_id",
        "gid",
        "primary",
        "orphan",
        "latency_ms",
        evidence.alias("evidence"),
    ).agg(
        F.count(F.lit(1)).alias("pairs"),
        F.sum("attempts").alias("attempts"),
        *[F.count_if(F.col("state") == i).alias(name) for i, name in enumerate(PUBLISH_STATES)],
        F.count_if(F.col("expected") & confirmed).alias("expected_confirmed"),
        F.count_if("consumed").alias("delivered_unique"),
        F.count_if("dead_lettered").alias("dead_lettered"),
        *[F.count_if(reason == r).alias(f"dead_lettered_{r}") for r in DEAD_LETTER_REASONS],
        F.count_if("recovered").alias("recovered"),
        F.count_if(unaccounted & ~gap).alias("unaccounted_clear"),
        F.count_if(unaccounted & gap).alias("unaccounted_in_gap"),
        F.count_if(_dup_total() > 0).alias("dup_msgs"),
        *[F.sum(f"dup_{cause}").alias(f"dup_{cause}") for cause in DUP_CAUSES],
        F.sum("late_deliveries").alias("late_deliveries"),
        F.sum("lines").alias("lines"),
    )


def _total(column: str | Column, scope: Column | None = None) -> Column:
    column = F.col(column) if isinstance(column, str) else column
    return F.sum(column if scope is None else F.when(scope, column).otherwise(0))


def _producer_counts(scope: Column | None) -> list[Column]:
    return [
        _total("attempts", scope).alias("publish_attempts"),
        _total("pairs", scope).alias("distinct_published"),
        (_total("attempts", scope) - _total("pairs", scope)).alias("producer_retries"),
        *[_total(state, scope).alias(state) for state in reversed(PUBLISH_STATES)],
    ]


def _pair_counts(final: Column, sla_ms: int) -> list[Column]:
    """Aggregates over rollup rows of pairs; ``final`` says whether a row's window is FINAL."""
    latency = F.col("latency_ms")
    unaccounted = F.col("unaccounted_clear") + F.col("unaccounted_in_gap")
    on_clock = _total("pairs", latency >= 0)
    return [
        *[
            _total(name).alias(name)
            for name in (
                "expected_confirmed",
                "delivered_unique",
                "dead_lettered",
                *[f"dead_lettered_{r}" for r in DEAD_LETTER_REASONS],
                "recovered",
            )
        ],
        _total("unaccounted_clear", final).alias("lost"),
        _total("unaccounted_in_gap", final).alias("unverified"),
        _total(unaccounted, ~final).alias("pending"),
        _total("dup_msgs").alias("dup_msgs"),
        _total(_dup_total()).alias("dup_deliveries"),
        *[_total(f"dup_{cause}").alias(f"dup_{cause}") for cause in DUP_CAUSES],
        _total("late_deliveries").alias("late_deliveries"),
        _total("pairs", latency < 0).alias("clock_skew"),
        F.try_divide(_total("pairs", (latency >= 0) & (latency <= sla_ms)), on_clock).alias(
            "within_sla_share"
        ),
    ]


def _latency_stats(pair_rows: DataFrame, keys: list[str]) -> DataFrame:
    """Per ``keys``: exact nearest-rank p50/p95/p99 and the max of the non-negative latencies."""
    histogram = (
        pair_rows.where(F.col("latency_ms") >= 0)
        .groupBy(*keys, "latency_ms")
        .agg(F.sum("pairs").alias("n"))
    )
    whole = Window.partitionBy(*keys)
    upto = whole.orderBy("latency_ms").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = histogram.select(
        *keys,
        "latency_ms",
        F.sum("n").over(upto).alias("rank"),
        F.sum("n").over(whole).alias("count"),
    )
    return ranked.groupBy(*keys).agg(
        *[
            F.min(F.when(F.col("rank") >= F.ceil(F.col("count") * q), F.col("latency_ms"))).alias(
                name
            )
            for q, name in QUANTILES
        ],
        F.max("latency_ms").alias("latency_max_ms"),
    )


def _with_latency(counts: DataFrame, pair_rows: DataFrame, keys: list[str]) -> DataFrame:
    stats = _latency_stats(pair_rows, keys)
    if not keys:
        return counts.crossJoin(stats)
    joined = counts.join(stats, on=[counts[k].eqNullSafe(stats[k]) for k in keys], how="left")
    return joined.select(counts["*"], *[stats[name] for name in LATENCY_METRICS])


def _names(frame: DataFrame, ids: Ids) -> DataFrame:
    """exchange_id / gid -> exchange / consumer_group names (null ids stay null)."""
    if "exchange_id" in frame.columns:
        frame = frame.join(F.broadcast(ids.exchanges), on="exchange_id", how="left")
    return frame.join(F.broadcast(ids.groups), on="gid", how="left")


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
    rolled: DataFrame,
    ids: Ids,
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
    keys = ["window_ms", "exchange_id", "gid"]
    pair_rows = rolled.where(~F.col("orphan"))
    counts = pair_rows.groupBy(*keys).agg(*_producer_counts(None), *_pair_counts(final, sla_ms))
    published = _names(_with_latency(counts, pair_rows, keys), ids).drop("exchange_id", "gid")
    orphan_rows = _names(
        rolled.where(F.col("orphan"))
        .groupBy("window_ms", "gid")
        .agg(F.sum("lines").alias("orphan_consumptions")),
        ids,
    ).drop("gid")
    spark = rolled.sparkSession
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
    rolled: DataFrame,
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
    pair_rows = rolled.where(~F.col("orphan"))
    over_pairs = pair_rows.agg(
        *_producer_counts(F.col("primary")),
        *_pair_counts(final, sla_ms),
        _total("pairs", ~final).alias("provisional_pairs"),
        _total("expected_confirmed", final).alias("final_expected_confirmed"),
    )
    side = (
        rolled.where(F.col("orphan"))
        .agg(F.sum("lines").alias("orphan_consumptions"))
        .crossJoin(malformed.agg(F.sum("lines").alias("malformed_lines")))
        .crossJoin(gaps.agg(F.count(F.lit(1)).alias("input_gaps")))
    )
    joined = (
        _with_latency(over_pairs, pair_rows, [])
        .crossJoin(side)
        .fillna(0, subset=list(COUNT_METRICS))
    )
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


def lost_evidence(rolled: DataFrame, ids: Ids) -> DataFrame:
    """The unaccounted pairs of FINAL windows: ``lost``, or ``unverified`` in an input gap."""
    rows = rolled.where(F.col("evidence.lost")).select("window_ms", "gid", "evidence.*")
    keys = ids.keys.select("key_id", "exchange", "routing_key")
    return _names(rows.join(F.broadcast(keys), on="key_id", how="left"), ids).select(
        F.timestamp_millis("window_ms").alias("window_start"),
        "exchange",
        "routing_key",
        "consumer_group",
        "message_id",
        F.col("attempts").cast("int").alias("attempts"),
        F.when(F.col("in_input_gap"), "unverified").otherwise("lost").alias("verdict"),
        "store_id",
    )


def duplicate_evidence(rolled: DataFrame, ids: Ids) -> DataFrame:
    """One row per duplicated pair and cause, with the extra deliveries that cause explains."""
    causes = F.array(
        *[
            F.struct(F.lit(cause).alias("cause"), F.col(f"dup_{cause}").alias("extra"))
            for cause in DUP_CAUSES
        ]
    )
    rows = (
        rolled.where(~F.col("orphan") & F.col("evidence").isNotNull())
        .select("window_ms", "exchange_id", "gid", "evidence.*")
        .select("*", F.explode(causes).alias("c"))
        .where(F.col("c.extra") > 0)
    )
    return _names(rows, ids).select(
        F.timestamp_millis("window_ms").alias("window_start"),
        "exchange",
        "consumer_group",
        "message_id",
        F.col("c.cause").alias("cause"),
        F.col("c.extra").cast("long").alias("extra_deliveries"),
        F.col("deliveries").cast("long").alias("deliveries"),
        "store_id",
    )


def orphan_evidence(rolled: DataFrame, ids: Ids) -> DataFrame:
    """One row per orphan line (identical lines once each)."""
    rows = rolled.where(F.col("orphan")).select(
        "window_ms",
        "gid",
        "lines",
        "evidence.*",
        F.explode(F.array_repeat(F.lit(0), F.col("lines").cast("int"))),
    )
    return _names(rows, ids).select(
        F.timestamp_millis("window_ms").alias("window_start"),
        "consumer_group",
        F.col("orphan_consumer").alias("consumer"),
        "message_id",
        F.timestamp_millis("orphan_ts").alias("consumed_at"),
    )


def gap_evidence(gaps: DataFrame) -> DataFrame:
    return gaps.select(
        F.timestamp_millis("hour_ms").alias("window_start"),
        "source",
        "process",
        "consumer_group",
    )
